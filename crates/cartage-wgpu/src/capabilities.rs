//! What runs on a wgpu adapter, and why the rest does not (ARTICLE R26).
//!
//! - f32, f16, bf16, i32, u8, bool: every op defined for them. f16 and bf16 are stored packed
//!   and computed in f32 on every adapter (SHADER_F16 is not needed for that).
//! - f64: only with `SHADER_F64`, and not the transcendental unary functions
//!   ([`UnaryOp::transcendental`]), pow, softmax, logsumexp or cross-entropy, which need exp,
//!   log or sin that Vulkan's GLSL.std.450 does not define for 64-bit floats; no scatter-add
//!   (WGSL has no 64-bit atomics, and a float sum cannot be split into word-wise atomic adds).
//! - i64: fill, arange, copy, casts, where, gather, index_select, sort and scatter (and as the
//!   index and arg-reduction dtype). WGSL has no 64-bit integer arithmetic.

#[cfg(doc)]
use cartage_core::UnaryOp;
use cartage_core::{BinaryOp, Capabilities, DType, Op, ReduceOp, ScatterMode};

use crate::context::GpuContext;

/// Why `op` does not run for `dtype` on an adapter (`has_f64`: it has SHADER_F64), or `None`.
pub(crate) fn refusal(op: Op, dtype: DType, has_f64: bool) -> Option<&'static str> {
    let touches_f64 = dtype == DType::F64 || op == Op::Cast(DType::F64);
    if touches_f64 && !has_f64 {
        return Some("the adapter lacks the SHADER_F64 feature, so WGSL kernels cannot use f64");
    }
    match dtype {
        DType::F64 => match op {
            Op::Unary(u) if u.transcendental() => {
                Some("Vulkan defines exp, log, sin and tanh only for 16- and 32-bit floats (GLSL.std.450)")
            }
            Op::Binary(BinaryOp::Pow)
            | Op::Softmax
            | Op::LogSoftmax
            | Op::CrossEntropy
            | Op::Reduce(ReduceOp::LogSumExp) => {
                Some("Vulkan defines exp, log and tanh only for 16- and 32-bit floats (GLSL.std.450)")
            }
            Op::Scatter(ScatterMode::Add) => Some(
                "WGSL has no 64-bit atomics, so repeated indices cannot add f64 values race-free; scatter-add in f32 or on the CPU",
            ),
            _ => None,
        },
        DType::I64 => match op {
            Op::Fill
            | Op::Arange
            | Op::Cast(_)
            | Op::Copy
            | Op::Where
            | Op::Gather
            | Op::IndexSelect
            | Op::Sort
            | Op::Scatter(_) => None,
            _ => Some(
                "WGSL has no 64-bit integer arithmetic; i64 tensors can be filled, copied, cast, selected, gathered, sorted and scattered, and index other tensors",
            ),
        },
        _ => None,
    }
}

/// The ops and dtypes that run on an adapter with (`has_f64`) or without `SHADER_F64`; the
/// device-specific fields (buffer limits, timing) are left at their defaults. This is what the
/// ops table in the docs is generated from, without a GPU.
///
/// ```
/// use cartage_core::{DType, Op, UnaryOp};
/// let caps = cartage_wgpu::capabilities_for(true);
/// assert!(caps.supports(Op::Unary(UnaryOp::Sqrt), DType::F64));
/// assert!(!caps.supports(Op::Unary(UnaryOp::Exp), DType::F64));
/// ```
pub fn capabilities_for(has_f64: bool) -> Capabilities {
    Capabilities::all_defined(|op, dtype| refusal(op, dtype, has_f64).is_some())
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
