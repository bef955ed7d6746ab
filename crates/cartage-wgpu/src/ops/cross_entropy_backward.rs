//! The logits gradient of per-row cross-entropy (`shaders/cross_entropy_backward.wgsl`): one
//! workgroup per row computes the row's maximum and the sum of `exp(x - max)` in f32, then
//! `g·(softmax − (1 − s)·onehot(t) − s/C)`, every operand read or written in place through its
//! strides. Each target is loaded once and checked before it is used; one outside `[0, C)` other
//! than `ignore_index` sets the op's slot of the index-check flags, returned as
//! [`cartage_core::Error::IndexOutOfRange`] at the next synchronisation (as in the forward).

use cartage_core::{DType, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::{grid, word};
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

const CROSS_ENTROPY_BACKWARD: &str = include_str!("../../shaders/cross_entropy_backward.wgsl");
const INDEX: &str = include_str!("../../shaders/index.wgsl");

/// `out[n] = grad[n]·(softmax(logits[n]) − (1 − s)·onehot(target[n]) − s/C)`, zero where the
/// target is `ignore_index`.
pub(crate) fn cross_entropy_backward(
    backend: &WgpuBackend,
    logits: &TensorArg,
    target: &TensorArg,
    grad: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let name = "cross_entropy_backward";
    let shape = logits.layout.shape();
    let (classes, ls, os) = (shape[1], logits.layout.strides(), out.layout.strides());
    let rows = Rows::new(
        name,
        shape,
        1,
        &[ls, os, &[target.layout.strides()[0], 0], &[grad.layout.strides()[0], 0]],
    )?;
    if rows.rows == 0 {
        return Ok(());
    }
    let bound = [
        bind_operand(&backend.ctx, &backend.table, logits, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
        bind_operand(&backend.ctx, &backend.table, target, name, None)?,
        bind_operand(&backend.ctx, &backend.table, grad, name, None)?,
    ];
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    let ignore = ignore_index as u64;
    params.put(
        EXTRA,
        &[
            word(ls[1], "stride")?,
            word(os[1], "stride")?,
            ignore as u32,
            (ignore >> 32) as u32,
        ],
    );
    params.put(EXTRA + 4, &[(label_smoothing as f32).to_bits()]);
    let (dtype, index_dtype) = (logits.dtype, target.dtype);
    let key = format!("{name}|{dtype}|{index_dtype}");
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, 5, || source(dtype, index_dtype))?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    // Reserve the flag slot and record under one lock (see `index.rs`).
    let mut checks = backend.index_checks.lock().unwrap_or_else(|p| p.into_inner());
    let (slot, flags) = checks.reserve(backend, name, 1, classes)?;
    params.put(EXTRA + 5, &[slot]);
    let windows = [
        bound[0].window,
        bound[1].window,
        bound[2].window,
        bound[3].window,
        flags,
    ];
    let result = backend.record(&pipeline, &windows, &params, grid(rows.rows as u64, 1, max_dim));
    drop(checks);
    result
}

fn source(dtype: DType, index: DType) -> Result<String> {
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    bindings.push_str(&wgsl::binding(3, "b3", wgsl::storage_type(index)));
    bindings.push_str(&wgsl::binding(4, "b4", wgsl::storage_type(dtype)));
    bindings.push_str(&wgsl::binding(5, "flags", "atomic<u32>"));
    let mut accessors = wgsl::load_fn("ld_x", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    accessors.push_str(&wgsl::load_fn("ld_t", "b3", index));
    accessors.push_str(&wgsl::load_fn("ld_grad", "b4", dtype));
    let pair = match index {
        DType::I64 => "raw",
        _ => "vec2<u32>(bitcast<u32>(raw), select(0u, 0xffffffffu, raw < 0))",
    };
    wgsl::Pieces::parse("shaders/cross_entropy_backward.wgsl", CROSS_ENTROPY_BACKWARD).fill_head(&[
        ("PRELUDE", &wgsl::prelude(false)),
        ("ROWS", ROWS),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("INDEX", INDEX),
        ("PAIR", pair),
    ])
}
