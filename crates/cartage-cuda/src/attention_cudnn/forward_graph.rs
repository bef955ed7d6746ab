//! The forward graph cuDNN matches as its fused flash attention (the graph cudnn-frontend's
//! `sdpa` lowers to, without dropout or padding):
//!
//! 1. `S = Q·Kᵀ` (matmul, f32 virtual `[b, h, L, S]`), `S ← S · scale` (pointwise MUL by a
//!    pass-by-value f32), `S ← S + bias` for an additive mask, the causal mask when asked
//!    (`scores`);
//! 2. softmax with statistics: `m = max_j S` (reduction MAX to `[b, h, L, 1]`), `E = exp(S − m)`
//!    (SUB, EXP), `Σ = Σ_j E` (reduction ADD), `stats = m + ln Σ` (LOG, ADD; the real `STATS`
//!    tensor: cartage's natural log-sum-exp `lse` of the scaled, masked scores, `[B, L]` f32),
//!    `P = E / Σ` (DIV, virtual in the I/O dtype: the engine's second product takes it so);
//! 3. `O = P·V` (matmul into the real output).

use cudarc::cudnn::sys;
use sys::cudnnDataType_t as T;
use sys::cudnnPointwiseMode_t as P;
use sys::cudnnReduceTensorOp_t as R;

use super::Key;
use super::scores::{self, O, STATS, V, binary, causal_mask, dims, four, io_type, row_strides, unary};
use crate::cudnn_graph::builder::{GraphBuilder, OpGraph};
use crate::cudnn_graph::descriptor::Outcome;

/// Build and finalize the forward graph of `key` on `handle`.
pub(super) fn build(handle: sys::cudnnHandle_t, key: &Key) -> Outcome<OpGraph> {
    let mut g = GraphBuilder::new(scores::FIRST_VIRTUAL);
    let io = io_type(key);
    let [_, _, l, s, _, ev] = key.sizes;
    let t = scores::inputs(&mut g, key)?;
    let v = g.real(io, V, dims(key, s, ev), four(key.strides[2]), key.alignment[2])?;
    let o = g.real(io, O, dims(key, l, ev), four(key.strides[3]), key.alignment[3])?;
    let rows = dims(key, l, 1);
    let row_st = row_strides(rows[1], rows[2]);
    let stats = g.real(T::CUDNN_DATA_FLOAT, STATS, rows, row_st, key.alignment[4])?;

    let x = scores::scaled_scores(&mut g, key, &t)?;
    let x = causal_mask(&mut g, x, t.neg_inf)?;
    let max = g.virtual_tensor(T::CUDNN_DATA_FLOAT, rows, row_st)?;
    g.reduction(R::CUDNN_REDUCE_TENSOR_MAX, x, max)?;
    let shifted = binary(&mut g, P::CUDNN_POINTWISE_SUB, x, max)?;
    let exp = unary(&mut g, P::CUDNN_POINTWISE_EXP, shifted)?;
    let sum = g.virtual_tensor(T::CUDNN_DATA_FLOAT, rows, row_st)?;
    g.reduction(R::CUDNN_REDUCE_TENSOR_ADD, exp, sum)?;
    let log = unary(&mut g, P::CUDNN_POINTWISE_LOG, sum)?;
    g.pointwise(
        P::CUDNN_POINTWISE_ADD,
        T::CUDNN_DATA_FLOAT,
        max,
        crate::cudnn_graph::builder::Inputs::Binary(log),
        stats,
        None,
    )?;
    let probs = g.virtual_tensor(io, exp.dims, exp.strides)?;
    g.pointwise(
        P::CUDNN_POINTWISE_DIV,
        T::CUDNN_DATA_FLOAT,
        exp,
        crate::cudnn_graph::builder::Inputs::Binary(sum),
        probs,
        None,
    )?;
    g.matmul(probs, v, o)?;
    g.finalize(handle)
}
