"""numpy side of the cpu backend comparison (see cpu_vs_numpy.rs beside this file).

Times the same cases as the Rust example with the same method (warm-up, then the median of many
repetitions). Given the Rust example's binary, it alternates the two — numpy, then cartage, case
by case, for several rounds — so that both see the same machine load, and prints the table:
median over rounds of each side's per-round median, the best round, and the ratio of medians
(numpy time / cartage time: above 1 means cartage is faster).

    cargo build --release -p cartage-cpu --example cpu_vs_numpy
    python3 crates/cartage-cpu/examples/cpu_vs_numpy.py target/release/examples/cpu_vs_numpy [rounds] [case prefix]
"""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

BUDGET = float(os.environ.get("BENCH_MS", "300")) / 1000.0


def median_seconds(run, inner=1):
    for _ in range(3):
        run()
    samples = []
    start = time.perf_counter()
    while len(samples) < 11 or (time.perf_counter() - start < BUDGET and len(samples) < 5000):
        t = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t) / inner)
    samples.sort()
    return samples[len(samples) // 2]


def rand(*shape):
    return (np.random.default_rng(len(shape)).random(shape, dtype=np.float32) - 0.5).astype(np.float32)


def numpy_cases():
    """(case, work, unit, timer) for every case of the Rust example."""
    out = []
    for n in [32, 64, 128, 256, 512, 1024, 2048]:
        a, b, c = rand(n, n), rand(n, n), np.empty((n, n), np.float32)
        inner = max(1, (1 << 22) // (n * n * n))

        def mm(a=a, b=b, c=c, inner=inner):
            for _ in range(inner):
                np.matmul(a, b, out=c)

        out.append((f"matmul_f32_{n}", 2.0 * n**3, "flop", lambda mm=mm, inner=inner: median_seconds(mm, inner)))
    for n in [4, 1 << 24]:
        a, b, c = rand(n), rand(n), np.empty(n, np.float32)
        inner = max(1, (1 << 16) // n)

        def add(a=a, b=b, c=c, inner=inner):
            for _ in range(inner):
                np.add(a, b, out=c)

        out.append((f"add_f32_{n}", 12.0 * n, "byte", lambda add=add, inner=inner: median_seconds(add, inner)))
    n = 1 << 24
    x = rand(n)
    out.append((f"sum_f32_{n}", 4.0 * n, "byte", lambda x=x: median_seconds(lambda: x.sum())))
    y = np.empty(n, np.float32)
    out.append((f"exp_f32_{n}", 8.0 * n, "byte", lambda x=x, y=y: median_seconds(lambda: np.exp(x, out=y))))
    rows = cols = 4096
    m = rand(rows, cols)
    w, bias = rand(cols), rand(cols)

    def softmax(m=m):
        e = np.exp(m - m.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def layer_norm(m=m, w=w, bias=bias):
        mean = m.mean(1, keepdims=True)
        var = m.var(1, keepdims=True)
        return (m - mean) / np.sqrt(var + 1e-5) * w + bias

    out.append(("softmax_f32_4096x4096", 8.0 * rows * cols, "byte", lambda: median_seconds(softmax)))
    out.append(("layer_norm_f32_4096x4096", 8.0 * rows * cols, "byte", lambda: median_seconds(layer_norm)))
    a, b, c = rand(1000, 8, 8), rand(1000, 8, 8), np.empty((1000, 8, 8), np.float32)
    out.append(
        ("bmm_f32_1000x8x8", 2.0 * 1000 * 512, "flop", lambda: median_seconds(lambda: np.matmul(a, b, out=c)))
    )
    return out


def rust_seconds(binary, case):
    env = dict(os.environ, BENCH_MS=str(int(BUDGET * 1000)))
    lines = subprocess.run([binary, case], capture_output=True, text=True, env=env, check=True).stdout
    for line in lines.splitlines():
        row = json.loads(line)
        if row["case"] == case:
            return row["seconds"]
    raise RuntimeError(f"{binary} did not report {case}")


def rate(seconds, work, unit):
    return f"{work / seconds / 1e9:7.1f} {'GFLOP/s' if unit == 'flop' else 'GB/s'}"


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else None
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    print(f"numpy {np.__version__}; {rounds} alternating rounds of {BUDGET * 1000:.0f} ms per side and case")
    header = f"{'case':<20} {'numpy median':>26} {'cartage median':>26} {'ratio':>6} {'best/best':>9}"
    print(header)
    for case, work, unit, timer in numpy_cases():
        if not case.startswith(only):
            continue
        ours, theirs = [], []
        for _ in range(rounds if binary else 1):
            theirs.append(timer())
            if binary:
                ours.append(rust_seconds(binary, case))
        t = statistics.median(theirs)
        cell = f"{t * 1e6:9.2f} us {rate(t, work, unit)}"
        if binary:
            r = statistics.median(ours)
            ratio, best = t / r, min(theirs) / min(ours)
            print(f"{case:<20} {cell:>26} {r * 1e6:9.2f} us {rate(r, work, unit)} {ratio:5.2f}x {best:8.2f}x")
        else:
            print(f"{case:<20} {cell:>26}")


if __name__ == "__main__":
    main()
