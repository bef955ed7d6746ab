"""PyTorch baselines for `cargo xtask kernels cuda ops` (`xtask/src/kernels/cuda/families.rs`): the
same cases and sizes.

Row-wise model ops on [2^26 / cols, cols]: softmax and log-softmax at several row lengths, and
layer norm, RMS norm and per-row cross-entropy at 4096, in f32 and bf16. Prints
`RESULT<TAB>torch_<case><TAB>GB/s<TAB>unit` lines (GB/s of the bytes each op must read and write),
then a table joining them with `kernels cuda ops`'s lines when those are given on stdin or in a file.
Device time: torch.cuda.Event pairs, median of 30 after 5 warm-up calls.
Usage: python3 ops_torch.py [kernels_cuda_ops_output.txt]
"""
import statistics
import sys

import torch
import torch.nn.functional as F

ELEMENTS = 1 << 26


def result(case, value, unit):
    print(f"RESULT\ttorch_{case}\t{value:.4f}\t{unit}", flush=True)


def device_time(fn, warmup=5, reps=30):
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


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def main():
    ours = {}
    if len(sys.argv) > 1:
        for line in open(sys.argv[1]):
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 4 and parts[0] == "RESULT":
                ours[parts[1]] = float(parts[2])
    theirs = {}
    for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        size = torch.finfo(dtype).bits // 8
        for cols in [64, 256, 1024, 4096, 16384, 32768]:
            rows = ELEMENTS // cols
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            moved = 2.0 * ELEMENTS * size
            for op, fn in [("softmax", lambda: torch.softmax(x, -1)), ("log_softmax", lambda: torch.log_softmax(x, -1))]:
                case = f"{op}_{name}_{cols}"
                theirs[case] = moved / device_time(fn) / 1e9
                result(case, theirs[case], "GB/s")
            if cols != 4096:
                continue
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            case = f"layer_norm_{name}_{cols}"
            theirs[case] = moved / device_time(lambda: F.layer_norm(x, (cols,), w, b, 1e-5)) / 1e9
            result(case, theirs[case], "GB/s")
            case = f"rms_norm_{name}_{cols}"
            theirs[case] = moved / device_time(lambda: rms_norm(x, w, 1e-5)) / 1e9
            result(case, theirs[case], "GB/s")
            t = torch.randint(0, cols, (rows,), device="cuda", dtype=torch.int64)
            case = f"cross_entropy_{name}_{cols}"
            ce_moved = ELEMENTS * size + rows * (8 + size)
            fn = lambda: F.cross_entropy(x, t, reduction="none", ignore_index=-100)
            theirs[case] = ce_moved / device_time(fn) / 1e9
            result(case, theirs[case], "GB/s")
            del x, w, b, t
    if ours:
        print(f"{'case':28} {'cartage GB/s':>13} {'torch GB/s':>11} {'ratio':>6}")
        for case, value in theirs.items():
            if case in ours:
                print(f"{case:28} {ours[case]:13.1f} {value:11.1f} {ours[case] / value:6.2f}")


if __name__ == "__main__":
    main()
