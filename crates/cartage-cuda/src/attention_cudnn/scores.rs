//! What the forward and backward graphs share: the unique ids of their tensors, the 4-D view of
//! cartage's operands (`[b, h, s, d]` with their real strides: `[B, L, E]` as `b = B`, `h = 1`,
//! or split as the mask splits the batch; `[B1, B2, L, E]` as `b = B1`, `h = B2`), and the
//! scores chain `scale · Q·Kᵀ` with the additive mask (cuDNN's bias, added to the scaled scores
//! as cudnn-frontend's `sdpa` does) and the causal mask.
//!
//! The mask is cudnn-frontend's top-left causal mask spelled out: the row index (axis 2) and the
//! column index (axis 3) of the score matrix (`GEN_INDEX`, int32), `row ≥ col` (`CMP_GE`,
//! boolean), and `BINARY_SELECT` keeping the score where it holds and the pass-by-value
//! [`NEG_INF`] scalar elsewhere. Top-left is cartage's alignment too (position `(i, j)` masked
//! when `j > i`, also when L ≠ S; `attention.cu`).

use cudarc::cudnn::sys;
use sys::cudnnDataType_t as T;
use sys::cudnnPointwiseMode_t as P;

use super::Key;
use crate::cudnn_graph::builder::{GraphBuilder, Inputs, Tensor, dense_strides};
use crate::cudnn_graph::descriptor::Outcome;

/// Queries `[b, h, L, E]`.
pub(super) const Q: i64 = 1;
/// Keys, described transposed as `Kᵀ [b, h, E, S]`.
pub(super) const K: i64 = 2;
/// Values `[b, h, S, Ev]` (`Vᵀ` in the backward).
pub(super) const V: i64 = 3;
/// The forward's output `[b, h, L, Ev]` (written by the forward, read by the backward).
pub(super) const O: i64 = 4;
/// The softmax statistics `[b, h, L, 1]` f32: cartage's `lse`.
pub(super) const STATS: i64 = 5;
/// The scale (pass-by-value f32).
pub(super) const SCALE: i64 = 6;
/// The masked scores' value (pass-by-value f32).
pub(super) const NEG_INF: i64 = 7;
/// The output gradient `[b, h, L, Ev]`.
pub(super) const D_O: i64 = 8;
/// The query gradient `[b, h, L, E]`.
pub(super) const D_Q: i64 = 9;
/// The key gradient `[b, h, S, E]`.
pub(super) const D_K: i64 = 10;
/// The value gradient `[b, h, S, Ev]`.
pub(super) const D_V: i64 = 11;
/// `Σ_d dO ∘ O` per query row `[b, h, L, 1]` f32, a real tensor in scratch memory.
pub(super) const SOFTMAX_SUM: i64 = 12;
/// The f32 accumulator of the query gradient `[b, h, L, E]`, a real tensor in scratch memory.
pub(super) const DQ_ACCUM: i64 = 13;
/// One (pass-by-value f32), the scale of `SOFTMAX_SUM` without dropout.
pub(super) const ONE: i64 = 14;
/// The additive mask as the bias `[b, h', L, S]` in the I/O dtype ([`super::Bias`]).
pub(super) const BIAS: i64 = 15;
/// The first unique id of the virtual tensors.
pub(super) const FIRST_VIRTUAL: i64 = 100;

/// cuDNN's storage type for `key`'s dtype (bf16 or f16; the key admits no other).
pub(super) fn io_type(key: &Key) -> T {
    match key.dtype {
        cartage_core::DType::F16 => T::CUDNN_DATA_HALF,
        _ => T::CUDNN_DATA_BFLOAT16,
    }
}

/// `[b, h, s, d]` strides of an operand with (b, h, row) strides `st` and a dense last dim.
pub(super) fn four(st: [i64; 3]) -> [i64; 4] {
    [st[0], st[1], st[2], 1]
}

/// The `[b, h, rows, 1]` strides of a dense per-row f32 tensor.
pub(super) fn row_strides(h: i64, rows: i64) -> [i64; 4] {
    [h * rows, rows, 1, 1]
}

/// The dims `[b, h, rows, width]` of `key`'s operands.
pub(super) fn dims(key: &Key, rows: usize, width: usize) -> [i64; 4] {
    [key.sizes[0], key.sizes[1], rows, width].map(|n| n as i64)
}

/// The operand tensors and scalars both graphs start from.
pub(super) struct Inputs3 {
    pub(super) q: Tensor,
    pub(super) kt: Tensor,
    pub(super) scale: Tensor,
    /// The masked scores' value, for a causal key only (an unused tensor stays out of the
    /// variant pack).
    pub(super) neg_inf: Option<Tensor>,
    /// The additive mask, for a key with one.
    pub(super) bias: Option<Tensor>,
}

/// Q, Kᵀ and the two scalars of `key`, as real and pass-by-value tensors.
pub(super) fn inputs(g: &mut GraphBuilder, key: &Key) -> Outcome<Inputs3> {
    let io = io_type(key);
    let [_, _, l, s, e, _] = key.sizes;
    let q = g.real(io, Q, dims(key, l, e), four(key.strides[0]), key.alignment[0])?;
    let k = four(key.strides[1]);
    let kt = g.real(io, K, dims(key, e, s), [k[0], k[1], k[3], k[2]], key.alignment[1])?;
    let scale = g.by_value(T::CUDNN_DATA_FLOAT, SCALE)?;
    let neg_inf = if key.causal {
        Some(g.by_value(T::CUDNN_DATA_FLOAT, NEG_INF)?)
    } else {
        None
    };
    let bias = match key.bias {
        Some(bias) => Some(g.real(io, BIAS, bias.dims, bias.strides, key.alignment[9])?),
        None => None,
    };
    Ok(Inputs3 {
        q,
        kt,
        scale,
        neg_inf,
        bias,
    })
}

/// A virtual f32 tensor of `like`'s dims and strides.
pub(super) fn f32_like(g: &mut GraphBuilder, like: Tensor) -> Outcome<Tensor> {
    g.virtual_tensor(T::CUDNN_DATA_FLOAT, like.dims, like.strides)
}

/// `y = mode(x, b)` into a fresh virtual f32 tensor of `x`'s dims, computed in f32.
pub(super) fn binary(g: &mut GraphBuilder, mode: P, x: Tensor, b: Tensor) -> Outcome<Tensor> {
    let y = f32_like(g, x)?;
    g.pointwise(mode, T::CUDNN_DATA_FLOAT, x, Inputs::Binary(b), y, None)?;
    Ok(y)
}

/// `y = mode(x)` into a fresh virtual f32 tensor of `x`'s dims, computed in f32.
pub(super) fn unary(g: &mut GraphBuilder, mode: P, x: Tensor) -> Outcome<Tensor> {
    let y = f32_like(g, x)?;
    g.pointwise(mode, T::CUDNN_DATA_FLOAT, x, Inputs::Unary, y, None)?;
    Ok(y)
}

/// `scale · Q·Kᵀ (+ bias)` `[b, h, L, S]` (f32, virtual).
pub(super) fn scaled_scores(g: &mut GraphBuilder, key: &Key, t: &Inputs3) -> Outcome<Tensor> {
    let [_, _, l, s, _, _] = key.sizes;
    let dims = dims(key, l, s);
    let scores = g.virtual_tensor(T::CUDNN_DATA_FLOAT, dims, dense_strides(dims))?;
    g.matmul(t.q, t.kt, scores)?;
    let scaled = binary(g, P::CUDNN_POINTWISE_MUL, scores, t.scale)?;
    match t.bias {
        Some(bias) => binary(g, P::CUDNN_POINTWISE_ADD, scaled, bias),
        None => Ok(scaled),
    }
}

/// `x` with the positions `(i, j)`, `j > i`, replaced by the `neg_inf` scalar (top-left causal)
/// when there is one (a causal key), else `x`.
pub(super) fn causal_mask(g: &mut GraphBuilder, x: Tensor, neg_inf: Option<Tensor>) -> Outcome<Tensor> {
    let Some(neg_inf) = neg_inf else {
        return Ok(x);
    };
    let row = g.virtual_tensor(T::CUDNN_DATA_INT32, x.dims, x.strides)?;
    g.pointwise(
        P::CUDNN_POINTWISE_GEN_INDEX,
        T::CUDNN_DATA_FLOAT,
        x,
        Inputs::Unary,
        row,
        Some(2),
    )?;
    let col = g.virtual_tensor(T::CUDNN_DATA_INT32, x.dims, x.strides)?;
    g.pointwise(
        P::CUDNN_POINTWISE_GEN_INDEX,
        T::CUDNN_DATA_FLOAT,
        x,
        Inputs::Unary,
        col,
        Some(3),
    )?;
    let keep = g.virtual_tensor(T::CUDNN_DATA_BOOLEAN, x.dims, x.strides)?;
    g.pointwise(
        P::CUDNN_POINTWISE_CMP_GE,
        T::CUDNN_DATA_BOOLEAN,
        row,
        Inputs::Binary(col),
        keep,
        None,
    )?;
    let y = f32_like(g, x)?;
    g.pointwise(
        P::CUDNN_POINTWISE_BINARY_SELECT,
        T::CUDNN_DATA_FLOAT,
        x,
        Inputs::Ternary(neg_inf, keep),
        y,
        None,
    )?;
    Ok(y)
}
