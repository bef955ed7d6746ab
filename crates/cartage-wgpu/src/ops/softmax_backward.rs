//! The input gradient of softmax and log-softmax (`shaders/softmax_backward.wgsl`): one
//! workgroup per row along `dim`, the forward's output, the incoming gradient and the result read
//! and written in place through their strides, in f32 (f64 for softmax on f64).

use cartage_core::{DType, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::grid;
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

const SOFTMAX_BACKWARD: &str = include_str!("../../shaders/softmax_backward.wgsl");

/// `out = y·(g − Σ g·y)` (softmax) or `g − exp(y)·Σ g` (log-softmax, `log`) along `dim`.
pub(crate) fn softmax_backward(
    backend: &WgpuBackend,
    output: &TensorArg,
    grad: &TensorArg,
    dim: usize,
    log: bool,
    out: &TensorArg,
) -> Result<()> {
    let name = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let zeros = vec![0usize; out.layout.rank()];
    let rows = Rows::new(
        name,
        out.layout.shape(),
        dim,
        &[
            output.layout.strides(),
            out.layout.strides(),
            grad.layout.strides(),
            &zeros,
        ],
    )?;
    if rows.rows == 0 || rows.len == 0 {
        return Ok(());
    }
    let bound = [
        bind_operand(&backend.ctx, &backend.table, output, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
        bind_operand(&backend.ctx, &backend.table, grad, name, None)?,
    ];
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    let steps = [
        output.layout.strides()[dim],
        out.layout.strides()[dim],
        grad.layout.strides()[dim],
    ];
    params.put_sizes(EXTRA, &steps, "stride")?;
    let dtype = out.dtype;
    let key = format!("{name}|{dtype}");
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, bound.len(), || source(dtype, log))?;
    let windows = bound.map(|b| b.window);
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim))
}

fn source(dtype: DType, log: bool) -> Result<String> {
    let f64 = dtype == DType::F64;
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    bindings.push_str(&wgsl::binding(3, "b3", wgsl::storage_type(dtype)));
    let mut accessors = wgsl::load_fn("ld_y", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    accessors.push_str(&wgsl::load_fn("ld_g", "b3", dtype));
    let (term, output) = if log {
        ("g", "g - exp(y) * total")
    } else {
        ("g * y", "y * (g - total)")
    };
    wgsl::Pieces::parse("shaders/softmax_backward.wgsl", SOFTMAX_BACKWARD).fill_head(&[
        ("PRELUDE", &wgsl::prelude(f64)),
        ("ROWS", ROWS),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("T", wgsl::compute_type(dtype)),
        ("ZERO", if f64 { "0.0lf" } else { "0.0" }),
        ("TERM", term),
        ("OUTPUT", output),
    ])
}
