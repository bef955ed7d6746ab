//! The backward graph cuDNN matches as its fused flash attention backward (the graph
//! cudnn-frontend's `sdpa_backward` lowers to, without dropout, padding or a bias gradient), from Q, K, V,
//! the forward's output O, the output gradient dO and the forward's statistics (cartage's `lse`):
//!
//! 1. `D = Σ_d dO ∘ O` per query row (pointwise MUL, reduction ADD), times one (pointwise MUL
//!    by a pass-by-value 1, the dropout scale's place) into the real f32 `SOFTMAX_SUM` tensor,
//!    which lives in scratch memory;
//! 2. `P = exp(scale · Q·Kᵀ + bias − stats)` (matmul, MUL, ADD for an additive mask, SUB, the
//!    causal mask, EXP): the probabilities recomputed from the saved statistics;
//! 3. `dV = Pᵀ·dO` (P reshaped to `[b, h, S, L]` in the I/O dtype, matmul);
//! 4. `dP = dO·Vᵀ`, `dS = scale · P ∘ (dP − D)` (matmul, SUB, MUL, MUL);
//! 5. `dK = dSᵀ·Q` (dS reshaped, matmul); `dQ = dS·K` accumulated in the real f32 `DQ_ACCUM`
//!    tensor (scratch memory, zeroed first before cuDNN 9.6) and converted (IDENTITY) into dQ.

use cudarc::cudnn::sys;
use sys::cudnnDataType_t as T;
use sys::cudnnPointwiseMode_t as P;
use sys::cudnnReduceTensorOp_t as R;

use super::Key;
use super::scores::{
    self, D_K, D_O, D_Q, D_V, DQ_ACCUM, O, ONE, SOFTMAX_SUM, STATS, V, binary, causal_mask, dims, four, io_type,
    row_strides, unary,
};
use crate::cudnn_graph::builder::{ALIGNMENT, GraphBuilder, Inputs, OpGraph, dense_strides};
use crate::cudnn_graph::descriptor::Outcome;

/// Bytes of the scratch tensors the backward graph binds besides the operands: `SOFTMAX_SUM`
/// (`[b, h, L]` f32) and `DQ_ACCUM` (`[b, h, L, E]` f32), as `(unique id, bytes)`.
pub(super) fn scratch(key: &Key) -> [(i64, usize); 2] {
    let [b, h, l, _, e, _] = key.sizes;
    [(SOFTMAX_SUM, b * h * l * 4), (DQ_ACCUM, b * h * l * e * 4)]
}

/// Build and finalize the backward graph of `key` on `handle`.
pub(super) fn build(handle: sys::cudnnHandle_t, key: &Key) -> Outcome<OpGraph> {
    let mut g = GraphBuilder::new(scores::FIRST_VIRTUAL);
    let io = io_type(key);
    let [_, _, l, s, e, ev] = key.sizes;
    let a = key.alignment;
    let t = scores::inputs(&mut g, key)?;
    let v = four(key.strides[2]);
    let vt = g.real(io, V, dims(key, ev, s), [v[0], v[1], v[3], v[2]], a[2])?;
    let o = g.real(io, O, dims(key, l, ev), four(key.strides[3]), a[3])?;
    let d_o = g.real(io, D_O, dims(key, l, ev), four(key.strides[4]), a[4])?;
    let rows = dims(key, l, 1);
    let row_st = row_strides(rows[1], rows[2]);
    let stats = g.real(T::CUDNN_DATA_FLOAT, STATS, rows, row_st, a[5])?;
    let dense = |dims: [i64; 4]| (dims, dense_strides(dims));
    let (dq_dims, dq_strides) = dense(dims(key, l, e));
    let dq = g.real(io, D_Q, dq_dims, dq_strides, a[6])?;
    let (dk_dims, dk_strides) = dense(dims(key, s, e));
    let dk = g.real(io, D_K, dk_dims, dk_strides, a[7])?;
    let (dv_dims, dv_strides) = dense(dims(key, s, ev));
    let dv = g.real(io, D_V, dv_dims, dv_strides, a[8])?;
    let one = g.by_value(T::CUDNN_DATA_FLOAT, ONE)?;
    let softmax_sum = g.real(T::CUDNN_DATA_FLOAT, SOFTMAX_SUM, rows, row_st, ALIGNMENT)?;
    let dq_accum = g.real(T::CUDNN_DATA_FLOAT, DQ_ACCUM, dq_dims, dq_strides, ALIGNMENT)?;

    // D = rowsum(dO ∘ O) · 1.
    let prod_dims = dims(key, l, ev);
    let prod = g.virtual_tensor(T::CUDNN_DATA_FLOAT, prod_dims, dense_strides(prod_dims))?;
    g.pointwise(
        P::CUDNN_POINTWISE_MUL,
        T::CUDNN_DATA_FLOAT,
        d_o,
        Inputs::Binary(o),
        prod,
        None,
    )?;
    let row_sum = g.virtual_tensor(T::CUDNN_DATA_FLOAT, rows, row_st)?;
    g.reduction(R::CUDNN_REDUCE_TENSOR_ADD, prod, row_sum)?;
    g.pointwise(
        P::CUDNN_POINTWISE_MUL,
        T::CUDNN_DATA_FLOAT,
        row_sum,
        Inputs::Binary(one),
        softmax_sum,
        None,
    )?;

    // P = exp(scale · Q·Kᵀ + bias − stats), causally masked.
    let scaled = scores::scaled_scores(&mut g, key, &t)?;
    let x = binary(&mut g, P::CUDNN_POINTWISE_SUB, scaled, stats)?;
    let x = causal_mask(&mut g, x, t.neg_inf)?;
    let p = unary(&mut g, P::CUDNN_POINTWISE_EXP, x)?;

    // dV = Pᵀ·dO.
    let [b, h, l, s] = dims(key, l, s);
    let transposed = [h * l * s, l * s, 1, s];
    let pt = g.virtual_tensor(io, [b, h, s, l], transposed)?;
    g.reshape(p, pt)?;
    g.matmul(pt, d_o, dv)?;

    // dS = scale · P ∘ (dO·Vᵀ − D).
    let dp = g.virtual_tensor(T::CUDNN_DATA_FLOAT, [b, h, l, s], dense_strides([b, h, l, s]))?;
    g.matmul(d_o, vt, dp)?;
    let centered = binary(&mut g, P::CUDNN_POINTWISE_SUB, dp, softmax_sum)?;
    let ds_unscaled = binary(&mut g, P::CUDNN_POINTWISE_MUL, centered, p)?;
    let ds = binary(&mut g, P::CUDNN_POINTWISE_MUL, ds_unscaled, t.scale)?;

    // dK = dSᵀ·Q.
    let dst = g.virtual_tensor(io, [b, h, s, l], transposed)?;
    g.reshape(ds, dst)?;
    g.matmul(dst, t.q, dk)?;

    // dQ = dS·K through the f32 accumulator.
    let k = four(key.strides[1]);
    let k_rows = g.virtual_tensor(io, [b, h, s, e as i64], k)?;
    g.reshape(t.kt, k_rows)?;
    g.matmul(ds, k_rows, dq_accum)?;
    g.pointwise(
        P::CUDNN_POINTWISE_IDENTITY,
        T::CUDNN_DATA_FLOAT,
        dq_accum,
        Inputs::Unary,
        dq,
        None,
    )?;
    g.finalize(handle)
}
