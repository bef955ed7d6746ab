//! Per-row cross-entropy with ignore_index and label smoothing: one workgroup per row of the
//! logits computes the row's maximum, then the sums of `exp(x - max)` and of `x` (f32), and
//! thread 0 writes the loss. A target outside `[0, C)` other than `ignore_index` sets the op's
//! slot of the index-check flags (`shaders/index.wgsl`), returned as
//! [`cartage_core::Error::IndexOutOfRange`] at the next synchronisation.

use cartage_core::{DType, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::{grid, word};
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

const INDEX: &str = include_str!("../../shaders/index.wgsl");

/// `out[n] = -(1 - s) logp[n, t] - s / C Σ_c logp[n, c]`, 0 where `t == ignore_index`.
pub(crate) fn cross_entropy(
    backend: &WgpuBackend,
    logits: &TensorArg,
    target: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let name = "cross_entropy";
    let shape = logits.layout.shape();
    let (classes, ls) = (shape[1], logits.layout.strides());
    let rows = Rows::new(
        name,
        shape,
        1,
        &[ls, &[out.layout.strides()[0], 0], &[target.layout.strides()[0], 0]],
    )?;
    if rows.rows == 0 {
        return Ok(());
    }
    let bound = [
        bind_operand(&backend.ctx, &backend.table, logits, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
        bind_operand(&backend.ctx, &backend.table, target, name, None)?,
    ];
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    let ignore = ignore_index as u64;
    let smoothing = label_smoothing as f32;
    params.put(EXTRA, &[word(ls[1], "stride")?, ignore as u32, (ignore >> 32) as u32]);
    params.put(EXTRA + 4, &[word(classes, "class count")?, smoothing.to_bits()]);
    let (dtype, index_dtype) = (logits.dtype, target.dtype);
    let key = format!("cross_entropy:{dtype}|{index_dtype}");
    let pipeline = backend
        .pipelines
        .get(&backend.ctx, &key, 4, || source(dtype, index_dtype))?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    // Reserve the flag slot and record under one lock (see `index.rs`).
    let mut checks = backend.index_checks.lock().unwrap_or_else(|p| p.into_inner());
    let (slot, flags) = checks.reserve(backend, name, 1, classes)?;
    params.put(EXTRA + 3, &[slot]);
    let windows = [bound[0].window, bound[1].window, bound[2].window, flags];
    let result = backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim));
    drop(checks);
    result
}

fn source(dtype: DType, index: DType) -> String {
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    bindings.push_str(&wgsl::binding(3, "b3", wgsl::storage_type(index)));
    bindings.push_str(&wgsl::binding(4, "flags", "atomic<u32>"));
    let mut accessors = wgsl::load_fn("ld_x", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    accessors.push_str(&wgsl::load_fn("ld_t", "b3", index));
    let pair = match index {
        DType::I64 => "raw",
        _ => "vec2<u32>(bitcast<u32>(raw), select(0u, 0xffffffffu, raw < 0))",
    };
    format!(
        "{prelude}
{ROWS}
{bindings}
{accessors}
{INDEX}
var<workgroup> tree: array<vec2<f32>, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let row = flat_group(wid, nwg);
    if row >= P.rows {{
        return;
    }}
    let b = row_bases(row);
    let n = P.len;
    let step = P.x[0].x;
    var m = -inf_f32();
    for (var j = lid; j < n; j = j + 256u) {{
        m = maximum_f32(m, ld_x(b.x + j * step));
    }}
    tree[lid] = vec2<f32>(m, 0.0);
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {{
        if lid < s {{
            tree[lid].x = maximum_f32(tree[lid].x, tree[lid + s].x);
        }}
        workgroupBarrier();
    }}
    let row_max = tree[0].x;
    workgroupBarrier();
    var acc = vec2<f32>(0.0, 0.0);
    for (var j = lid; j < n; j = j + 256u) {{
        let v = ld_x(b.x + j * step);
        acc = acc + vec2<f32>(exp(v - row_max), v);
    }}
    tree[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {{
        if lid < s {{
            tree[lid] = tree[lid] + tree[lid + s];
        }}
        workgroupBarrier();
    }}
    if lid != 0u {{
        return;
    }}
    let raw = ld_t(b.z);
    let idx = {pair};
    if idx.x == P.x[0].y && idx.y == P.x[0].z {{
        store_out(b.y, 0.0);
        return;
    }}
    if idx.y != 0u || idx.x >= n {{
        report_bad_index(P.x[0].w, idx);
        store_out(b.y, nan_f32());
        return;
    }}
    let lse = row_max + log(tree[0].x);
    let s = bitcast<f32>(P.x[1].y);
    var loss = -(1.0 - s) * (ld_x(b.x + idx.x * step) - lse);
    if s != 0.0 {{
        loss = loss - s / f32(n) * (tree[0].y - f32(n) * lse);
    }}
    store_out(b.y, loss);
}}
",
        prelude = wgsl::prelude(false)
    )
}
