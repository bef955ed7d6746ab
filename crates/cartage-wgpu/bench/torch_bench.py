"""PyTorch CUDA reference for crates/cartage-wgpu/src/bin/wgpu_bench.rs, same ops and sizes.

Device times with torch.cuda.Event, median of 20 after warm-up; TF32 off for f32 matmul.
Prints one JSON line per row: {"name": "torch/<gpu>/<op>", "value": ..., "unit": ...}.
"""
import json
import statistics
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
