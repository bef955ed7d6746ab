//! The operand checks the fused attention kernels share (`attention.rs`, `attention_f32.rs` and
//! their tiled backward passes): each tile is copied with 16-byte `cp.async`, so every operand
//! needs a dense last dimension, batch and row strides that keep rows on 16 bytes, and a start
//! on 16 bytes. Operands come as `[B, rows, width]` or with two batch dimensions
//! `[B1, B2, rows, width]` (`Kernel::Attention`'s contract); the kernels take both through
//! [`BatchStrides`]: batch entry `b` of the merged batch starts at `b / B2 · outer + b % B2 ·
//! inner`.

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{Error, TensorArg};

use super::device_ptr;

/// The strides (in elements) the kernels read an operand with: batch entry `b` of the merged
/// batch at `b / heads · outer + b % heads · inner`, its rows `row` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BatchStrides {
    pub(super) outer: i64,
    pub(super) inner: i64,
    pub(super) row: i64,
}

impl BatchStrides {
    /// The strides of `arg`, `[B, rows, width]` (inner 0) or `[B1, B2, rows, width]`.
    pub(super) fn of(arg: &TensorArg) -> BatchStrides {
        let st = arg.layout.strides();
        match *st {
            [outer, inner, row, _] => BatchStrides {
                outer: outer as i64,
                inner: inner as i64,
                row: row as i64,
            },
            _ => BatchStrides {
                outer: st[0] as i64,
                inner: 0,
                row: st[1] as i64,
            },
        }
    }
}

/// `(B, rows, width)` of `arg`, the batch dimensions merged.
pub(crate) fn dims(arg: &TensorArg) -> (usize, usize, usize) {
    let shape = arg.layout.shape();
    let r = shape.len();
    (shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1])
}

/// B2, the inner batch dimension of `arg` (1 for `[B, rows, width]`, at least 1).
pub(super) fn heads(arg: &TensorArg) -> u32 {
    let shape = arg.layout.shape();
    if shape.len() == 4 { shape[1].max(1) as u32 } else { 1 }
}

/// Whether `arg` (`[batch.., rows, dim]`) has a dense last dimension, rows and batch entries on
/// 16 bytes, and a 16-byte aligned start.
pub(super) fn rows_on_16(arg: &TensorArg) -> bool {
    let st = arg.layout.strides();
    let per_16 = (16 / arg.dtype.size_in_bytes()).max(1);
    let r = st.len();
    (r == 3 || r == 4)
        && st[r - 1] == 1
        && st[..r - 1].iter().all(|x| x.is_multiple_of(per_16))
        && device_ptr(arg).is_multiple_of(16)
}

/// `Ok` when q, k, v (read) and out (written) suit a forward kernel, else the refusal naming the
/// operand, built by `refuse` from the reason (`kernel` names the kernel in the message).
pub(super) fn forward_operands(
    kernel: &str,
    [q, k, v]: [&TensorArg; 3],
    out: &TensorArg,
    refuse: impl Fn(String) -> Error,
) -> Result<(), Error> {
    for (name, arg) in [("q", q), ("k", k), ("v", v)] {
        if !rows_on_16(arg) {
            return Err(refuse(format!(
                "the {kernel} reads {name} with a dense last dimension and rows on 16 bytes; \
                 {name} has strides {:?} at byte offset {}",
                arg.layout.strides(),
                arg.byte_offset()
            )));
        }
    }
    if !rows_on_16(out) {
        return Err(refuse(format!(
            "the {kernel} writes an output with a dense last dimension, rows on 16 bytes and a start \
             on 16 bytes; it has strides {:?} at byte offset {}",
            out.layout.strides(),
            out.byte_offset()
        )));
    }
    Ok(())
}

/// The saved forward values when a tiled backward can take `a`'s operands: q, k, v, the incoming
/// gradient and the saved output as [`rows_on_16`], the three gradients starting on 16 bytes,
/// and a scale that stays finite in f32 once multiplied by log2(e).
pub(super) fn backward_operands(a: &AttentionBackwardArgs) -> Option<&AttentionSaved> {
    let saved = a.saved.as_ref()?;
    let read = [&a.q, &a.k, &a.v, &a.grad, &saved.out].into_iter().all(rows_on_16);
    let written = [&a.grad_q, &a.grad_k, &a.grad_v]
        .into_iter()
        .all(|arg| device_ptr(arg).is_multiple_of(16));
    let scale_fits = ((a.scale * std::f64::consts::LOG2_E) as f32).is_finite();
    (read && written && scale_fits).then_some(saved)
}
