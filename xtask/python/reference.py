"""The reference side of `cargo xtask bench --vs-torch`: the report's cases run with PyTorch (CPU and
CUDA) or, when PyTorch is absent, numpy (CPU only), timed the way `cartage::bench` times them.

Embedded into the xtask binary and written to a temporary file at run time, so a staged binary needs
no checkout. Two commands:

    python3 reference.py probe            -> one JSON object: python, torch, torch_cuda, numpy
    python3 reference.py run SPEC.json    -> with PyTorch, first the settings every case runs under:
        {"settings": [["torch.backends.cudnn.benchmark", "False"], ...]}
    then one JSON line per task, as each finishes:
        {"key": ..., "median": s, "p10": s, "p90": s, "library": "torch 2.11.0", "impl": "..."}
        {"key": ..., "skipped": "why"}

The ops section's cases come forward only (`"kind": "model"`) and with their backward
(`"kind": "forward_backward"`: the inputs require gradients, each call runs the forward,
`out.backward(grad)` from a fixed gradient, or `loss.backward()` for a one-value output, and
sets the gradients to None). Their `impl` says what ran: the ATen ops that did the work, from
one profiled call (`aten_leaves`), or the kernel family an ATen op picked (flash or
memory-efficient attention, cuDNN convolution).

Method (as in cartage::bench): warm up for `warmup_s` (at least `min_warmup` calls, synchronising
after each), estimate one call from the quickest warm-up call after the first, run enough iterations per sample to last `min_sample_time_s`, take
as many samples as fit in `budget_s` within [min_samples, max_samples]; time each sample with CUDA
events read after a synchronisation (CUDA) or perf_counter (CPU); report the median and p10/p90 of
the per-iteration times.

Fair references: where cartage's op reuses memory from its cache for its output, the reference
writes into an output allocated once before timing (`out=`), so neither side pays an allocation
per call: matmul, add, mul, exp, relu (as `clamp(min=0)`), the row and whole sums. Ops without an
`out=` form (gelu, softmax, the fused ops of the ops section) allocate their output per call, as
PyTorch's own caching allocator serves it on CUDA and the system allocator on the CPU. Each
measured line's counters say which: `out_preallocated` 1 or 0.

Precision rows also report `max_rel_error`: the product of f32 normal operands in the measured
dtype (TF32 where asked), against the same product in f64 on the host over 64 evenly spaced rows,
as the largest difference over the largest exact entry (cartage's `precision_error.rs` does the
same).
"""

import json
import math
import sys
import time

try:
    import numpy as np
except ImportError:  # the probe reports it
    np = None
try:
    import torch
except ImportError:
    torch = None


def probe():
    cuda = None
    if torch is not None and torch.cuda.is_available():
        cuda = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return {
        "python": "%s %d.%d.%d" % (sys.executable, *sys.version_info[:3]),
        "torch": torch.__version__ if torch is not None else None,
        "torch_cuda": cuda,
        "cuda_devices": torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0,
        "numpy": np.__version__ if np is not None else None,
    }


def settings():
    """The settings every case runs under, as (name, value) pairs for the report."""
    cudnn = torch.backends.cudnn
    pairs = [
        ("float32 matmul precision", torch.get_float32_matmul_precision()),
        ("TF32 in matmuls (torch.backends.cuda.matmul.allow_tf32)", str(torch.backends.cuda.matmul.allow_tf32)),
        ("TF32 in cuDNN (torch.backends.cudnn.allow_tf32)", str(cudnn.allow_tf32)),
        ("torch.backends.cudnn.benchmark", str(cudnn.benchmark)),
        ("torch.backends.cudnn.deterministic", str(cudnn.deterministic)),
    ]
    if cudnn.is_available():
        pairs.append(("cuDNN", str(cudnn.version())))
    return pairs


class Skip(Exception):
    """A task with no counterpart here; the message says why."""


# ---------------------------------------------------------------------------------------------
# Timing


class Timer:
    """Synchronisation and sample timing for one device."""

    def __init__(self, device):
        self.cuda = device.startswith("cuda")
        self.device = device

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def region(self, work, iters):
        """Seconds for `iters` calls, read after the device finished them."""
        self.sync()
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                work()
            end.record()
            self.sync()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(iters):
            work()
        return time.perf_counter() - t0


def preallocated(result, used_out):
    """A measurement with the counter saying whether the output was allocated once (`out=`)."""
    return tuple(result) + ({"out_preallocated": 1.0 if used_out else 0.0},)


def percentile(sorted_values, q):
    position = q * (len(sorted_values) - 1)
    below, above = math.floor(position), math.ceil(position)
    weight = position - below
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * weight


def measure(timer, work, cfg):
    timer.sync()
    started = time.perf_counter()
    calls, first, quickest = 0, None, None
    while calls < cfg["min_warmup"] or time.perf_counter() - started < cfg["warmup_s"]:
        t0 = time.perf_counter()
        work()
        timer.sync()
        elapsed = time.perf_counter() - t0
        if first is None:
            first = elapsed
        else:
            quickest = elapsed if quickest is None else min(quickest, elapsed)
        calls += 1
        if elapsed > cfg["max_call_s"]:
            raise Skip("one call took %.1f s, over this run's limit of %.1f s" % (elapsed, cfg["max_call_s"]))
    # The first call pays one-time costs: estimate from the quickest call after it.
    per_call = max(quickest if quickest is not None else first, 1e-9)
    iters = max(1, math.ceil(cfg["min_sample_time_s"] / per_call))
    count = int(cfg["budget_s"] // (per_call * iters))
    count = max(cfg["min_samples"], min(count, cfg["max_samples"]))
    samples = sorted(timer.region(work, iters) / iters for _ in range(count))
    return percentile(samples, 0.5), percentile(samples, 0.1), percentile(samples, 0.9)


# ---------------------------------------------------------------------------------------------
# Cases with PyTorch


TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}


def torch_dtype(name):
    return getattr(torch, TORCH_DTYPES[name])


def cuda_only(device, what):
    if not device.startswith("cuda"):
        raise Skip("%s needs a device other than the host in PyTorch" % what)


def torch_case(task, cfg):
    device, case, kind = task["device"], task["case"], task["case"]["kind"]
    dtype = torch_dtype(task["dtype"])
    timer = Timer(device)
    gen = lambda *shape: torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)  # noqa: E731

    if kind == "matmul":
        n = case["n"]
        a, b = gen(n, n), gen(n, n)
        out = torch.empty_like(a)
        if case["tf32"]:
            cuda_only(device, "TF32")
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return preallocated(measure(timer, lambda: torch.matmul(a, b, out=out), cfg), True)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return preallocated(measure(timer, lambda: torch.matmul(a, b, out=out), cfg), True)
    if kind in ("matmul_loop", "matmul_batched", "matmul_graph"):
        count, n = case["count"], case["n"]
        a, b = gen(count, n, n), gen(count, n, n)
        if kind == "matmul_batched":
            out = torch.empty_like(a)
            return preallocated(measure(timer, lambda: torch.matmul(a, b, out=out), cfg), True)
        pairs = [(a[i], b[i]) for i in range(count)]

        def loop():
            return [torch.matmul(x, y) for x, y in pairs]

        if kind == "matmul_graph":
            cuda_only(device, "a CUDA graph")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loop()  # warm-up on a side stream, as torch.cuda.graphs recommends
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = loop()  # noqa: F841 (kept alive with the graph)
            return measure(timer, graph.replay, cfg)
        return measure(timer, loop, cfg)
    if kind in ("host_to_device", "device_to_host"):
        cuda_only(device, "a host/device transfer")
        n = case["bytes"] // 4
        host = torch.rand(n).pin_memory() if case["pinned"] else torch.rand(n)
        if kind == "host_to_device":
            if case["pinned"]:
                target = torch.empty(n, device=device)
                return measure(timer, lambda: target.copy_(host, non_blocking=True), cfg)
            return measure(timer, lambda: host.to(device), cfg)
        source = torch.rand(n, device=device)
        if case["pinned"]:
            return measure(timer, lambda: host.copy_(source, non_blocking=True), cfg)
        return measure(timer, lambda: source.cpu(), cfg)
    if kind == "move_batch":
        cuda_only(device, "a host/device transfer")
        fields, n = case["fields"], case["field_bytes"] // 4
        host = [torch.rand(n) for _ in range(fields)]
        if case["packed"]:
            staging = torch.empty(fields * n)

            def packed():
                torch.cat(host, out=staging)
                batch = staging.to(device).view(fields, n)
                return [batch[i] for i in range(fields)]

            return measure(timer, packed, cfg)
        return measure(timer, lambda: [f.to(device) for f in host], cfg)
    if kind == "pipeline":
        cuda_only(device, "a host/device pipeline")
        return torch_pipeline(case, device, timer, cfg)
    if kind == "loss_loop":
        n, steps = case["n"], case["steps"]
        x, w = gen(n, n), gen(n, n) / n

        def every_step():
            total = 0.0
            for _ in range(steps):
                total += (x @ w).sum().item()

        def accumulate():
            total = torch.zeros((), device=device)
            for _ in range(steps):
                total = total + (x @ w).sum()
            total.item()

        return measure(timer, every_step if case["read_every_step"] else accumulate, cfg)
    if kind == "alloc_loop":
        steps, numel = case["steps"], case["numel"]
        if case["empty_cache"]:
            cuda_only(device, "empty_cache")

        def loop():
            for step in range(steps):
                a = torch.full((numel,), 1.0, device=device)
                b = torch.full((numel // 3 + 129 * (step % 4),), 2.0, device=device)
                c = a[: b.numel()] + b
                del a, b, c
                if case["empty_cache"]:
                    torch.cuda.empty_cache()

        return measure(timer, loop, cfg)
    if kind == "matmul_shape":
        a, b = gen(case["m"], case["k"]), gen(case["k"], case["n"])
        return measure(timer, lambda: torch.matmul(a, b), cfg)
    if kind == "vector":
        return torch_vector(case["op"], case["numel"], gen, timer, cfg, device, dtype)
    if kind == "model":
        return torch_model(case, gen, timer, cfg, device)
    if kind == "forward_backward":
        return torch_forward_backward(case, gen, timer, cfg, device)
    raise Skip("no reference for %s" % kind)


def torch_op(case, gen, device):
    """The ops section's op at its shape, as cartage's `ModelOp` runs it: the inputs PyTorch
    computes gradients for, and the call that takes them (targets and ids captured)."""
    F = torch.nn.functional
    op = case["op"]
    if op in ("layer_norm", "rms_norm", "softmax", "log_softmax", "cross_entropy", "exp"):
        rows, cols = case["rows"], case["cols"]
        x = gen(rows, cols)
        if op == "layer_norm":
            return [x, gen(cols), gen(cols)], lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5)
        if op == "rms_norm":
            return [x, gen(cols)], lambda x, w: F.rms_norm(x, (cols,), w, 1e-6)
        if op == "cross_entropy":
            target = (torch.arange(rows, device=device) * 7919) % cols
            return [x], lambda x: F.cross_entropy(x, target)
        calls = {
            "softmax": lambda x: torch.softmax(x, dim=-1),
            "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
            "exp": torch.exp,
        }
        return [x], calls[op]
    if op == "cat":
        parts = [gen(case["part_rows"], case["cols"]) for _ in range(case["parts"])]
        return parts, lambda *parts: torch.cat(parts, dim=0)
    if op == "sort":
        return [gen(case["numel"])], lambda x: torch.sort(x, dim=-1, stable=True)[0]
    if op == "cumsum":
        return [gen(case["rows"], case["cols"])], lambda x: torch.cumsum(x, dim=-1)
    if op == "conv2d":
        side, k = case["side"], case["kernel"]
        x = gen(case["batch"], case["channels_in"], side, side)
        w = gen(case["channels_out"], case["channels_in"], k, k)
        return [x, w], lambda x, w: F.conv2d(x, w, None, 1, case["padding"])
    if op == "max_pool2d":
        side, k = case["side"], case["kernel"]
        x = gen(case["batch"], case["channels"], side, side)
        return [x], lambda x: F.max_pool2d(x, k, case["stride"], case["padding"])
    if op == "sdpa":
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        causal = case["causal"]
        if case.get("padded", False):
            # Mirrors `key_padding_len` in xtask/src/bench/cases/model.rs: entry b sees its
            # first seq - (b % 4) * seq // 8 keys; a bool [B, 1, 1, S] mask, True = attend.
            batch, seq = case["batch"], case["seq"]
            lens = torch.tensor([seq - (b % 4) * seq // 8 for b in range(batch)], device=device)
            mask = (torch.arange(seq, device=device)[None, :] < lens[:, None]).view(batch, 1, 1, seq)
            if causal:  # torch takes a mask or is_causal, not both
                mask = mask & torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
                causal = False
            return [gen(*shape), gen(*shape), gen(*shape)], \
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return [gen(*shape), gen(*shape), gen(*shape)], \
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if op == "embedding":
        num, count = case["num"], case["batch"] * case["seq"]
        ids = ((torch.arange(count, device=device) * 7919) % num).view(case["batch"], case["seq"])
        return [gen(num, case["dim"])], lambda table: F.embedding(ids, table)
    raise Skip("no reference for %s" % op)


def torch_model(case, gen, timer, cfg, device):
    """The ops section: the same op and shape as cartage's `ModelOp`, in torch, forward only."""
    op = case["op"]
    if op == "mlp_step":
        return torch_mlp_step(case, gen, timer, cfg, device)
    if op == "mlp_train":
        return torch_mlp_train(case, gen, timer, cfg, device)
    if op == "adamw":
        return torch_adamw(case, gen, timer, cfg, device)
    if op == "gpt_train":
        return torch_gpt_train(case, timer, cfg, device)
    inputs, call = torch_op(case, gen, device)
    work = lambda: call(*inputs)  # noqa: E731
    return with_impl(measure(timer, work, cfg), implementation(case, inputs, work, False))


def torch_forward_backward(case, gen, timer, cfg, device):
    """The ops section's op with its backward: the inputs require gradients, each call runs the
    forward, `out.backward(grad)` from a fixed random gradient of the output's shape (or
    `loss.backward()` where the output is one value, cross-entropy's mean), and sets every
    gradient to None, as cartage's `Var::zero_grad`."""
    inputs, call = torch_op(case, gen, device)
    for x in inputs:
        x.requires_grad_()
    out = call(*inputs)
    grad = None if out.numel() == 1 else torch.randn(out.shape, device=device).to(out.dtype)
    del out

    def step():
        call(*inputs).backward(grad)
        for x in inputs:
            x.grad = None

    return with_impl(measure(timer, step, cfg), implementation(case, inputs, step, True))


def with_impl(result, impl):
    """A measurement with the words for what ran after its counters and memory curve."""
    result = tuple(result)
    return result + ({}, [])[len(result) - 3:] + (impl,)


# ATen ops that pick a kernel family themselves: they name it whatever they call inside.
KERNEL_FAMILIES = {
    "aten::_scaled_dot_product_flash_attention": "flash attention",
    "aten::_scaled_dot_product_flash_attention_backward": "flash attention backward",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient attention",
    "aten::_scaled_dot_product_efficient_attention_backward": "memory-efficient attention backward",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN attention",
    "aten::_scaled_dot_product_cudnn_attention_backward": "cuDNN attention backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash attention (CPU)",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "flash attention (CPU) backward",
    "aten::_scaled_dot_product_attention_math": "math attention (matmul + softmax + matmul)",
    "aten::cudnn_convolution": "cuDNN convolution",
    "aten::embedding_dense_backward": "embedding_dense_backward",
}

# Bookkeeping, not compute: allocation, views, casts and copies.
BOOKKEEPING = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::ones_like", "aten::fill_", "aten::zero_",
    "aten::resize_", "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::expand",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::t", "aten::transpose", "aten::permute",
    "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice", "aten::narrow", "aten::unflatten",
    "aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous", "aten::clone", "aten::result_type",
    "aten::type_as", "aten::item", "aten::_local_scalar_dense", "aten::is_same_size", "aten::set_",
    "aten::record_stream", "aten::size", "aten::stride", "aten::_unsafe_view", "aten::split", "aten::chunk",
    "aten::unbind", "aten::resolve_conj", "aten::resolve_neg", "aten::conj", "aten::as_strided_",
    "aten::arange",
}


def aten_leaves(events):
    """The ATen ops that did the work, from one call's profiler events, forward and backward apart:
    a kernel family's op (above) where one ran, else each op that called no other computing op,
    in first-seen order, once each; and whether any backward node ran."""
    def ancestors(e):
        a = getattr(e, "cpu_parent", None)
        while a is not None:
            yield a
            a = getattr(a, "cpu_parent", None)

    def computing(e):
        return e.name.startswith("aten::") and e.name not in BOOKKEEPING

    def calls_computing(e):
        return any(computing(c) or calls_computing(c) for c in getattr(e, "cpu_children", []))

    forward, backward = [], []
    events = list(events)
    # Whether the profiler saw backward at all (its nodes run on the autograd engine's threads).
    saw_backward = any(e.name.startswith("autograd::engine") for e in events)
    for e in events:
        if not computing(e):
            continue
        up = list(ancestors(e))
        if any(a.name in KERNEL_FAMILIES for a in up):
            continue
        if e.name in KERNEL_FAMILIES:
            name = KERNEL_FAMILIES[e.name]
        elif calls_computing(e):
            continue
        else:
            name = e.name[len("aten::"):]
        side = backward if any(a.name.startswith("autograd::engine") for a in up) else forward
        if name not in side:
            side.append(name)
    return forward, backward, saw_backward


def implementation(case, inputs, work, backward):
    """What PyTorch ran for one call of `work`, in a few words: the ATen ops the profiler saw do
    the work (`aten_leaves`), and for a convolution the backend ATen chose for these inputs
    (which its backward uses too). `unknown` where the profiler cannot tell."""
    def listed(names):
        if not names:
            return "unknown"
        shown = " + ".join(names[:4])
        return shown + (" + …" if len(names) > 4 else "")

    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            work()
        forward, back, saw_backward = aten_leaves(prof.events())
    except Exception as error:  # the timing stands without it
        print("reference: no profile for %s: %s" % (case["op"], error), file=sys.stderr)
        return "unknown"
    words = listed(forward)
    if case["op"] == "conv2d":
        try:
            chosen = torch._C._select_conv_backend(inputs[0], inputs[1], None, [1, 1], [case["padding"]] * 2,
                                                   [1, 1], False, [0, 0], 1)
            words = "ATen conv backend %s: %s" % (str(chosen).split(".")[-1], words)
        except Exception:  # the profiled ops still say what ran
            pass
    if backward:
        # A backward that computed nothing handed back views of the output's gradient.
        if back or not saw_backward:
            words += "; backward: " + listed(back)
        else:
            words += "; backward: views of the gradient, no kernel"
    return words


def torch_mlp_step(case, gen, timer, cfg, device):
    """One training step of the MLP: forward, mean square, backward, gradients set to None.
    Returns the timing and, on CUDA, the peak of allocated memory during backward above its
    level when backward starts."""
    width = case["width"]
    x = gen(case["batch"], width)
    scale = 1.0 / width ** 0.5
    weights = [(gen(width, width) * scale).requires_grad_() for _ in range(case["layers"])]

    def forward():
        h = x
        for i, w in enumerate(weights):
            h = h @ w
            if i + 1 < len(weights):
                h = torch.relu(h)
        return h.square().mean()

    def step():
        forward().backward()
        for w in weights:
            w.grad = None

    median, p10, p90 = measure(timer, step, cfg)
    counters = {}
    if device != "cpu":
        loss = forward()
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss.backward()
        torch.cuda.synchronize(device)
        counters["backward_peak_bytes"] = float(torch.cuda.max_memory_allocated(device) - start)
        for w in weights:
            w.grad = None
    return median, p10, p90, counters


def measure_step(step, timer, cfg, device):
    """Time a training `step` after one untimed step (the optimizer's state exists from then
    on), with, on CUDA, `step_peak_bytes`: how far allocated memory rose during one more step."""
    step()
    counters = {}
    if device != "cpu":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        counters["step_peak_bytes"] = float(torch.cuda.max_memory_allocated(device) - start)
    median, p10, p90 = measure(timer, step, cfg)
    return median, p10, p90, counters


def torch_mlp_train(case, gen, timer, cfg, device):
    """A whole training step: Linear/ReLU layers and a 10-class head, cross-entropy, backward,
    AdamW, gradients set to None; under bf16 autocast when asked. Returns the timing and, on
    CUDA, the peak of allocated memory during one step above its level before the step."""
    width, batch = case["width"], case["batch"]
    layers = []
    for _ in range(case["layers"] - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    y = torch.arange(batch, device=device) % 10
    kind = "cuda" if device != "cpu" else "cpu"

    def step():
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=case["autocast"]):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return measure_step(step, timer, cfg, device)


def torch_gpt_train(case, timer, cfg, device):
    """A whole GPT training step, module for module the model of `cartage_nn::models::Gpt`: token
    and position embeddings, pre-norm blocks (LayerNorm, one qkv Linear, causal
    scaled_dot_product_attention, an output Linear, LayerNorm, a GELU MLP four times as wide), a
    final LayerNorm and a Linear head; cross-entropy over every position, AdamW, gradients set
    to None; under bf16 autocast when asked. Returns the timing and, on CUDA, the step's peak."""
    nn, F = torch.nn, torch.nn.functional
    layers, d, h = case["layers"], case["dim"], case["heads"]
    t, b, vocab = case["context"], case["batch"], case["vocab"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(t, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    model = Gpt().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    index = torch.arange(b * t, device=device)
    x = ((index * 7919) % vocab).view(b, t)
    y = ((index * 7919 + 1) % vocab)
    kind = "cuda" if device != "cpu" else "cpu"

    def step(mark=lambda phase: None):
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=case["autocast"]):
            loss = F.cross_entropy(model(x).view(b * t, vocab), y)
        mark("forward")
        loss.backward()
        mark("backward")
        opt.step()
        mark("optimizer")
        opt.zero_grad(set_to_none=True)
        del loss
        mark("zero_grad")

    result = measure_step(step, timer, cfg, device)
    if device == "cpu":
        return result
    return result + (memory_curve(step, device),)


def memory_curve(step, device, steps=3):
    """Device memory before and after each phase of `steps` more steps, as cartage's bench
    samples it: allocated, reserved and the highest allocated level since the previous point."""
    points = []

    def sample(i, phase):
        points.append(dict(step=i, phase=phase,
                           allocated=float(torch.cuda.memory_allocated(device)),
                           reserved=float(torch.cuda.memory_reserved(device)),
                           peak=float(torch.cuda.max_memory_allocated(device))))
        torch.cuda.reset_peak_memory_stats(device)

    torch.cuda.synchronize(device)
    sample(0, "start")
    for i in range(steps):
        step(lambda phase, i=i: sample(i, phase))
    torch.cuda.synchronize(device)
    return points


def torch_adamw(case, gen, timer, cfg, device):
    """One AdamW step over the case's parameters with their gradients given: the fused
    implementation on CUDA (`fused=True`), the default one on the CPU."""
    n = case["params"] // case["tensors"]
    params = [gen(n).requires_grad_() for _ in range(case["tensors"])]
    for p in params:
        p.grad = gen(n)
    fused = device != "cpu"
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=fused)
    opt.step()  # the moments exist from here on, as in cartage's timed steps
    return measure(timer, opt.step, cfg)


def numpy_adamw(case, gen, timer, cfg):
    """One AdamW step written out in numpy, in place (the CPU reference without torch)."""
    n = case["params"] // case["tensors"]
    lr, wd, b1, b2, eps = 1e-3, 0.01, 0.9, 0.999, 1e-8
    params = [gen(n) for _ in range(case["tensors"])]
    grads = [gen(n) for _ in range(case["tensors"])]
    moments = [(np.zeros(n, np.float32), np.zeros(n, np.float32)) for _ in params]
    t = [0]

    def step():
        t[0] += 1
        bc1, bc2 = 1 - b1 ** t[0], 1 - b2 ** t[0]
        for p, g, (m, v) in zip(params, grads, moments):
            p *= np.float32(1 - lr * wd)
            m *= np.float32(b1)
            m += np.float32(1 - b1) * g
            v *= np.float32(b2)
            v += np.float32(1 - b2) * g * g
            p -= np.float32(lr / bc1) * m / (np.sqrt(v) / np.float32(bc2 ** 0.5) + np.float32(eps))

    step()
    return measure(timer, step, cfg)


def numpy_mlp_step(case, gen, timer, cfg):
    """The MLP step with its backward written out in numpy (the CPU reference without torch)."""
    width, layers = case["width"], case["layers"]
    x = gen(case["batch"], width)
    weights = [gen(width, width) / np.float32(width ** 0.5) for _ in range(layers)]

    def step():
        inputs, h = [], x
        for i, w in enumerate(weights):
            inputs.append(h)
            h = h @ w
            if i + 1 < layers:
                h = np.maximum(h, 0)
        g = 2.0 * h / h.size
        grads = [None] * layers
        for i in reversed(range(layers)):
            if i + 1 < layers:
                g = g * (inputs[i + 1] > 0)
            grads[i] = inputs[i].T @ g
            g = g @ weights[i].T
        return grads

    return measure(timer, step, cfg)


def torch_pipeline(case, device, timer, cfg):
    batches, cols, mode = case["batches"], case["cols"], case["mode"]
    rows = case["batch_bytes"] // 4 // cols
    source = torch.rand(rows, cols)
    pinned = [torch.empty(rows, cols).pin_memory() for _ in range(2)]
    batch = [torch.empty(rows, cols, device=device) for _ in range(2)]
    weight = torch.randn(cols, cols, device=device)
    copies = torch.cuda.Stream(device)

    def copy(i):
        pinned[i].copy_(source)
        with torch.cuda.stream(copies):
            batch[i].copy_(pinned[i], non_blocking=True)
        return copies

    if mode == "copy_only":
        def work():
            for _ in range(batches):
                copy(0).synchronize()
    elif mode == "compute_only":
        def work():
            for _ in range(batches):
                batch[0] @ weight
    elif mode == "serial":
        def work():
            for _ in range(batches):
                copy(0).synchronize()
                batch[0] @ weight
                torch.cuda.synchronize(device)
    else:  # prefetch, and the loader case: PyTorch's counterpart of both is a copy stream
        def work():
            copy(0).synchronize()
            for step in range(batches):
                current, following = step % 2, (step + 1) % 2
                torch.cuda.synchronize(device)
                out = batch[current] @ weight
                if step + 1 < batches:
                    copy(following).synchronize()
                del out
    return measure(timer, work, cfg)


def torch_vector(op, numel, gen, timer, cfg, device, dtype):
    side = int(math.isqrt(numel))
    rows_op = op in ("sum_rows", "softmax")
    x = gen(side, side) if rows_op else gen(numel)
    y = gen(side, side) if rows_op else gen(numel)
    out = torch.empty_like(x)
    if op == "copy":
        return preallocated(measure(timer, lambda: out.copy_(x), cfg), True)
    total = torch.empty((), dtype=x.dtype, device=x.device)
    row_sums = torch.empty(side, dtype=x.dtype, device=x.device)
    into = {
        "add": lambda: torch.add(x, y, out=out),
        "mul": lambda: torch.mul(x, y, out=out),
        "exp": lambda: torch.exp(x, out=out),
        "relu": lambda: torch.clamp(x, min=0, out=out),
        "sum_all": lambda: torch.sum(x, dim=0, out=total),
        "sum_rows": lambda: torch.sum(x, dim=1, out=row_sums),
    }
    if op in into:
        return preallocated(measure(timer, into[op], cfg), True)
    fresh = {
        "gelu": lambda: torch.nn.functional.gelu(x),
        "softmax": lambda: torch.softmax(x, dim=1),
    }
    return preallocated(measure(timer, fresh[op], cfg), False)


# ---------------------------------------------------------------------------------------------
# Cases with numpy (CPU only)


NUMPY_DTYPES = {"f32": "float32", "f16": "float16", "f64": "float64"}


def numpy_case(task, cfg):
    case, kind = task["case"], task["case"]["kind"]
    if task["dtype"] not in NUMPY_DTYPES:
        raise Skip("numpy has no %s" % task["dtype"])
    dtype = getattr(np, NUMPY_DTYPES[task["dtype"]])
    rng = np.random.default_rng(0)
    gen = lambda *shape: rng.standard_normal(shape, dtype=np.float32).astype(dtype)  # noqa: E731
    timer = Timer("cpu")
    if kind == "matmul":
        if case["tf32"]:
            raise Skip("numpy has no TF32 mode")
        n = case["n"]
        a, b = gen(n, n), gen(n, n)
        out = np.empty_like(a)
        return preallocated(measure(timer, lambda: np.matmul(a, b, out=out), cfg), True)
    if kind == "matmul_graph":
        raise Skip("numpy has no CUDA graphs")
    if kind in ("matmul_loop", "matmul_batched"):
        count, n = case["count"], case["n"]
        a, b = gen(count, n, n), gen(count, n, n)
        if kind == "matmul_batched":
            out = np.empty_like(a)
            return preallocated(measure(timer, lambda: np.matmul(a, b, out=out), cfg), True)
        pairs = [(a[i], b[i]) for i in range(count)]

        def loop():
            for x, y in pairs:
                x @ y

        return measure(timer, loop, cfg)
    if kind in ("host_to_device", "device_to_host", "move_batch", "pipeline"):
        raise Skip("numpy has no device to move data to")
    if kind == "loss_loop":
        n, steps = case["n"], case["steps"]
        x, w = gen(n, n), gen(n, n) / n

        def every_step():
            total = 0.0
            for _ in range(steps):
                total += float((x @ w).sum())

        def accumulate():
            total = np.zeros((), dtype=np.float32)
            for _ in range(steps):
                total = total + (x @ w).sum()
            float(total)

        return measure(timer, every_step if case["read_every_step"] else accumulate, cfg)
    if kind == "alloc_loop":
        if case["empty_cache"]:
            raise Skip("numpy has no allocator cache to empty")
        steps, numel = case["steps"], case["numel"]

        def loop():
            for step in range(steps):
                a = np.full(numel, 1.0, dtype=np.float32)
                b = np.full(numel // 3 + 129 * (step % 4), 2.0, dtype=np.float32)
                c = a[: b.size] + b
                del a, b, c

        return measure(timer, loop, cfg)
    if kind == "vector":
        op, numel = case["op"], case["numel"]
        side = int(math.isqrt(numel))
        rows_op = op in ("sum_rows", "softmax")
        x = gen(side, side) if rows_op else gen(numel)
        y = gen(side, side) if rows_op else gen(numel)
        if op == "gelu":
            raise Skip("numpy has no erf for the exact gelu")
        out = np.empty_like(x)
        if op == "copy":
            return preallocated(measure(timer, lambda: np.copyto(out, x), cfg), True)
        total = np.empty((), dtype=x.dtype)
        row_sums = np.empty(side, dtype=x.dtype)
        into = {
            "add": lambda: np.add(x, y, out=out),
            "mul": lambda: np.multiply(x, y, out=out),
            "exp": lambda: np.exp(x, out=out),
            "relu": lambda: np.maximum(x, 0, out=out),
            "sum_all": lambda: np.sum(x, out=total),
            "sum_rows": lambda: np.sum(x, axis=1, out=row_sums),
        }
        if op in into:
            return preallocated(measure(timer, into[op], cfg), True)

        def softmax():
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)

        return preallocated(measure(timer, softmax, cfg), False)
    if kind == "model":
        return numpy_model(case, gen, timer, cfg)
    if kind == "forward_backward":
        return numpy_forward_backward(case, gen, timer, cfg)
    raise Skip("no reference for %s" % kind)


def numpy_model(case, gen, timer, cfg):
    """The CPU rows of the ops section, composed from numpy primitives."""
    op = case["op"]
    if op == "mlp_step":
        return numpy_mlp_step(case, gen, timer, cfg)
    if op == "adamw":
        return numpy_adamw(case, gen, timer, cfg)
    if op not in ("layer_norm", "softmax", "exp"):
        raise Skip("no numpy reference for %s" % op)
    rows, cols = case["rows"], case["cols"]
    x = gen(rows, cols)
    if op == "exp":
        return with_impl(measure(timer, lambda: np.exp(x), cfg), "numpy: exp")
    if op == "softmax":
        def softmax():
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        return with_impl(measure(timer, softmax, cfg), "numpy, composed")
    w, b = gen(cols), gen(cols)

    def layer_norm():
        mean = x.mean(axis=-1, keepdims=True)
        var = x.var(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * w + b

    return with_impl(measure(timer, layer_norm, cfg), "numpy, composed")


def numpy_forward_backward(case, gen, timer, cfg):
    """The CPU rows of the ops section with their backward written out in numpy, from a fixed
    output gradient: what autograd would run, without its bookkeeping."""
    op = case["op"]
    if op not in ("layer_norm", "softmax", "exp"):
        raise Skip("no numpy reference for %s with its backward" % op)
    rows, cols = case["rows"], case["cols"]
    x, g = gen(rows, cols), gen(rows, cols)
    if op == "exp":
        def exp():
            y = np.exp(x)
            return g * y

        return with_impl(measure(timer, exp, cfg), "numpy: exp; backward: multiply")
    if op == "softmax":
        def softmax():
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            y = e / e.sum(axis=-1, keepdims=True)
            return y * (g - (g * y).sum(axis=-1, keepdims=True))

        return with_impl(measure(timer, softmax, cfg), "numpy, composed; backward: composed")
    w, b = gen(cols), gen(cols)

    def layer_norm():
        mean = x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
        xhat = (x - mean) * rstd
        y = xhat * w + b
        gw = g * w
        dx = rstd * (gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True))
        return y, dx, (g * xhat).sum(axis=0), g.sum(axis=0)

    return with_impl(measure(timer, layer_norm, cfg), "numpy, composed; backward: composed")


# ---------------------------------------------------------------------------------------------
# The distributed section: dist.all_reduce over every local GPU, one process per GPU


_DIST_RESULTS = {}


def _dist_rank(rank, world, port, cases, cfg, queue):
    """One rank of the all-reduce sweep: every size in `cases`, timed with CUDA events; rank 0
    decides each size's schedule and broadcasts it, so every rank makes the same calls."""
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    for key, case in cases:
        x = torch.zeros(case["bytes"] // 4, dtype=torch.float32, device="cuda")
        for _ in range(max(cfg["min_warmup"], 5)):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        per_call = max((time.perf_counter() - t0) / 5, 1e-9)
        iters = max(1, math.ceil(cfg["min_sample_time_s"] / per_call))
        count = max(cfg["min_samples"], min(int(cfg["budget_s"] // (per_call * iters)), cfg["max_samples"]))
        schedule = torch.tensor([iters, count], dtype=torch.int64, device="cuda")
        dist.broadcast(schedule, 0)
        iters, count = schedule.tolist()
        samples = []
        for _ in range(count):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        samples.sort()
        if rank == 0:
            queue.put((key, percentile(samples, 0.5), percentile(samples, 0.1), percentile(samples, 0.9)))
        del x
    dist.destroy_process_group()


def torch_distributed(task, cfg, tasks):
    """`dist.all_reduce` (sum, f32, NCCL) for the distributed section. The first all-reduce task
    of a world size runs the whole sweep of that world size in one group of processes (starting
    one per size would cost an NCCL start-up each); the others read the results."""
    case = task["case"]
    if case["op"] != "all_reduce":
        raise Skip("no PyTorch counterpart for `%s` in this runner" % case["op"])
    if task["key"] not in _DIST_RESULTS:
        world = case["world"]
        if torch.cuda.device_count() < world:
            raise Skip("PyTorch sees %d CUDA GPUs; this case needs %d" % (torch.cuda.device_count(), world))
        import socket
        import torch.multiprocessing as mp
        cases = [(t["key"], t["case"]) for t in tasks
                 if t["case"]["kind"] == "distributed" and t["case"]["op"] == "all_reduce"
                 and t["case"]["world"] == world]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        ranks = [ctx.Process(target=_dist_rank, args=(r, world, port, cases, cfg, queue)) for r in range(world)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(timeout=600)
            if p.is_alive():
                p.terminate()
        while not queue.empty():
            key, median, p10, p90 = queue.get()
            _DIST_RESULTS[key] = (median, p10, p90)
        for key, _ in cases:
            _DIST_RESULTS.setdefault(key, "the PyTorch ranks stopped before this size (exit codes %s)"
                                     % [p.exitcode for p in ranks])
    result = _DIST_RESULTS[task["key"]]
    if isinstance(result, str):
        raise Skip(result)
    return result


def matmul_error(task, use_torch):
    """The normwise error of the task's matmul against an f64 product on the host (see the
    module's docstring), with the operands drawn in f32."""
    n, device, case = task["case"]["n"], task["device"], task["case"]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    count = min(64, n)
    rows = sorted(set(i * n // count for i in range(count)))
    exact = a[rows].astype(np.float64) @ b.astype(np.float64)
    if use_torch:
        dtype = torch_dtype(task["dtype"])
        ta, tb = (torch.from_numpy(x).to(device).to(dtype) for x in (a, b))
        torch.backends.cuda.matmul.allow_tf32 = bool(case["tf32"])
        try:
            c = torch.matmul(ta, tb).float().cpu().numpy()[rows]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    else:
        if task["dtype"] != "f32":
            raise Skip("numpy's %s matmul has no BLAS" % task["dtype"])
        c = a[rows] @ b
    return float(np.abs(c.astype(np.float64) - exact).max() / np.abs(exact).max())


def predicted_too_slow(task, history, cfg):
    """Skip a matmul whose time, scaled from the last smaller one, would pass the call limit."""
    case = task["case"]
    if case["kind"] != "matmul":
        return None
    key = (task["device"], task["dtype"], case["tf32"])
    last = history.get(key)
    if last is None or last[0] >= case["n"]:
        return None
    n, seconds = last
    predicted = seconds * (case["n"] / n) ** 3
    if predicted > cfg["max_call_s"]:
        return "predicted %.1f s per call from n = %d, over this run's limit of %.1f s" % (
            predicted, n, cfg["max_call_s"])
    return None


def run(spec_path):
    spec = json.load(open(spec_path))
    cfg = spec["bench"]
    history = {}
    if torch is not None:
        torch.manual_seed(0)
        torch.set_float32_matmul_precision("highest")
        # cuDNN convolutions default to TF32 in PyTorch; cartage's f32 conv2d computes in full
        # f32 at its default matmul precision, so the reference does too.
        torch.backends.cudnn.allow_tf32 = False
        # `cudnn.benchmark` stays at PyTorch's default (False): cuDNN's heuristics pick each
        # convolution's algorithm, as cartage's do. Both are reported as they stand.
        print(json.dumps({"settings": settings()}), flush=True)
    for task in spec["tasks"]:
        line = {"key": task["key"]}
        use_torch = torch is not None and (task["device"] == "cpu" or task["device"].startswith("cuda"))
        # The ops section's CPU rows are measured against numpy, as the targets say.
        if task["section"] == "ops" and task["device"] == "cpu" and np is not None:
            use_torch = False
        library = ("torch " + torch.__version__) if use_torch else ("numpy " + np.__version__ if np else "none")
        try:
            reason = predicted_too_slow(task, history, cfg)
            if reason:
                raise Skip(reason)
            if use_torch and task["case"]["kind"] == "distributed":
                result = torch_distributed(task, cfg, spec["tasks"])
            elif use_torch and task["device"].startswith("cuda"):
                # Events record on the current device's stream: make the task's device current.
                with torch.cuda.device(task["device"]):
                    result = torch_case(task, cfg)
            elif use_torch:
                result = torch_case(task, cfg)
                if task["section"] == "training":
                    library += " (%d threads)" % torch.get_num_threads()
            elif np is not None and task["device"] == "cpu":
                result = numpy_case(task, cfg)
            else:
                raise Skip("no library for %s" % task["device"])
            median, p10, p90 = result[:3]
            line.update(median=median, p10=p10, p90=p90, library=library)
            if len(result) > 3 and result[3]:
                line["counters"] = result[3]
            if len(result) > 4 and result[4]:
                line["memory_curve"] = result[4]
            if len(result) > 5 and result[5]:
                line["impl"] = result[5]
            if task["section"] == "precision" and np is not None:
                try:
                    line.setdefault("counters", {})["max_rel_error"] = matmul_error(task, use_torch)
                except Exception as error:  # the timing stands without it
                    print("reference: no error for %s: %s" % (task["key"], error), file=sys.stderr)
            if task["case"]["kind"] == "matmul":
                history[(task["device"], task["dtype"], task["case"]["tf32"])] = (task["case"]["n"], median)
        except Skip as skip:
            line["skipped"] = str(skip)
        except Exception as error:  # a failure of one case must not end the others
            line["skipped"] = "failed: %s: %s" % (type(error).__name__, error)
        print(json.dumps(line), flush=True)
        if use_torch and task["device"].startswith("cuda"):
            with torch.cuda.device(task["device"]):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "probe":
        print(json.dumps(probe()))
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        sys.exit("usage: reference.py probe | run SPEC.json")
