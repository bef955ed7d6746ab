//! What the forward and backward graphs share: the unique ids of their tensors, the 4-D view of
//! cartage's `[B, L, E]` operands (`[b, h, s, d]` with `b = B`, `h = 1`, their real strides),
//! and the scores chain `scale · Q·Kᵀ` with its causal mask.
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
use crate::cudnn_graph::builder::{GraphBuilder, Inputs, Tensor};
use crate::cudnn_graph::descriptor::Outcome;

/// Queries `[B, 1, L, E]`.
pub(super) const Q: i64 = 1;
/// Keys, described transposed as `Kᵀ [B, 1, E, S]`.
pub(super) const K: i64 = 2;
/// Values `[B, 1, S, Ev]` (`Vᵀ` in the backward).
pub(super) const V: i64 = 3;
/// The forward's output `[B, 1, L, Ev]` (written by the forward, read by the backward).
pub(super) const O: i64 = 4;
/// The softmax statistics `[B, 1, L, 1]` f32: cartage's `lse`.
pub(super) const STATS: i64 = 5;
/// The scale (pass-by-value f32).
pub(super) const SCALE: i64 = 6;
/// The masked scores' value (pass-by-value f32).
pub(super) const NEG_INF: i64 = 7;
/// The output gradient `[B, 1, L, Ev]`.
pub(super) const D_O: i64 = 8;
/// The query gradient `[B, 1, L, E]`.
pub(super) const D_Q: i64 = 9;
/// The key gradient `[B, 1, S, E]`.
pub(super) const D_K: i64 = 10;
/// The value gradient `[B, 1, S, Ev]`.
pub(super) const D_V: i64 = 11;
/// `Σ_d dO ∘ O` per query row `[B, 1, L, 1]` f32, a real tensor in scratch memory.
pub(super) const SOFTMAX_SUM: i64 = 12;
/// The f32 accumulator of the query gradient `[B, 1, L, E]`, a real tensor in scratch memory.
pub(super) const DQ_ACCUM: i64 = 13;
/// One (pass-by-value f32), the scale of `SOFTMAX_SUM` without dropout.
pub(super) const ONE: i64 = 14;
/// The first unique id of the virtual tensors.
pub(super) const FIRST_VIRTUAL: i64 = 100;

/// cuDNN's storage type for `key`'s dtype (bf16 or f16; the key admits no other).
pub(super) fn io_type(key: &Key) -> T {
    match key.dtype {
        cartage_core::DType::F16 => T::CUDNN_DATA_HALF,
        _ => T::CUDNN_DATA_BFLOAT16,
    }
}

/// `[b, h, s, d]` strides of an operand of `rows` rows with (batch, row) strides `bs` (h = 1:
/// its stride is the batch stride).
pub(super) fn four(bs: [i64; 2]) -> [i64; 4] {
    [bs[0], bs[0], bs[1], 1]
}

/// The `[B, 1, rows, 1]` strides of a per-row f32 tensor.
pub(super) fn row_strides(rows: i64) -> [i64; 4] {
    [rows, rows, 1, 1]
}

/// The operand tensors and scalars both graphs start from.
pub(super) struct Inputs3 {
    pub(super) q: Tensor,
    pub(super) kt: Tensor,
    pub(super) scale: Tensor,
    /// The masked scores' value, for a causal key only (an unused tensor stays out of the
    /// variant pack).
    pub(super) neg_inf: Option<Tensor>,
}

/// Q, Kᵀ and the two scalars of `key`, as real and pass-by-value tensors.
pub(super) fn inputs(g: &mut GraphBuilder, key: &Key) -> Outcome<Inputs3> {
    let io = io_type(key);
    let [b, l, s, e, _] = key.sizes.map(|n| n as i64);
    let q = g.real(io, Q, [b, 1, l, e], four(key.strides[0]), key.alignment[0])?;
    let k = four(key.strides[1]);
    let kt = g.real(io, K, [b, 1, e, s], [k[0], k[1], k[3], k[2]], key.alignment[1])?;
    let scale = g.by_value(T::CUDNN_DATA_FLOAT, SCALE)?;
    let neg_inf = if key.causal {
        Some(g.by_value(T::CUDNN_DATA_FLOAT, NEG_INF)?)
    } else {
        None
    };
    Ok(Inputs3 { q, kt, scale, neg_inf })
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

/// `scale · Q·Kᵀ` `[B, 1, L, S]` (f32, virtual).
pub(super) fn scaled_scores(g: &mut GraphBuilder, key: &Key, t: &Inputs3) -> Outcome<Tensor> {
    let [b, l, s, _, _] = key.sizes.map(|n| n as i64);
    let scores = g.virtual_tensor(T::CUDNN_DATA_FLOAT, [b, 1, l, s], [l * s, l * s, s, 1])?;
    g.matmul(t.q, t.kt, scores)?;
    binary(g, P::CUDNN_POINTWISE_MUL, scores, t.scale)
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
