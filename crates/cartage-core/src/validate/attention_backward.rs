//! The structural rules of [`crate::Kernel::AttentionBackward`], in the terms of
//! [`crate::validate`]: the forward's shapes (q [B, L, E], k [B, S, E], v [B, S, Ev]) with the
//! incoming gradient [B, L, Ev], one float dtype, a finite scale, and three contiguous gradients
//! shaped like q, k and v, apart from every input and from each other. The optional saved
//! forward output is shaped like the incoming gradient (same dtype, any strides) and the saved
//! log-sum-exp is a contiguous f32 [B, L] (the forward's `lse` operand obeys the same rule). The
//! causal mask is top-left aligned as the forward's, so it is defined for every L and S. The
//! optional additive mask is `[outer, inner, L, S]` in q's dtype, `outer · inner = B`, any strides.
//! Every operand may carry two batch dimensions instead of one ([B1, B2, ..], B = B1·B2 for the
//! log-sum-exp and the mask), all alike.

use super::{aligned, apart, dtype_is, mismatch, same_dtype, writable};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::TensorArg;
use crate::kernel::{AttentionBackwardArgs, AttentionMask};

/// The log-sum-exp rows of attention: contiguous f32 [B, L], writable.
pub(super) fn lse_rows(op: &'static str, lse: &TensorArg, [b, l]: [usize; 2]) -> Result<()> {
    if lse.layout.shape() != [b, l] {
        return Err(Error::invalid(
            op,
            format!(
                "the log-sum-exp has one value per query row, [B, L] = {:?}; got {:?}",
                [b, l],
                lse.layout.shape()
            ),
        ));
    }
    dtype_is(op, lse, DType::F32, "the attention log-sum-exp is f32")?;
    if !lse.layout.is_contiguous() {
        return Err(Error::invalid(
            op,
            format!(
                "the log-sum-exp must be contiguous [B, L]; got strides {:?}",
                lse.layout.strides()
            ),
        ));
    }
    aligned(op, lse)?;
    writable(op, lse)
}

/// An attention mask over scores `[B, L, S]`: `[outer, inner, L, S]` with `outer · inner = B`, in
/// q's dtype, aligned (any strides).
pub(super) fn mask(op: &'static str, mask: &AttentionMask, q: &TensorArg, [b, l, s]: [usize; 3]) -> Result<()> {
    let values = &mask.values;
    let shape = values.layout.shape();
    let fits = shape.len() == 4 && shape[0].checked_mul(shape[1]) == Some(b) && shape[2..] == [l, s];
    if !fits {
        return Err(Error::invalid(
            op,
            format!(
                "the attention mask must be [outer, inner, L, S] with outer · inner = B over scores                  [B, L, S] = {:?}; got {shape:?}",
                [b, l, s]
            ),
        ));
    }
    same_dtype(op, q, values)?;
    aligned(op, values)
}

const NAME: &str = "attention_backward";

/// `AttentionBackward`: shapes, dtypes, scale, contiguous outputs, no aliasing.
pub(super) fn attention_backward(a: &AttentionBackwardArgs) -> Result<()> {
    let (q, k, v, grad) = (&a.q, &a.k, &a.v, &a.grad);
    let (grad_q, grad_k, grad_v) = (&a.grad_q, &a.grad_k, &a.grad_v);
    let (qs, ks, vs, gs) = (
        q.layout.shape(),
        k.layout.shape(),
        v.layout.shape(),
        grad.layout.shape(),
    );
    let r = qs.len();
    let ranks = (r == 3 || r == 4) && [ks, vs, gs].iter().all(|s| s.len() == r);
    if !ranks
        || ks[..r - 2] != qs[..r - 2]
        || vs[..r - 2] != qs[..r - 2]
        || ks[r - 1] != qs[r - 1]
        || vs[r - 2] != ks[r - 2]
    {
        return Err(mismatch(
            NAME,
            q,
            k,
            format!(
                "the attention backward takes the forward's q [B, L, E], k [B, S, E] and \
                 v [B, S, Ev] (or the same with two batch dimensions [B1, B2, ..]); the value is {vs:?}"
            ),
        ));
    }
    let out_shape: Vec<usize> = qs[..r - 1].iter().chain(&vs[r - 1..]).copied().collect();
    if gs != out_shape {
        return Err(mismatch(
            NAME,
            grad,
            q,
            format!("the incoming gradient must have the forward output's shape [B, L, Ev] = {out_shape:?}"),
        ));
    }
    let batch: usize = qs[..r - 2].iter().product();
    let (l, s) = (qs[r - 2], ks[r - 2]);
    if !a.scale.is_finite() {
        return Err(Error::invalid(
            NAME,
            format!("the scale must be finite, got {}", a.scale),
        ));
    }
    if !q.dtype.is_float() {
        return Err(Error::invalid(
            NAME,
            format!("the attention backward takes a float dtype, got {}", q.dtype),
        ));
    }
    let inputs = [q, k, v, grad];
    let outputs = [("grad_q", grad_q, q), ("grad_k", grad_k, k), ("grad_v", grad_v, v)];
    for input in &inputs[1..] {
        same_dtype(NAME, q, input)?;
    }
    for (name, out, like) in outputs {
        if out.layout.shape() != like.layout.shape() {
            return Err(mismatch(
                NAME,
                out,
                like,
                format!("{name} must have the shape of the operand it differentiates"),
            ));
        }
        same_dtype(NAME, like, out)?;
        if !out.layout.is_contiguous() {
            return Err(Error::invalid(
                NAME,
                format!(
                    "{name} must be contiguous {:?}; got strides {:?}",
                    out.layout.shape(),
                    out.layout.strides()
                ),
            ));
        }
        writable(NAME, out)?;
    }
    for arg in inputs.iter().chain(outputs.iter().map(|(_, out, _)| out)) {
        aligned(NAME, arg)?;
    }
    if let Some(saved) = &a.saved {
        if saved.out.layout.shape() != gs {
            return Err(mismatch(
                NAME,
                &saved.out,
                grad,
                "the saved forward output must have the incoming gradient's shape [B, L, Ev]",
            ));
        }
        same_dtype(NAME, q, &saved.out)?;
        aligned(NAME, &saved.out)?;
        lse_rows(NAME, &saved.lse, [batch, l])?;
    }
    if let Some(m) = &a.mask {
        mask(NAME, m, q, [batch, l, s])?;
    }
    let masks = a.mask.iter().map(|m| &m.values);
    let saved = a.saved.iter().flat_map(|s| [&s.out, &s.lse]).chain(masks);
    for (i, (_, out, _)) in outputs.iter().enumerate() {
        for input in inputs.into_iter().chain(saved.clone()) {
            apart(NAME, input, out)?;
        }
        for (_, other, _) in &outputs[i + 1..] {
            apart(NAME, other, out)?;
        }
    }
    Ok(())
}
