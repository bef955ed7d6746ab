//! Softmax and log-softmax along one dimension (`shaders/softmax.wgsl`), one workgroup per row,
//! strided input and output read and written in place; a causal softmax reads only each row's
//! unmasked leading part.

use cartage_core::{Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::encoder::ParamBlock;
use crate::ops::geometry::{MAX_RANK, coalesce, grid};
use crate::ops::reduce::store_source;
use crate::wgsl;

const SOFTMAX: &str = include_str!("../../shaders/softmax.wgsl");

/// Softmax (or log-softmax when `log`) of `input` along `dim` into `out`.
/// With `causal`, row `r` (of the rows in row-major order of the other dimensions) is row
/// `r % L` of its `[L, S]` matrix and keeps its first `r % L + 1` elements.
pub(crate) fn softmax(
    backend: &WgpuBackend,
    input: &TensorArg,
    dim: usize,
    log: bool,
    causal: bool,
    out: &TensorArg,
) -> Result<()> {
    if out.layout.numel() == 0 {
        return Ok(());
    }
    let shape = input.layout.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let kept_in: Vec<usize> = kept.iter().map(|&d| input.layout.strides()[d]).collect();
    let kept_out: Vec<usize> = kept.iter().map(|&d| out.layout.strides()[d]).collect();
    let g = coalesce(&kept_shape, &[&kept_in, &kept_out]);
    if g.shape.len() > MAX_RANK {
        return Err(Error::invalid(
            "softmax",
            format!("more than {MAX_RANK} other dimensions after merging"),
        ));
    }
    let rows: usize = kept_shape.iter().product();
    let in_bound = bind_operand(&backend.ctx, &backend.table, input, "softmax", None)?;
    let out_bound = bind_operand(&backend.ctx, &backend.table, out, "softmax", None)?;
    let mut params = ParamBlock::default();
    params.put_sizes(
        0,
        &[
            rows,
            shape[dim],
            g.shape.len(),
            in_bound.element_offset as usize,
            out_bound.element_offset as usize,
            input.layout.strides()[dim],
            out.layout.strides()[dim],
            if causal { shape[shape.len() - 2] } else { 0 },
        ],
        "softmax size",
    )?;
    params.put_sizes(8, &g.shape, "dimension")?;
    params.put_sizes(16, &g.strides[0], "stride")?;
    params.put_sizes(24, &g.strides[1], "stride")?;
    let key = format!("softmax:{}|{}", if log { "log" } else { "exp" }, input.dtype);
    let pipeline = backend.pipelines.get(&backend.ctx, &key, 2, || {
        let out_element = if wgsl::packed(out.dtype) {
            "atomic<u32>"
        } else {
            wgsl::storage_type(out.dtype)
        };
        let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(input.dtype));
        bindings.push_str(&wgsl::binding(2, "b2", out_element));
        let mut accessors = wgsl::load_fn("load_x", "b1", input.dtype);
        accessors.push_str(&store_source(out.dtype));
        let output = if log {
            "let y = shifted - log_sum;"
        } else {
            "let y = exp(shifted) / row_sum;"
        };
        wgsl::fill(
            SOFTMAX,
            &[
                ("PRELUDE", &wgsl::prelude(false)),
                ("BINDINGS", &bindings),
                ("ACCESSORS", &accessors),
                ("OUTPUT", output),
            ],
        )
    })?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(
        &pipeline,
        &[in_bound.window, out_bound.window],
        &params,
        grid(rows as u64, 1, max_dim),
    )
}
