//! The gradients of layer norm and RMS norm (`shaders/norm_backward.wgsl`): a workgroup per row
//! at a time, the statistics recomputed as the forward computes them, then workgroup sums of `ĝ`
//! and `ĝ·x̂`, in f32 (f64 for f64); every operand read or written in place through its strides.
//!
//! With only the input gradient wanted, there is one workgroup per row. With the weight or bias
//! gradient wanted too, a fixed number of workgroups ([`units`], from the shape alone) share the
//! rows, each adding its rows' `g·x̂` and `g` into its own row of a partials buffer from the
//! caching allocator; a second pass (`shaders/norm_reduce.wgsl`) sums those rows per column, in
//! order, into each gradient. So the gradients do not depend on scheduling.

use cartage_core::{Backend, DType, NormBackwardArgs, NormKind, Result, Scalar, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::grid;
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

const NORM_BACKWARD: &str = include_str!("../../shaders/norm_backward.wgsl");
const NORM_REDUCE: &str = include_str!("../../shaders/norm_reduce.wgsl");

/// The most workgroups sharing the rows when the parameter gradients are wanted.
const MAX_UNITS: usize = 512;

/// The most partial sums kept per gradient (16 MiB of f32).
const MAX_PARTIALS: usize = 1 << 22;

/// The workgroups that share `rows` rows of `len` when the parameter gradients are wanted: at
/// most one per row, [`MAX_UNITS`], and [`MAX_PARTIALS`] partial sums per gradient.
fn units(rows: usize, len: usize) -> usize {
    rows.min(MAX_UNITS).min(MAX_PARTIALS / len.max(1)).max(1)
}

/// The gradients of `norm(input) * weight (+ bias)` over the last dimension, from `grad`.
pub(crate) fn norm_backward(backend: &WgpuBackend, a: &NormBackwardArgs) -> Result<()> {
    let name = match a.kind {
        NormKind::Layer => "layer_norm_backward",
        NormKind::Rms => "rms_norm_backward",
    };
    let (input, grad, out) = (&a.input, &a.grad, &a.grad_input);
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
    if rows.len == 0 {
        return Ok(());
    }
    let columns: Vec<&TensorArg> = a.grad_weight.iter().chain(&a.grad_bias).collect();
    if rows.rows == 0 {
        // No rows: the parameter gradients are sums of nothing.
        for column in columns {
            fill_zero(backend, column)?;
        }
        return Ok(());
    }
    let ctx = &backend.ctx;
    let mut bound = vec![
        bind_operand(ctx, &backend.table, input, name, None)?,
        bind_operand(ctx, &backend.table, out, name, None)?,
        bind_operand(ctx, &backend.table, grad, name, None)?,
    ];
    let mut steps = vec![
        input.layout.strides()[last],
        out.layout.strides()[last],
        grad.layout.strides()[last],
        0,
    ];
    if let Some(w) = &a.weight {
        bound.push(bind_operand(ctx, &backend.table, w, name, None)?);
        steps[3] = w.layout.strides()[0];
    }
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    params.put_sizes(EXTRA, &steps, "stride")?;
    let hi = a.eps as f32;
    let lo = (a.eps - f64::from(hi)) as f32;
    params.put(EXTRA + 4, &[hi.to_bits(), lo.to_bits()]);
    let mut windows: Vec<Window> = bound.iter().map(|b| b.window).collect();
    let dtype = input.dtype;
    let spec = Spec {
        kind: a.kind,
        dtype,
        weight: a.weight.is_some(),
        grad_weight: a.grad_weight.is_some(),
        grad_bias: a.grad_bias.is_some(),
    };
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    if columns.is_empty() {
        params.put_sizes(EXTRA + 6, &[rows.rows], "row count")?;
        let pipeline = backend
            .pipelines
            .try_get(ctx, &spec.key(name), windows.len(), || spec.source())?;
        return backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim));
    }
    let units = units(rows.rows, rows.len);
    let per = units * rows.len;
    let part_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let scratch = backend.scratch(per * columns.len() * part_dtype.size_in_bytes())?;
    let slice = scratch.slice();
    windows.push(Window {
        segment: slice.segment().id,
        offset: slice.offset() as u64,
        size: (slice.len() as u64).div_ceil(16) * 16,
    });
    // The weight's partials first, then the bias's.
    let bias_at = if a.grad_weight.is_some() { per } else { 0 };
    params.put_sizes(EXTRA + 6, &[units, 0, bias_at], "partial sums")?;
    let result = (|| {
        let pipeline = backend
            .pipelines
            .try_get(ctx, &spec.key(name), windows.len(), || spec.source())?;
        backend.record(&pipeline, &windows, &params, grid(units as u64, 1, max_dim))?;
        let part = windows[windows.len() - 1];
        let sums = a
            .grad_weight
            .iter()
            .map(|c| (c, 0))
            .chain(a.grad_bias.iter().map(|c| (c, bias_at)));
        for (column, at) in sums {
            reduce(backend, name, part, at, units, column)?;
        }
        Ok(())
    })();
    backend.free(scratch);
    result
}

/// The specialisation of the row pass.
struct Spec {
    kind: NormKind,
    dtype: DType,
    weight: bool,
    grad_weight: bool,
    grad_bias: bool,
}

impl Spec {
    fn key(&self, name: &str) -> String {
        format!(
            "{name}|{}|{}{}{}",
            self.dtype,
            u8::from(self.weight),
            u8::from(self.grad_weight),
            u8::from(self.grad_bias)
        )
    }

    fn source(&self) -> Result<String> {
        let dtype = self.dtype;
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
        let mut next = 4;
        let ghat = if self.weight {
            bindings.push_str(&wgsl::binding(next, "b4", wgsl::storage_type(dtype)));
            accessors.push_str(&wgsl::load_fn("ld_w", "b4", dtype));
            next += 1;
            "ld_g(b.z + j * step.z) * ld_w(P.offs.w + j * step.w)"
        } else {
            "ld_g(b.z + j * step.z)"
        };
        let pieces = wgsl::Pieces::parse("shaders/norm_backward.wgsl", NORM_BACKWARD);
        let mut partials = String::new();
        if self.grad_weight || self.grad_bias {
            bindings.push_str(&wgsl::binding(next, "part", t));
            partials.push_str(&pieces.fill("partials_head", &[])?);
            if self.grad_weight {
                partials.push_str("\n            ");
                partials.push_str(&pieces.fill("weight_partial", &[])?);
            }
            if self.grad_bias {
                partials.push_str("\n            ");
                partials.push_str(&pieces.fill("bias_partial", &[])?);
            }
        }
        let eps = if f64 {
            "f64(bitcast<f32>(P.x[1].x)) + f64(bitcast<f32>(P.x[1].y))"
        } else {
            "bitcast<f32>(P.x[1].x)"
        };
        let (zero, one) = if f64 { ("0.0lf", "1.0lf") } else { ("0.0", "1.0") };
        let (stats, mean_g) = match self.kind {
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
            ("PARTIALS", &partials),
        ])
    }
}

/// Sum `units` rows of `len` partial sums starting at element `at` of `part` into `column`, per
/// column in row order, rounded once.
fn reduce(
    backend: &WgpuBackend,
    name: &'static str,
    part: Window,
    at: usize,
    units: usize,
    column: &TensorArg,
) -> Result<()> {
    let len = column.layout.shape()[0];
    let dtype = column.dtype;
    let out = bind_operand(&backend.ctx, &backend.table, column, name, None)?;
    let mut params = ParamBlock::default();
    params.put_sizes(0, &[0, len], "row length")?;
    params.put_sizes(4, &[0, out.element_offset as usize], "element offset")?;
    params.put_sizes(EXTRA, &[units, at, column.layout.strides()[0]], "partial sums")?;
    let key = format!("norm_backward_reduce|{dtype}");
    let pipeline = backend.pipelines.try_get(&backend.ctx, &key, 2, || {
        let f64 = dtype == DType::F64;
        let t = wgsl::compute_type(dtype);
        let out_element = if wgsl::packed(dtype) {
            "atomic<u32>"
        } else {
            wgsl::storage_type(dtype)
        };
        let mut bindings = wgsl::binding(1, "part", t);
        bindings.push_str(&wgsl::binding(2, "b2", out_element));
        let pieces = wgsl::Pieces::parse("shaders/norm_reduce.wgsl", NORM_REDUCE);
        pieces.fill_head(&[
            ("PRELUDE", &wgsl::prelude(f64)),
            ("ROWS", ROWS),
            ("BINDINGS", &bindings),
            ("ACCESSORS", &store_source(dtype)),
            ("T", t),
            ("ZERO", if f64 { "0.0lf" } else { "0.0" }),
        ])
    })?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &[part, out.window], &params, grid(len as u64, 256, max_dim))
}

/// Write 0 into every element of `column` (a gradient summed over no rows).
fn fill_zero(backend: &WgpuBackend, column: &TensorArg) -> Result<()> {
    crate::ops::elementwise::fill(backend, column, Scalar::Float(0.0))
}
