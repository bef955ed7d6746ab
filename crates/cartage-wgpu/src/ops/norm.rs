//! Layer norm and RMS norm over the last dimension: one workgroup per row, two passes of
//! workgroup sums (the mean, then the centred variance or the mean square) in f32 (f64 for f64),
//! then the normalised, scaled and shifted outputs.

use cartage_core::{DType, NormKind, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::grid;
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

/// `out = norm(input) * weight + bias` over the last dimension.
pub(crate) fn norm(
    backend: &WgpuBackend,
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    bias: Option<&TensorArg>,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    let name = kind.name();
    let shape = input.layout.shape();
    let last = shape.len() - 1;
    let zeros = vec![0usize; shape.len()];
    let rows = Rows::new(
        name,
        shape,
        last,
        &[input.layout.strides(), out.layout.strides(), &zeros, &zeros],
    )?;
    if rows.rows == 0 || rows.len == 0 {
        return Ok(());
    }
    let mut bound = vec![
        bind_operand(&backend.ctx, &backend.table, input, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
    ];
    let mut steps = vec![input.layout.strides()[last], out.layout.strides()[last], 0, 0];
    for (k, param) in [weight, bias].into_iter().enumerate() {
        if let Some(p) = param {
            bound.push(bind_operand(&backend.ctx, &backend.table, p, name, None)?);
            steps[2 + k] = p.layout.strides()[0];
        }
    }
    let mut offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    if weight.is_none() && bias.is_some() {
        offsets.insert(2, 0);
    }
    let mut params = rows.params(&offsets)?;
    params.put_sizes(EXTRA, &steps, "stride")?;
    let hi = eps as f32;
    let lo = (eps - f64::from(hi)) as f32;
    params.put(EXTRA + 4, &[hi.to_bits(), lo.to_bits()]);
    let dtype = input.dtype;
    let (has_w, has_b) = (weight.is_some(), bias.is_some());
    let key = format!("norm:{name}|{dtype}|{}{}", u8::from(has_w), u8::from(has_b));
    let pipeline = backend
        .pipelines
        .get(&backend.ctx, &key, bound.len(), || source(kind, dtype, has_w, has_b))?;
    let windows: Vec<_> = bound.iter().map(|b| b.window).collect();
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim))
}

fn source(kind: NormKind, dtype: DType, has_w: bool, has_b: bool) -> String {
    let c = wgsl::compute_type(dtype);
    let f64 = dtype == DType::F64;
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    let mut accessors = wgsl::load_fn("ld_x", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    let mut next = 3;
    let mut scale = String::new();
    if has_w {
        bindings.push_str(&wgsl::binding(next, "b3", wgsl::storage_type(dtype)));
        accessors.push_str(&wgsl::load_fn("ld_w", "b3", dtype));
        scale.push_str("y = y * ld_w(P.offs.z + j * P.x[0].z);\n        ");
        next += 1;
    }
    if has_b {
        let buf = format!("b{next}");
        bindings.push_str(&wgsl::binding(next, &buf, wgsl::storage_type(dtype)));
        accessors.push_str(&wgsl::load_fn("ld_b", &buf, dtype));
        scale.push_str("y = y + ld_b(P.offs.w + j * P.x[0].w);\n        ");
    }
    let eps = if f64 {
        "f64(bitcast<f32>(P.x[1].x)) + f64(bitcast<f32>(P.x[1].y))"
    } else {
        "bitcast<f32>(P.x[1].x)"
    };
    let zero = if f64 { "0.0lf" } else { "0.0" };
    let one = if f64 { "1.0lf" } else { "1.0" };
    let stats = match kind {
        NormKind::Layer => format!(
            "var s = {zero};
    for (var j = lid; j < n; j = j + 256u) {{
        s = s + ld_x(b.x + j * P.x[0].x);
    }}
    let mean = workgroup_sum(s, lid) / {c}(n);
    var q = {zero};
    for (var j = lid; j < n; j = j + 256u) {{
        let d = ld_x(b.x + j * P.x[0].x) - mean;
        q = q + d * d;
    }}
    let rstd = {one} / sqrt(workgroup_sum(q, lid) / {c}(n) + eps);"
        ),
        NormKind::Rms => format!(
            "let mean = {zero};
    var q = {zero};
    for (var j = lid; j < n; j = j + 256u) {{
        let v = ld_x(b.x + j * P.x[0].x);
        q = q + v * v;
    }}
    let rstd = {one} / sqrt(workgroup_sum(q, lid) / {c}(n) + eps);"
        ),
    };
    format!(
        "{prelude}
{ROWS}
{bindings}
{accessors}
var<workgroup> tree: array<{c}, 256>;

fn workgroup_sum(v: {c}, lid: u32) -> {c} {{
    tree[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {{
        if lid < s {{
            tree[lid] = tree[lid] + tree[lid + s];
        }}
        workgroupBarrier();
    }}
    let total = tree[0];
    workgroupBarrier();
    return total;
}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let row = flat_group(wid, nwg);
    if row >= P.rows {{
        return;
    }}
    let b = row_bases(row);
    let n = P.len;
    let eps = {eps};
    {stats}
    for (var j = lid; j < n; j = j + 256u) {{
        var y = (ld_x(b.x + j * P.x[0].x) - mean) * rstd;
        {scale}store_out(b.y + j * P.x[0].y, y);
    }}
}}
",
        prelude = wgsl::prelude(f64)
    )
}
