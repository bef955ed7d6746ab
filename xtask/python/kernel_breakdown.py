"""Where a training step's GPU time goes, kernel by kernel, on either side of the benchmark.

Nsight Compute (`ncu`, on the GPU machine) times every kernel a program launches; this script
runs the PyTorch side's GPT step for it and reads its CSV back, summed per kernel and per kind
(matrix products, attention, norms, reductions, activations, optimizer, layout copies, the
rest), per step.

    # cartage's step (the benchmark's GPT, f32, 6 layers): skip set-up and warm-up launches
    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \\
        --csv --page raw --print-units base --launch-skip 3000 --launch-count 1600 \\
        xtask bench --backends cuda --sections training --cases gpt_train_f32_16384 \\
        --out /tmp/ncu >cartage.csv
    # PyTorch's step, the same model (reference.py's torch_gpt_train), 12 steps
    ncu ...same options... --launch-skip 3000 --launch-count 2500 \\
        python3 xtask/python/kernel_breakdown.py torch-gpt 12 \\
        '{"layers":6,"dim":384,"heads":6,"context":256,"batch":64,"vocab":128,"autocast":false}' \\
        >torch.csv
    python3 xtask/python/kernel_breakdown.py summarize torch.csv --steps 2
    python3 xtask/python/kernel_breakdown.py summarize cartage.csv --step-kernel cross_entropy_f32_i64

`--steps N` divides the window's totals by N steps. `--step-kernel NAME` marks each step by a
kernel that runs once per step (cartage's loss, `cross_entropy_f32_i64`; the name must start
with NAME, so `cross_entropy` alone would also count the backward kernel) and keeps only the
whole steps between its first and last launch in the window. ncu runs one
kernel at a time with its caches as the previous kernel left them, so times are each kernel's
own, without overlap between kernels; their sum is close to the step's time where the GPU is
never idle.
"""

import collections
import csv
import json
import re
import sys

# First match wins: attention before matrix products (PyTorch's f32 attention is `fmha_cutlass*`).
KINDS = [
    ("attention", r"fmha|attention|flash"),
    ("matmul", r"gemm|sgemm|xmma|splitK|Gemm|matmul|cutlass"),
    ("norm", r"(?i)norm|GammaBeta"),
    ("reduce", r"reduce|sum_"),
    ("optimizer", r"(?i)multi_tensor|adam"),
    ("activation", r"(?i)gelu|relu|activate"),
    ("copy", r"(?i)copy|CatArray"),
]


def kind(name):
    for label, pattern in KINDS:
        if re.search(pattern, name):
            return label
    return "other"


def read(path):
    """(kernel name, ns) per launch of an `ncu --csv --page raw --print-units base` dump."""
    rows = list(csv.reader(open(path)))
    head = next((r for r in rows if "Kernel Name" in r), None)
    if head is None:
        sys.exit("%s: no kernels (ncu printed no table: did --cases or --launch-skip leave none?)" % path)
    name_at, time_at = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    launches = []
    for r in rows[rows.index(head) + 1:]:
        if len(r) != len(head):
            continue
        try:
            launches.append((r[name_at], float(r[time_at].replace(",", ""))))
        except ValueError:  # the units row
            continue
    return launches


def summarize(path, steps=None, step_kernel=None, top=40):
    launches = read(path)
    if step_kernel:
        marks = [i for i, (name, _) in enumerate(launches) if name.startswith(step_kernel)]
        if len(marks) < 2:
            sys.exit("%s: %d launch(es) of a kernel named %s...: a whole step needs two"
                     % (path, len(marks), step_kernel))
        launches, steps = launches[marks[0]:marks[-1]], len(marks) - 1
    steps = steps or 1
    per_name, count = collections.defaultdict(float), collections.Counter()
    per_kind = collections.defaultdict(float)
    for name, ns in launches:
        short = name.split("(")[0][:100]
        per_name[short] += ns
        count[short] += 1
        per_kind[kind(name)] += ns
    total = sum(per_kind.values())
    print("%s: %d launches over %d step(s), %.2f ms per step" % (path, len(launches), steps, total / steps / 1e6))
    for label, ns in sorted(per_kind.items(), key=lambda kv: -kv[1]):
        print("  %-10s %8.3f ms per step (%4.1f%%)" % (label, ns / steps / 1e6, 100 * ns / total))
    print("  per kernel (us per step, launches per step):")
    for name, ns in sorted(per_name.items(), key=lambda kv: -kv[1])[:top]:
        print("  %10.1f %6.1f  %s" % (ns / steps / 1e3, count[name] / steps, name))


def torch_gpt(steps, case):
    """Runs `steps` training steps of reference.py's GPT (no timing, no memory curve)."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import reference
    import torch

    def run(step, timer, cfg, device):
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return (0.0, 0.0, 0.0)

    reference.measure_step = run
    reference.memory_curve = lambda step, device, steps=3: None
    torch.set_float32_matmul_precision("highest")
    reference.torch_gpt_train(case, None, {}, "cuda")


def main(argv):
    if len(argv) >= 3 and argv[0] == "torch-gpt":
        torch_gpt(int(argv[1]), json.loads(argv[2]))
    elif len(argv) >= 2 and argv[0] == "summarize":
        args = argv[2:]
        steps = int(args[args.index("--steps") + 1]) if "--steps" in args else None
        step_kernel = args[args.index("--step-kernel") + 1] if "--step-kernel" in args else None
        summarize(argv[1], steps, step_kernel)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
