"""PyTorch CUDA reference for `cargo xtask kernels wgpu` (xtask/src/kernels/wgpu/), same ops and sizes.

`--half`: the rows of `cargo xtask kernels wgpu half` instead (f16/bf16 add and copy of 16 Mi elements,
4096³ matmul in f16, bf16 and f32, 256 MiB host<->device copies from pinned and pageable memory).

Device times with torch.cuda.Event, median of 20 after warm-up; TF32 off for f32 matmul.
Prints one JSON line per row: {"name": "torch/<gpu>/<op>", "value": ..., "unit": ...}.
"""
import json
import statistics
import sys
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0")
gpu = torch.cuda.get_device_name(0).replace(" ", "_")
REPS = 20


def timed(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def row(op, value, unit, seconds):
    print(json.dumps({"name": f"torch/{gpu}/{op}", "value": round(value, 4), "unit": unit,
                      "median_ns": int(seconds * 1e9)}), flush=True)


def host_timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def half_rows():
    n = 16 << 20
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        a, b, c = (torch.rand(n, device=dev).to(dtype) for _ in range(3))
        t = timed(lambda: torch.add(a, b, out=c))
        row(f"add_{name}_16Mi", 3 * n * 2 / t / 1e9, "GB/s", t)
        t = timed(lambda: c.copy_(a))
        row(f"copy_{name}_16Mi", 2 * n * 2 / t / 1e9, "GB/s", t)
        del a, b, c
    size = 4096
    for dtype, name in ((torch.float16, "f16"), (torch.bfloat16, "bf16"), (torch.float32, "f32")):
        a, b, c = (torch.rand(size, size, device=dev).to(dtype) for _ in range(3))
        t = timed(lambda: torch.matmul(a, b, out=c))
        row(f"matmul_{name}_{size}", 2 * size**3 / t / 1e12, "TFLOP/s", t)
        del a, b, c
    nbytes = 256 << 20
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    pinned = torch.full((nbytes,), 7, dtype=torch.uint8).pin_memory()
    pageable = torch.full((nbytes,), 5, dtype=torch.uint8)
    for name, fn in (
        ("h2d_pinned_256MiB", lambda: d.copy_(pinned, non_blocking=True)),
        ("d2h_pinned_256MiB", lambda: pinned.copy_(d, non_blocking=True)),
        ("h2d_pageable_256MiB", lambda: d.copy_(pageable)),
        ("d2h_pageable_256MiB", lambda: pageable.copy_(d)),
    ):
        t = host_timed(fn)
        row(name, nbytes / t / 1e9, "GB/s", t)


if "--half" in sys.argv:
    half_rows()
    sys.exit(0)

for mib in (64, 256):
    n = mib * (1 << 20) // 4
    a, b, c = (torch.rand(n, device=dev) for _ in range(3))
    t = timed(lambda: torch.add(a, b, out=c))
    row(f"add_f32_{mib}MiB", 3 * n * 4 / t / 1e9, "GB/s", t)
    del a, b, c

n = 64 * (1 << 20) // 4
a = torch.rand(n, device=dev)
out = torch.empty((), device=dev)
t = timed(lambda: torch.sum(a, dim=0, out=out))
row("sum_f32_64MiB", n * 4 / t / 1e9, "GB/s", t)
del a

for size in (1024, 2048, 4096):
    a, b, c = (torch.rand(size, size, device=dev) for _ in range(3))
    t = timed(lambda: torch.matmul(a, b, out=c))
    row(f"matmul_f32_{size}", 2 * size**3 / t / 1e12, "TFLOP/s", t)
    del a, b, c

a, b = torch.rand(1024, device=dev), torch.rand(1024, device=dev)
runs = []
for rep in range(3 + REPS):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(1000):
        a.add_(b)
    torch.cuda.synchronize()
    if rep >= 3:
        runs.append(time.perf_counter() - start)
t = statistics.median(runs)
row("chain_1000_add_f32_1024", t * 1e6 / 1000, "us/op", t)

x = torch.rand(1, device=dev)
runs = []
for rep in range(55):
    x.fill_(1.0)
    start = time.perf_counter()
    x.item()
    if rep >= 5:
        runs.append(time.perf_counter() - start)
t = statistics.median(runs)
row("readback_f32_1", t * 1e6, "us", t)
