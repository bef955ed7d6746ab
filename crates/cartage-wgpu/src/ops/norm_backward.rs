//! The input gradient of layer norm and RMS norm (`shaders/norm_backward.wgsl`): one workgroup
//! per row of the last dimension, the statistics recomputed as the forward computes them, then
//! workgroup sums of `ĝ` and `ĝ·x̂`, in f32 (f64 for f64); every operand read or written in place
//! through its strides.

use cartage_core::{DType, NormKind, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::grid;
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

const NORM_BACKWARD: &str = include_str!("../../shaders/norm_backward.wgsl");

/// The input gradient of `norm(input) * weight` over the last dimension, from `grad`.
pub(crate) fn norm_backward(
    backend: &WgpuBackend,
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    grad: &TensorArg,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    let name = match kind {
        NormKind::Layer => "layer_norm_backward",
        NormKind::Rms => "rms_norm_backward",
    };
    let shape = input.layout.shape();
    let last = shape.len() - 1;
    let zeros = vec![0usize; shape.len()];
    let rows = Rows::new(
        name,
        shape,
        last,
        &[
            input.layout.strides(),
            out.layout.strides(),
            grad.layout.strides(),
            &zeros,
        ],
    )?;
    if rows.rows == 0 || rows.len == 0 {
        return Ok(());
    }
    let mut bound = vec![
        bind_operand(&backend.ctx, &backend.table, input, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
        bind_operand(&backend.ctx, &backend.table, grad, name, None)?,
    ];
    let mut steps = vec![
        input.layout.strides()[last],
        out.layout.strides()[last],
        grad.layout.strides()[last],
        0,
    ];
    if let Some(w) = weight {
        bound.push(bind_operand(&backend.ctx, &backend.table, w, name, None)?);
        steps[3] = w.layout.strides()[0];
    }
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    params.put_sizes(EXTRA, &steps, "stride")?;
    let hi = eps as f32;
    let lo = (eps - f64::from(hi)) as f32;
    params.put(EXTRA + 4, &[hi.to_bits(), lo.to_bits()]);
    let dtype = input.dtype;
    let has_weight = weight.is_some();
    let key = format!("{name}|{dtype}|{}", u8::from(has_weight));
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, bound.len(), || source(kind, dtype, has_weight))?;
    let windows: Vec<_> = bound.iter().map(|b| b.window).collect();
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim))
}

fn source(kind: NormKind, dtype: DType, has_weight: bool) -> Result<String> {
    let f64 = dtype == DType::F64;
    let t = wgsl::compute_type(dtype);
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    bindings.push_str(&wgsl::binding(3, "b3", wgsl::storage_type(dtype)));
    let mut accessors = wgsl::load_fn("ld_x", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    accessors.push_str(&wgsl::load_fn("ld_g", "b3", dtype));
    let ghat = if has_weight {
        bindings.push_str(&wgsl::binding(4, "b4", wgsl::storage_type(dtype)));
        accessors.push_str(&wgsl::load_fn("ld_w", "b4", dtype));
        "ld_g(b.z + j * step.z) * ld_w(P.offs.w + j * step.w)"
    } else {
        "ld_g(b.z + j * step.z)"
    };
    let eps = if f64 {
        "f64(bitcast<f32>(P.x[1].x)) + f64(bitcast<f32>(P.x[1].y))"
    } else {
        "bitcast<f32>(P.x[1].x)"
    };
    let (zero, one) = if f64 { ("0.0lf", "1.0lf") } else { ("0.0", "1.0") };
    let pieces = wgsl::Pieces::parse("shaders/norm_backward.wgsl", NORM_BACKWARD);
    let (stats, mean_g) = match kind {
        NormKind::Layer => (pieces.fill("layer_stats", &[("T", t), ("ONE", one)])?, "sums.x"),
        NormKind::Rms => (
            pieces.fill("rms_stats", &[("T", t), ("ZERO", zero), ("ONE", one)])?,
            zero,
        ),
    };
    pieces.fill_head(&[
        ("PRELUDE", &wgsl::prelude(f64)),
        ("ROWS", ROWS),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("T", t),
        ("EPS", eps),
        ("STATS", &stats),
        ("GHAT", ghat),
        ("MEAN_G", mean_g),
    ])
}
