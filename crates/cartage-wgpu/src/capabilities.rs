//! What runs on a wgpu adapter, and why the rest does not (LESSONS R26).
//!
//! - f32, f16, bf16, i32, u8, bool: every op defined for them. f16 and bf16 are stored two to a
//!   word and computed in f32 (rounded once on store) on every adapter: SHADER_F16 is not needed.
//!   Where the adapter has it, f16 element-wise kernels and matmul tiles load four values at a
//!   time as `vec4<f16>`, and f16 matmuls run on cooperative matrices (f32 accumulators) where
//!   the adapter has those; without it the same kernels unpack packed words, with the same bits.
//! - f64: only with `SHADER_F64`, and not the transcendental unary functions
//!   ([`UnaryOp::transcendental`]), pow, softmax, logsumexp, cross-entropy or the backward
//!   kernels of log-softmax and cross-entropy, which need exp, log or sin that Vulkan's
//!   GLSL.std.450 does not define for 64-bit floats; no scatter-add (WGSL has no 64-bit
//!   atomics, and a float sum cannot be split into word-wise atomic adds).
//! - The optional fused kernels ([`Op::optional`]) listed are the backward kernels of softmax,
//!   log-softmax, the norms and cross-entropy, the optimizer updates (one parameter, and many
//!   at once in as few dispatches as the adapter's binding limits allow), max and average
//!   pooling with their backward kernels, and scaled dot-product attention with its backward
//!   (f32, f16 and bf16; head dims the kernels or the adapter's limits do not take are refused
//!   at launch, and the frontend composes those), for every float dtype the rules above allow
//!   (softmax's backward, the norms' and the updates need no more than sqrt, and pooling only
//!   compares, adds and divides, so they run in f64 too; attention needs exp). Conv2d is
//!   composed by the frontend.
//! - i64: every op defined for it. WGSL has no 64-bit integers, so i64 is stored as two 32-bit
//!   words and computed exactly on `vec2<u32>` (low, high) in two's complement
//!   (`shaders/i64_ops.wgsl`): add/sub with carries, the low 64 bits of products built from
//!   16-bit partial products, long division, wrapping powers, signed compares; scatter-add
//!   carries the low word's overflow into the high word atomically.

#[cfg(doc)]
use cartage_core::UnaryOp;
use cartage_core::{BinaryOp, Capabilities, DType, NormKind, Op, PoolKind, ReduceOp, ScatterMode, UpdateKind};

use crate::context::GpuContext;

/// The optional fused kernels ([`Op::optional`]) this backend implements.
const FUSED: [Op; 16] = [
    Op::SoftmaxBackward,
    Op::LogSoftmaxBackward,
    Op::NormBackward(NormKind::Layer),
    Op::NormBackward(NormKind::Rms),
    Op::CrossEntropyBackward,
    Op::Update(UpdateKind::Sgd),
    Op::Update(UpdateKind::Adam),
    Op::UpdateMany(UpdateKind::Sgd),
    Op::UpdateMany(UpdateKind::Adam),
    Op::Pool2d(PoolKind::Max),
    Op::Pool2d(PoolKind::Avg),
    Op::Pool2dBackward(PoolKind::Max),
    Op::Pool2dBackward(PoolKind::Avg),
    Op::Attention,
    Op::AttentionBackward,
    Op::AttentionMask,
];

/// Why `op` does not run for `dtype` on an adapter (`has_f64`: it has SHADER_F64), or `None`.
pub(crate) fn refusal(op: Op, dtype: DType, has_f64: bool) -> Option<&'static str> {
    let touches_f64 = dtype == DType::F64 || op == Op::Cast(DType::F64);
    if touches_f64 && !has_f64 {
        return Some("the adapter lacks the SHADER_F64 feature, so WGSL kernels cannot use f64");
    }
    if dtype != DType::F64 {
        // Every other dtype runs every op defined for it (i64 through word-pair emulation).
        return None;
    }
    match op {
        Op::Unary(u) if u.transcendental() => {
            Some("Vulkan defines exp, log, sin and tanh only for 16- and 32-bit floats (GLSL.std.450)")
        }
        Op::Binary(BinaryOp::Pow)
        | Op::Softmax
        | Op::LogSoftmax
        | Op::CrossEntropy
        | Op::LogSoftmaxBackward
        | Op::CrossEntropyBackward
        | Op::Attention
        | Op::AttentionBackward
        | Op::AttentionMask
        | Op::Reduce(ReduceOp::LogSumExp) => {
            Some("Vulkan defines exp, log and tanh only for 16- and 32-bit floats (GLSL.std.450)")
        }
        Op::Scatter(ScatterMode::Add) => Some(
            "WGSL has no 64-bit atomics, so repeated indices cannot add f64 values race-free; scatter-add in f32 or on the CPU",
        ),
        _ => None,
    }
}

/// The ops and dtypes that run on an adapter with (`has_f64`) or without `SHADER_F64`; the
/// device-specific fields (buffer limits, timing) are left at their defaults. This is what the
/// ops table in the docs is generated from, without a GPU.
///
/// ```
/// use cartage_core::{BinaryOp, DType, Op, PoolKind, ScanOp, UnaryOp, UpdateKind};
/// let caps = cartage_wgpu::capabilities_for(true);
/// assert!(caps.supports(Op::Unary(UnaryOp::Sqrt), DType::F64));
/// assert!(!caps.supports(Op::Unary(UnaryOp::Exp), DType::F64));
/// assert!(caps.supports(Op::Binary(BinaryOp::Div), DType::I64));
/// assert!(caps.supports(Op::Scan(ScanOp::Sum), DType::I64));
/// assert!(caps.supports(Op::SoftmaxBackward, DType::F64));
/// assert!(!caps.supports(Op::LogSoftmaxBackward, DType::F64));
/// assert!(caps.supports(Op::CrossEntropyBackward, DType::BF16));
/// for op in [Op::Attention, Op::AttentionBackward, Op::AttentionMask] {
///     for dtype in [DType::F32, DType::F16, DType::BF16] {
///         assert!(caps.supports(op, dtype));
///     }
///     assert!(!caps.supports(op, DType::F64));
/// }
/// for kind in UpdateKind::ALL {
///     for op in [Op::Update(kind), Op::UpdateMany(kind)] {
///         for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
///             assert!(caps.supports(op, dtype));
///         }
///         assert!(!caps.supports(op, DType::I32));
///         assert!(!cartage_wgpu::capabilities_for(false).supports(op, DType::F64));
///     }
/// }
/// for kind in PoolKind::ALL {
///     for op in [Op::Pool2d(kind), Op::Pool2dBackward(kind)] {
///         for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
///             assert!(caps.supports(op, dtype));
///         }
///         assert!(!caps.supports(op, DType::I64));
///         assert!(!cartage_wgpu::capabilities_for(false).supports(op, DType::F64));
///     }
/// }
/// ```
pub fn capabilities_for(has_f64: bool) -> Capabilities {
    let refused = |op: Op, dtype: DType| refusal(op, dtype, has_f64).is_some();
    let mut caps = Capabilities::all_defined(refused);
    for op in FUSED {
        for dtype in DType::ALL {
            if op.defined_for(dtype) && !refused(op, dtype) {
                caps.add(op, dtype);
            }
        }
    }
    caps
}

/// The capabilities of the device behind `ctx`.
pub(crate) fn capabilities(ctx: &GpuContext) -> Capabilities {
    let mut caps = capabilities_for(ctx.has(wgpu::Features::SHADER_F64));
    caps.max_buffer_bytes = ctx.max_binding();
    caps.native_f16 = false;
    caps.device_timing = ctx.has(wgpu::Features::TIMESTAMP_QUERY);
    caps.async_copies = false;
    caps
}
