"""PyTorch baselines for cartage's CUDA benchmark (`cargo xtask kernels cuda`,
`xtask/src/kernels/cuda/`), same cases and sizes.

Prints `RESULT<TAB>case<TAB>value<TAB>unit` lines; `compare.py` joins them with `kernels cuda`'s.
Device time: torch.cuda.Event pairs, median of >= 20 after warm-up. Host time per call: a loop
ended by torch.cuda.synchronize(). Usage: python3 torch_bench.py [--quick]
"""
import statistics
import sys
import time

import torch

MIB = 1 << 20
QUICK = "--quick" in sys.argv


def result(case, value, unit):
    print(f"RESULT\t{case}\t{value:.4f}\t{unit}", flush=True)


def device_time(fn, warmup=5, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def host_time(fn, iters):
    for _ in range(min(iters, 100)):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def wall_time(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def matmul():
    sizes = [1024, 4096] if QUICK else [256, 512, 1024, 2048, 4096, 8192]
    cases = [("f32_highest", torch.float32, False, 256), ("f32_high", torch.float32, True, 256),
             ("f16", torch.float16, False, 2048), ("bf16", torch.bfloat16, False, 2048)]
    for name, dtype, tf32, smallest in cases:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for n in [n for n in sizes if n >= smallest]:
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            reps = 20 if n >= 4096 else 50
            t = device_time(lambda: torch.mm(a, b, out=out), reps=reps)
            result(f"matmul_{name}_{n}", 2 * n**3 / t / 1e12, "TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = False
    for n in [16, 32, 64, 128, 256]:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        t = host_time(lambda: torch.mm(a, b), 2000)
        result(f"small_matmul_f32_{n}", t * 1e6, "us/call")


def tiny_ops():
    a = torch.randn(4, device="cuda")
    b = torch.randn(4, device="cuda")
    t = host_time(lambda: a + b, 20000)
    result("tiny_add_f32", t * 1e6, "us/op")


def elementwise():
    sizes = [(256 * MIB, "256MiB")] if QUICK else [(256 * MIB, "256MiB"), (1024 * MIB, "1GiB")]
    for nbytes, label in sizes:
        for name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            a = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            out = torch.empty_like(a)
            t = device_time(lambda: torch.add(a, b, out=out), warmup=3)
            result(f"add_{name}_{label}", 3 * nbytes / t / 1e9, "GB/s")
            del a, b, out


def reductions():
    sizes = [(64 * MIB, "64MiB")] if QUICK else [(64 * MIB, "64MiB"), (1024 * MIB, "1GiB")]
    cols = 4096
    for nbytes, label in sizes:
        n = nbytes // 4
        x = torch.randn(n, device="cuda")
        rows = x.view(n // cols, cols)
        ops = {"sum": (lambda: x.sum(), lambda: rows.sum(dim=1, keepdim=True)),
               "mean": (lambda: x.mean(), lambda: rows.mean(dim=1, keepdim=True)),
               "max": (lambda: x.max(), lambda: rows.amax(dim=1, keepdim=True))}
        for name, (full, per_row) in ops.items():
            t = device_time(full, warmup=3)
            result(f"{name}_full_f32_{label}", nbytes / t / 1e9, "GB/s")
            t = device_time(per_row, warmup=3)
            result(f"{name}_rows_f32_{label}", nbytes / t / 1e9, "GB/s")
        del x, rows


def copies():
    sizes = [64 * MIB] if QUICK else [16 * MIB, 64 * MIB, 256 * MIB]
    for nbytes in sizes:
        label = f"{nbytes // MIB}MiB"
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        pinned = torch.full((nbytes,), 7, dtype=torch.uint8).pin_memory()

        def h2d_pinned():
            dev.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()

        def d2h_pinned():
            pinned.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()

        result(f"h2d_pinned_{label}", nbytes / wall_time(h2d_pinned) / 1e9, "GB/s")
        result(f"d2h_pinned_{label}", nbytes / wall_time(d2h_pinned) / 1e9, "GB/s")
        host = torch.full((nbytes,), 3, dtype=torch.uint8)
        result(f"h2d_pageable_{label}", nbytes / wall_time(lambda: dev.copy_(host), 10) / 1e9, "GB/s")
        result(f"d2h_pageable_{label}", nbytes / wall_time(lambda: host.copy_(dev), 10) / 1e9, "GB/s")
        del dev, pinned, host


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", file=sys.stderr)
    tiny_ops()
    matmul()
    elementwise()
    reductions()
    copies()


if __name__ == "__main__":
    main()
