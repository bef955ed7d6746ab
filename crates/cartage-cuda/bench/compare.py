"""Join `cargo xtask kernels cuda`'s and torch_bench.py's RESULT lines into one table of ratios against the targets
of the CUDA backend's issue. Usage: python3 compare.py cartage.tsv torch.tsv
A ratio above 1 always means cartage is better (faster, or more throughput)."""
import sys


def load(path):
    rows = {}
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4 and parts[0] == "RESULT":
            rows[parts[1]] = (float(parts[2]), parts[3])
    return rows


def main():
    ours, torch = load(sys.argv[1]), load(sys.argv[2])
    table = []  # (case, cartage, baseline name, baseline, ratio, target)

    def add(case, base_name, base_value, target, time_metric=False):
        if case not in ours or base_value is None:
            return
        mine = ours[case][0]
        ratio = (base_value / mine) if time_metric else (mine / base_value)
        table.append((case, f"{mine:.2f} {ours[case][1]}", base_name, f"{base_value:.2f}", ratio, target))

    for case in ours:
        t = torch.get(case, (None,))[0]
        if case.startswith("matmul_f32_highest_"):
            n = int(case.rsplit("_", 1)[1])
            add(case, "torch", t, 0.98 if n >= 1024 else None)
        elif case.startswith("matmul_"):
            n = int(case.rsplit("_", 1)[1])
            add(case, "torch", t, 0.97 if n >= 2048 else None)
        elif case.startswith("small_matmul_"):
            add(case, "torch", t, 1.0, time_metric=True)
        elif case == "tiny_add_f32":
            add(case, "torch", t, 1 / 0.6, time_metric=True)
            add(case, "raw cuLaunchKernel", ours.get("raw_launch", (None,))[0], 1 / 1.25, time_metric=True)
        elif case.startswith("add_"):
            add(case, "torch", t, 0.95)
        elif case.split("_")[0] in ("sum", "mean", "max"):
            add(case, "torch", t, 0.95 if case.endswith("1GiB") else 0.9)
        elif case.startswith(("h2d_", "d2h_")):
            add(case, "torch", t, None)
            raw = ours.get("raw_" + case, (None,))[0]
            add(case, "raw cuMemcpy", raw, 0.95 if "pinned" in case else 1.0)
        elif case == "first_call_cached_kernel_max":
            table.append((case, f"{ours[case][0]:.2f} ms", "target", "5 ms", 5.0 / max(ours[case][0], 1e-9), 1.0))

    print(f"{'case':34} {'cartage':>18} {'baseline':>20} {'value':>10} {'ratio':>7} {'target':>7}  met")
    for case, mine, base_name, base, ratio, target in table:
        met = "" if target is None else ("yes" if ratio >= target else "NO")
        tgt = "" if target is None else f"{target:.2f}"
        print(f"{case:34} {mine:>18} {base_name:>20} {base:>10} {ratio:7.3f} {tgt:>7}  {met}")
    for case in ("cold_compile_all_modules", "cold_open_first_process", "cold_open_second_process",
                 "cold_second_process_compiled_modules", "cold_second_process_disk_hits", "raw_launch",
                 "tiny_alloc_free", "tiny_launch_prebuilt"):
        if case in ours:
            print(f"{case:34} {ours[case][0]:.3f} {ours[case][1]}")


if __name__ == "__main__":
    main()
