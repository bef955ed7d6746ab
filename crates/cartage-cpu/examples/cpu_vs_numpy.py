"""numpy side of the cpu backend comparison (see cpu_vs_numpy.rs beside this file).

Times the same cases as the Rust example with the same method (warm-up, then the median of many
repetitions) and, given the Rust example's JSON lines, prints the ratio table
(ratio = numpy time / cartage time: above 1 means cartage is faster).

    cargo run --release -p cartage-cpu --example cpu_vs_numpy > rust.json
    python3 crates/cartage-cpu/examples/cpu_vs_numpy.py rust.json
"""

import json
import os
import sys
import time

import numpy as np

BUDGET = float(os.environ.get("BENCH_MS", "600")) / 1000.0


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


def cases():
    for n in [32, 64, 128, 256, 512, 1024, 2048]:
        a, b, c = rand(n, n), rand(n, n), np.empty((n, n), np.float32)
        inner = max(1, (1 << 22) // (n * n * n))

        def mm(a=a, b=b, c=c, inner=inner):
            for _ in range(inner):
                np.matmul(a, b, out=c)

        yield f"matmul_f32_{n}", median_seconds(mm, inner), 2.0 * n**3, "flop"
    for n in [4, 1 << 24]:
        a, b, c = rand(n), rand(n), np.empty(n, np.float32)
        inner = max(1, (1 << 16) // n)

        def add(a=a, b=b, c=c, inner=inner):
            for _ in range(inner):
                np.add(a, b, out=c)

        def add_alloc(a=a, b=b, inner=inner):
            for _ in range(inner):
                a + b

        yield f"add_f32_{n}", median_seconds(add, inner), 12.0 * n, "byte"
        yield f"add_f32_{n} (a+b, allocating)", median_seconds(add_alloc, inner), 12.0 * n, "byte"
    n = 1 << 24
    x = rand(n)
    yield f"sum_f32_{n}", median_seconds(lambda: x.sum()), 4.0 * n, "byte"
    a, b, c = rand(1000, 8, 8), rand(1000, 8, 8), np.empty((1000, 8, 8), np.float32)
    yield "bmm_f32_1000x8x8", median_seconds(lambda: np.matmul(a, b, out=c)), 2.0 * 1000 * 512, "flop"


def rate(seconds, work, unit):
    return f"{work / seconds / 1e9:8.1f} {'GFLOP/s' if unit == 'flop' else 'GB/s'}"


def main():
    rust = {}
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            for line in f:
                if line.strip().startswith("{"):
                    row = json.loads(line)
                    rust[row["case"]] = row
    print(f"numpy {np.__version__}")
    print(f"{'case':<34} {'numpy':>22} {'cartage cpu':>22} {'ratio':>7}")
    for case, seconds, work, unit in cases():
        numpy_cell = f"{seconds * 1e6:10.2f} us {rate(seconds, work, unit)}"
        base = case.split(" ")[0]
        if base in rust and base == case:
            r = rust[base]["seconds"]
            print(f"{case:<34} {numpy_cell:>22} {r * 1e6:10.2f} us {rate(r, work, unit)} {seconds / r:6.2f}x")
        else:
            print(f"{case:<34} {numpy_cell:>22}")


if __name__ == "__main__":
    main()
