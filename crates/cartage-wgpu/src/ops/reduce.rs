//! Reductions (`shaders/reduce.wgsl`): sum, mean, max, min, argmax, argmin and log-sum-exp
//! over any set of dimensions of a strided input.
//!
//! Kept dimensions are coalesced jointly for input and output, reduced dimensions for the
//! input. A long reduction is split over several workgroups per output, whose partial states
//! go to scratch memory from the caching allocator and are combined by a finishing pass; many
//! short reductions run one invocation per output, and column-wise ones (the reduced stride not
//! 1: neighbouring outputs read neighbouring elements) one invocation per output and chunk of
//! the reduction, whose partial states a second pass combines. f32 sums over contiguous rows
//! read four elements at a time.

use cartage_core::{DType, Error, ReduceOp, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::{MAX_RANK, WORKGROUP, coalesce, grid};
use crate::wgsl;

const REDUCE: &str = include_str!("../../shaders/reduce.wgsl");

/// How one launch is organised.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Plan {
    /// One workgroup per output.
    Direct,
    /// `groups` workgroups per output, then a finishing pass.
    Split(u32),
    /// One invocation per output.
    PerThread,
    /// One invocation per (output, chunk of `groups`) writing partial states, then one per
    /// output combining them: reductions over outer dimensions into few outputs (a bias
    /// gradient's `[16384, 384] → [384]`), where one invocation per output would leave the
    /// device nearly idle and walk 16384 elements each.
    Columns(u32),
}

/// Invocations a column-wise reduction aims for (outputs × chunks).
const COLUMN_INVOCATIONS: usize = 1 << 16;
/// The fewest elements one invocation of a column-wise reduction combines.
const COLUMN_MIN_CHUNK: usize = 16;
/// The most chunks per output of a column-wise reduction (the finishing pass walks them).
const COLUMN_MAX_GROUPS: usize = 1024;
/// The fewest outputs for which a column-wise reduction (reduced stride not 1) is split into
/// chunks; fewer outputs run one workgroup (or several) per output.
const COLUMN_MIN_OUTPUTS: usize = 32;

fn acc_type(dtype: DType) -> &'static str {
    wgsl::compute_type(dtype)
}

/// The WGSL of the op: identity, element, combine, finish.
fn ops_source(op: ReduceOp, dtype: DType) -> String {
    let acc = acc_type(dtype);
    let fam = wgsl::family(dtype);
    let float = dtype.is_float();
    let (lowest, highest) = match fam {
        "f32" => ("-inf_f32()", "inf_f32()"),
        "f64" => ("f64(-inf_f32())", "f64(inf_f32())"),
        "i32" => ("(-2147483647 - 1)", "2147483647"),
        "i64" => ("vec2<u32>(0u, 0x80000000u)", "vec2<u32>(0xffffffffu, 0x7fffffffu)"),
        _ => ("0u", "0xffffffffu"),
    };
    let zero = match fam {
        "f32" => "0.0",
        "f64" => "0.0lf",
        "i32" => "0",
        "i64" => "vec2<u32>(0u, 0u)",
        _ => "0u",
    };
    let one = match fam {
        "f32" => "1.0",
        "f64" => "1.0lf",
        "i32" => "1",
        "i64" => "vec2<u32>(1u, 0u)",
        _ => "1u",
    };
    // i64 word pairs add, multiply and order through `shaders/i64_ops.wgsl`.
    let (add, mul, less) = if fam == "i64" {
        ("add_i64(a.v, b.v)", "mul_i64(a.v, b.v)", "lt_i64(x, y)")
    } else {
        ("a.v + b.v", "a.v * b.v", "x < y")
    };
    let nan = |x: &str| {
        if float {
            format!("is_nan_{fam}({x})")
        } else {
            "false".into()
        }
    };
    let identity = match op {
        ReduceOp::Sum | ReduceOp::Mean => format!("S({zero}, {zero}, 0u)"),
        ReduceOp::Max => format!("S({lowest}, {zero}, 0u)"),
        ReduceOp::Min => format!("S({highest}, {zero}, 0u)"),
        ReduceOp::ArgMax | ReduceOp::ArgMin => format!("S({zero}, {zero}, 0xffffffffu)"),
        ReduceOp::LogSumExp => format!("S({lowest}, {zero}, 0u)"),
        ReduceOp::Prod => format!("S({one}, {zero}, 0u)"),
    };
    let combine = match op {
        ReduceOp::Sum | ReduceOp::Mean => format!("return S({add}, a.w, 0u);"),
        ReduceOp::Prod => format!("return S({mul}, a.w, 0u);"),
        ReduceOp::Max | ReduceOp::Min => {
            let better = if op == ReduceOp::Max {
                "less(a.v, b.v)"
            } else {
                "less(b.v, a.v)"
            };
            format!(
                "if {an} {{ return a; }}
    if {bn} {{ return b; }}
    if {better} {{ return b; }}
    return a;",
                an = nan("a.v"),
                bn = nan("b.v")
            )
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let (b_better, a_better) = if op == ReduceOp::ArgMax {
                ("less(a.v, b.v)", "less(b.v, a.v)")
            } else {
                ("less(b.v, a.v)", "less(a.v, b.v)")
            };
            format!(
                "if a.i == 0xffffffffu {{ return b; }}
    if b.i == 0xffffffffu {{ return a; }}
    let an = {an};
    let bn = {bn};
    if an || bn {{
        if an && bn {{
            if b.i < a.i {{ return b; }}
            return a;
        }}
        if an {{ return a; }}
        return b;
    }}
    if {b_better} {{ return b; }}
    if {a_better} {{ return a; }}
    if b.i < a.i {{ return b; }}
    return a;",
                an = nan("a.v"),
                bn = nan("b.v")
            )
        }
        ReduceOp::LogSumExp => "if a.v == -inf_f32() { return b; }
    if b.v == -inf_f32() { return a; }
    let m = maximum_f32(a.v, b.v);
    let ea = select(exp(a.v - m), 1.0, a.v == m);
    let eb = select(exp(b.v - m), 1.0, b.v == m);
    return S(m, a.w * ea + b.w * eb, 0u);"
            .to_string(),
    };
    let out_c = wgsl::compute_type(op.output_dtype(dtype));
    let finish = match op {
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min => "return s.v;".to_string(),
        ReduceOp::Mean => format!("return s.v / {acc}(P.count);"),
        ReduceOp::ArgMax | ReduceOp::ArgMin => "return vec2<u32>(s.i, 0u);".to_string(),
        ReduceOp::LogSumExp => "if s.v == -inf_f32() { return s.v; }
    return s.v + log_f32(s.w);"
            .to_string(),
    };
    format!(
        "fn less(x: {acc}, y: {acc}) -> bool {{ return {less}; }}
fn identity() -> S {{ return {identity}; }}
fn element(x: {acc}, r: u32) -> S {{ return S(x, {one}, r); }}
fn combine(a: S, b: S) -> S {{
    {combine}
}}
fn finish(s: S) -> {out_c} {{
    {finish}
}}
"
    )
}

const TREE: &str = "    tree[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if lid < s {
            tree[lid] = combine(tree[lid], tree[lid + s]);
        }
        workgroupBarrier();
    }";

fn main_source(stage: &str, vec4_sum: bool) -> String {
    let header = "var<workgroup> tree: array<S, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let flat = wid.x + wid.y * nwg.x;";
    match stage {
        "finish" => format!(
            "{header}
    if flat >= P.outputs {{
        return;
    }}
    var acc = identity();
    for (var g = lid; g < P.groups; g = g + 256u) {{
        acc = combine(acc, partials[flat * P.groups + g]);
    }}
{TREE}
    if lid == 0u {{
        store_out(kept_bases(flat).y, finish(tree[0]));
    }}
}}"
        ),
        "col_partial" => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= P.outputs * P.groups {
        return;
    }
    // Neighbouring invocations take neighbouring outputs of one chunk: coalesced reads.
    let o = i % P.outputs;
    let g = i / P.outputs;
    let bases = kept_bases(o);
    let start = g * P.chunk;
    let end = min(start + P.chunk, P.count);
    var acc = identity();
    for (var r = start; r < end; r = r + 1u) {
        acc = combine(acc, element(load_x(bases.x + red_offset(r)), r));
    }
    partials[g * P.outputs + o] = acc;
}"
        .to_string(),
        "col_finish" => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.x + gid.y * nwg.x * 256u;
    if o >= P.outputs {
        return;
    }
    // Chunks in order, so first-index ties of argmax/argmin keep the earliest.
    var acc = identity();
    for (var g = 0u; g < P.groups; g = g + 1u) {
        acc = combine(acc, partials[g * P.outputs + o]);
    }
    store_out(kept_bases(o).y, finish(acc));
}"
        .to_string(),
        "thread" => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.x + gid.y * nwg.x * 256u;
    if o >= P.outputs {
        return;
    }
    let bases = kept_bases(o);
    var acc = identity();
    for (var r = 0u; r < P.count; r = r + 1u) {
        acc = combine(acc, element(load_x(bases.x + red_offset(r)), r));
    }
    store_out(bases.y, finish(acc));
}"
        .to_string(),
        _ => {
            let emit = if stage == "partial" {
                "partials[flat] = tree[0];"
            } else {
                "store_out(bases.y, finish(tree[0]));"
            };
            let body = if vec4_sum {
                "var acc4 = vec4<f32>(0.0);
    for (var q = (start >> 2u) + lid; q < (end >> 2u); q = q + 256u) {
        acc4 = acc4 + b1[(bases.x >> 2u) + q];
    }
    var acc = S((acc4.x + acc4.y) + (acc4.z + acc4.w), 0.0, 0u);"
            } else {
                "var acc = identity();
    for (var r = start + lid; r < end; r = r + 256u) {
        acc = combine(acc, element(load_x(bases.x + red_offset(r)), r));
    }"
            };
            format!(
                "{header}
    if flat >= P.outputs * P.groups {{
        return;
    }}
    let o = flat / P.groups;
    let g = flat % P.groups;
    let bases = kept_bases(o);
    let start = g * P.chunk;
    let end = min(start + P.chunk, P.count);
    {body}
{TREE}
    if lid == 0u {{
        {emit}
    }}
}}"
            )
        }
    }
}

/// `fn store_out(e, v)`: a plain store, or atomic bit updates for packed dtypes (outputs of
/// different workgroups may share a word).
pub(crate) fn store_source(out: DType) -> String {
    let c = wgsl::compute_type(out);
    if wgsl::packed(out) {
        let per = wgsl::per_word(out);
        let bits = wgsl::bits(out);
        let full = (1u64 << bits) - 1;
        format!(
            "{enc}fn store_out(e: u32, v: {c}) {{
    let w = e / {per}u;
    let shift = (e % {per}u) * {bits}u;
    atomicAnd(&b2[w], ~({full}u << shift));
    atomicOr(&b2[w], enc_out(v) << shift);
}}
",
            enc = wgsl::encode_fn("enc_out", out)
        )
    } else {
        wgsl::store_fn("store_out", "b2", out)
    }
}

/// Reduce `dims` of `input` into `out` with `op`.
pub(crate) fn reduce(
    backend: &WgpuBackend,
    op: ReduceOp,
    input: &TensorArg,
    dims: &[usize],
    out: &TensorArg,
) -> Result<()> {
    let outputs = out.layout.numel();
    if outputs == 0 {
        return Ok(());
    }
    let shape = input.layout.shape();
    let strides = input.layout.strides();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let kept_in: Vec<usize> = kept.iter().map(|&d| strides[d]).collect();
    let kept_out: Vec<usize> = kept.iter().map(|&d| out.layout.strides()[d]).collect();
    let red_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let red_in: Vec<usize> = dims.iter().map(|&d| strides[d]).collect();
    let kept_g = coalesce(&kept_shape, &[&kept_in, &kept_out]);
    let red_g = coalesce(&red_shape, &[&red_in]);
    let count: usize = cartage_core::checked_numel(&red_shape).unwrap_or(0);
    if kept_g.shape.len() > MAX_RANK || red_g.shape.len() > MAX_RANK {
        return Err(Error::invalid(
            op.name(),
            format!(
                "the wgpu reduction indexes at most rank {MAX_RANK} kept and reduced dimensions after merging; make the input contiguous first"
            ),
        ));
    }
    let in_bound = bind_operand(&backend.ctx, &backend.table, input, op.name(), None)?;
    let out_bound = bind_operand(&backend.ctx, &backend.table, out, op.name(), None)?;
    let red_contiguous = red_g.shape.len() <= 1 && red_g.strides[0].first().is_none_or(|&s| s == 1);
    let inner_stride = red_g.strides[0].last().copied().unwrap_or(1);
    let column_groups = (COLUMN_INVOCATIONS / outputs.max(1))
        .min(count / COLUMN_MIN_CHUNK)
        .min(COLUMN_MAX_GROUPS);
    let plan = if count > 0 && inner_stride != 1 && outputs >= COLUMN_MIN_OUTPUTS && column_groups > 1 {
        Plan::Columns(column_groups as u32)
    } else if count == 0 || (outputs >= 256 && (inner_stride != 1 || count <= 64)) {
        Plan::PerThread
    } else {
        let wanted = count.div_ceil(4096).min((2048 / outputs).max(1)).max(1);
        if wanted > 1 {
            Plan::Split(wanted as u32)
        } else {
            Plan::Direct
        }
    };
    let (groups, chunk) = match plan {
        Plan::Split(g) => {
            let chunk = count.div_ceil(g as usize).next_multiple_of(4).max(4);
            (g as usize, chunk)
        }
        // Every chunk non-empty: as many as `chunk` needs.
        Plan::Columns(g) => {
            let chunk = count.div_ceil(g as usize);
            (count.div_ceil(chunk), chunk)
        }
        _ => (1, count.next_multiple_of(4).max(4)),
    };
    let vec4_sum = input.dtype == DType::F32
        && matches!(op, ReduceOp::Sum | ReduceOp::Mean)
        && matches!(plan, Plan::Direct | Plan::Split(_))
        && red_contiguous
        && count.is_multiple_of(4)
        && in_bound.element_offset.is_multiple_of(4)
        && kept_g.strides[0].iter().all(|s| s % 4 == 0);
    let mut params = ParamBlock::default();
    params.put_sizes(
        0,
        &[outputs, count, kept_g.shape.len(), red_g.shape.len()],
        "reduction size",
    )?;
    params.put_sizes(
        4,
        &[
            in_bound.element_offset as usize,
            out_bound.element_offset as usize,
            groups,
            chunk,
        ],
        "offset",
    )?;
    params.put_sizes(8, &kept_g.shape, "dimension")?;
    params.put_sizes(16, &kept_g.strides[0], "stride")?;
    params.put_sizes(24, &kept_g.strides[1], "stride")?;
    params.put_sizes(32, &red_g.shape, "dimension")?;
    params.put_sizes(40, &red_g.strides[0], "stride")?;
    let red_offset = if red_contiguous {
        "fn red_offset(r: u32) -> u32 { return r; }"
    } else {
        "fn red_offset(r: u32) -> u32 { return red_offset_strided(r); }"
    };
    let out_dtype = out.dtype;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    let source = |stage: &str, with_partials: bool| {
        let acc = acc_type(input.dtype);
        let in_element = if vec4_sum && stage != "finish" {
            "vec4<f32>".to_string()
        } else {
            wgsl::storage_type(input.dtype).to_string()
        };
        let mut bindings = wgsl::binding(1, "b1", &in_element);
        let out_element = if wgsl::packed(out_dtype) {
            "atomic<u32>"
        } else {
            wgsl::storage_type(out_dtype)
        };
        bindings.push_str(&wgsl::binding(2, "b2", out_element));
        if with_partials {
            bindings.push_str(&wgsl::binding(3, "partials", "S"));
        }
        let mut accessors = String::new();
        if !(vec4_sum && stage != "finish") {
            accessors.push_str(&wgsl::load_fn("load_x", "b1", input.dtype));
        }
        accessors.push_str(&store_source(out_dtype));
        wgsl::fill(
            REDUCE,
            &[
                ("PRELUDE", &wgsl::prelude(input.dtype == DType::F64)),
                ("ACC", acc),
                ("BINDINGS", &bindings),
                ("ACCESSORS", &accessors),
                ("RED_OFFSET", red_offset),
                ("OPS", &ops_source(op, input.dtype)),
                ("MAIN", &main_source(stage, vec4_sum)),
            ],
        )
    };
    let key = |stage: &str| {
        format!(
            "reduce:{}|{}|{}|{stage}|{}{}",
            op.name(),
            input.dtype,
            out_dtype,
            if red_contiguous { "c" } else { "s" },
            if vec4_sum { "|v4" } else { "" }
        )
    };
    let windows = [in_bound.window, out_bound.window];
    match plan {
        Plan::PerThread => {
            let pipeline = backend
                .pipelines
                .get(&backend.ctx, &key("thread"), 2, || source("thread", false))?;
            backend.record(&pipeline, &windows, &params, grid(outputs as u64, WORKGROUP, max_dim))
        }
        Plan::Direct => {
            let pipeline = backend
                .pipelines
                .get(&backend.ctx, &key("direct"), 2, || source("direct", false))?;
            backend.record(&pipeline, &windows, &params, grid(outputs as u64, 1, max_dim))
        }
        Plan::Split(_) | Plan::Columns(_) => {
            let columns = matches!(plan, Plan::Columns(_));
            let (partial_stage, finish_stage) = if columns {
                ("col_partial", "col_finish")
            } else {
                ("partial", "finish")
            };
            let g = groups as u64;
            // S is (v, w, i): 12 bytes, or 24 with 8-byte-aligned f64 / vec2<u32> fields.
            let state_bytes = if input.dtype.size_in_bytes() == 8 { 24 } else { 12 };
            let scratch = backend.scratch(outputs * groups * state_bytes)?;
            let slice = scratch.slice();
            let partials = Window {
                segment: slice.segment().id,
                offset: slice.offset() as u64,
                size: (slice.len() as u64).div_ceil(16) * 16,
            };
            let result = (|| {
                let all = [in_bound.window, out_bound.window, partials];
                let partial = backend
                    .pipelines
                    .get(&backend.ctx, &key(partial_stage), 3, || source(partial_stage, true))?;
                let per_group = if columns { WORKGROUP } else { 1 };
                backend.record(&partial, &all, &params, grid(outputs as u64 * g, per_group, max_dim))?;
                let finish = backend
                    .pipelines
                    .get(&backend.ctx, &key(finish_stage), 3, || source(finish_stage, true))?;
                backend.record(&finish, &all, &params, grid(outputs as u64, per_group, max_dim))
            })();
            cartage_core::Backend::free(backend, scratch);
            result
        }
    }
}
