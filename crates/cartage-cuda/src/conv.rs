//! `Kernel::Conv2d` through cuDNN's convolution forward, loaded at run time.
//!
//! - cuDNN 9 (`libcudnn.so.9`) is looked for once per process ([`available`]): on the loader's
//!   path, else under `$CUDNN_PATH` and the usual toolkit folders, with every entry point this
//!   module calls checked. Without it the backend does not list `Op::Conv2d` and the frontend
//!   composes the convolution (im2col and a matmul); a launch anyway gets `Unsupported` naming
//!   the library. Nothing panics.
//! - One cuDNN handle per device, created on first use and bound to the compute stream
//!   (`cudnnSetStream`), so the convolution is ordered with every other kernel.
//! - The input is described with its real strides (an Nd tensor descriptor), so a strided view
//!   (an NHWC-backed tensor, say) is read in place (copies: see below). Groups go to
//!   `cudnnSetConvolutionGroupCount`.
//! - Arithmetic: f16 and bf16 on tensor cores with f32 accumulation; f32 in true f32 (FMA math)
//!   unless the device's matmul precision is `High`, which allows TF32 (as PyTorch's default
//!   `allow_tf32` for cuDNN); f64 in f64.
//! - The algorithm comes from cuDNN's heuristics (`cudnnGetConvolutionForwardAlgorithm_v7`),
//!   cached with the descriptors per shape, strides, dtype and math; its workspace is a block of
//!   the backend's caching allocator, given back in stream order after the call.
//!
//! Shapes, dtypes, alignment and a contiguous output apart from the inputs are core's
//! [`cartage_core::Kernel::validate`]; this module checks only cuDNN's 32-bit sizes. A broadcast
//! or misaligned (not 16-byte) input and a non-dense or misaligned weight (cuDNN filters take a
//! dense format) are copied to dense scratch first, a misaligned output is written through one, and when cuDNN refuses every
//! algorithm for the input's strides the convolution runs once more from a dense copy.
//!
//! `library` finds cuDNN; `plan` holds the handle, the descriptors and the algorithm cache and
//! makes the forward call; this file takes the kernel's operands to it.

mod library;
mod plan;

use std::ffi::c_int;

use cartage_core::raw::Allocation;
use cartage_core::{Capabilities, DType, Error, Kernel, Layout, MatmulPrecision, Op, Result, Scalar, TensorArg};
use cudarc::cudnn::sys;

use crate::backend::CudaBackend;
use crate::launch::{device_ptr, launch};
pub(crate) use library::available;
use plan::{PlanKey, data_type, forward, handle};

/// The op's name in errors.
const OP: &str = "conv2d";

/// List `Op::Conv2d` in `caps` for the dtypes cuDNN convolves on a device of compute capability
/// `cc` (bf16 from Ampere on), when cuDNN loads.
pub(crate) fn add_capabilities(caps: &mut Capabilities, cc: (i32, i32)) {
    match available() {
        Ok(()) => {
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                if dtype != DType::BF16 || cc.0 >= 8 {
                    caps.add(Op::Conv2d, dtype);
                }
            }
        }
        Err(reason) => tracing::debug!(%reason, "conv2d is not listed (no fused kernel)"),
    }
}

/// `v` as cuDNN's `int`, or an error naming `what`.
fn to_i32(what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| {
        Error::invalid(
            OP,
            format!("{what} = {v} is beyond cuDNN's 32-bit limit; split the batch or the image"),
        )
    })
}

/// The math a convolution of `dtype` may use under the device's f32 `precision`.
fn math_type(dtype: DType, precision: MatmulPrecision) -> sys::cudnnMathType_t {
    use sys::cudnnMathType_t::*;
    match (dtype, precision) {
        (DType::F16 | DType::BF16, _) => CUDNN_TENSOR_OP_MATH,
        // cuDNN's default math lets f32 use TF32 tensor cores (from Ampere on).
        (DType::F32, MatmulPrecision::High) => CUDNN_DEFAULT_MATH,
        (DType::F32, _) => CUDNN_FMA_MATH,
        _ => CUDNN_DEFAULT_MATH,
    }
}

/// Strides for cuDNN: a size-1 dim's stride is free, so it gets one past every other dim's
/// extent (cuDNN wants positive strides).
fn cudnn_strides(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let span = shape
        .iter()
        .zip(strides)
        .filter(|(n, _)| **n > 1)
        .map(|(n, s)| n * s)
        .max()
        .unwrap_or(1)
        .max(1);
    shape
        .iter()
        .zip(strides)
        .map(|(&n, &s)| if n == 1 { span } else { s })
        .collect()
}

/// A contiguous copy of `arg` in a fresh scratch block (kept in `scratch`), for layouts or
/// addresses cuDNN does not take.
///
/// # Safety
/// `arg` is a validated operand in a live block of `backend`.
unsafe fn dense_copy(
    backend: &CudaBackend,
    what: &str,
    arg: &TensorArg,
    scratch: &mut Vec<Allocation>,
) -> Result<TensorArg> {
    let shape = arg.layout.shape();
    let bytes = arg.layout.numel() * arg.dtype.size_in_bytes();
    tracing::debug!(
        device = %backend.device,
        bytes,
        shape = ?shape,
        strides = ?arg.layout.strides(),
        "conv2d: cuDNN does not take the {what}'s layout; copying it to a contiguous scratch"
    );
    let block = backend.allocator.alloc(bytes)?;
    let dense = TensorArg {
        buffer: block.slice(),
        layout: Layout::contiguous(shape)?,
        dtype: arg.dtype,
    };
    scratch.push(block);
    let copy = Kernel::Copy {
        input: arg.clone(),
        out: dense.clone(),
    };
    // SAFETY: `arg` is a validated operand in a live block (this function's contract) and the
    // scratch a fresh dense block of its shape and dtype, apart from it.
    unsafe { launch(backend, &copy) }?;
    Ok(dense)
}

/// The convolution's fixed parameters, in cuDNN's 32-bit terms.
#[derive(Clone, Copy, Debug)]
struct Conv {
    dtype: DType,
    math: u32,
    x_dims: [c_int; 4],
    w_dims: [c_int; 4],
    window: [c_int; 6],
    groups: c_int,
}

/// Run `Kernel::Conv2d`.
///
/// # Safety
/// The kernel passed [`cartage_core::Kernel::validate`] and every operand lies in a live block of
/// `backend`, freed only in stream order afterwards.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv2d(
    backend: &CudaBackend,
    input: &TensorArg,
    weight: &TensorArg,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    out: &TensorArg,
) -> Result<()> {
    let device = backend.device;
    let dtype = input.dtype;
    if let Err(reason) = available() {
        return Err(Error::unsupported(OP, dtype, device, reason));
    }
    if data_type(dtype).is_none() {
        return Err(Error::unsupported(OP, dtype, device, "cuDNN convolves floats only"));
    }
    if out.layout.numel() == 0 {
        return Ok(());
    }
    if weight.layout.shape()[1] == 0 {
        // No input channels: every output is an empty sum.
        let zero = Kernel::Fill {
            out: out.clone(),
            value: Scalar::Float(0.0),
        };
        // SAFETY: `out` is a validated operand in a live block (this function's contract).
        return unsafe { launch(backend, &zero) };
    }
    // cuDNN's limits first, before any scratch memory is taken.
    let conv = Conv {
        dtype,
        math: math_type(dtype, cartage_core::Backend::matmul_precision(backend)) as u32,
        x_dims: dims4("an input dim", input.layout.shape())?,
        w_dims: dims4("a weight dim", weight.layout.shape())?,
        window: [
            to_i32("padding", padding[0])?,
            to_i32("padding", padding[1])?,
            to_i32("stride", stride[0])?,
            to_i32("stride", stride[1])?,
            to_i32("dilation", dilation[0])?,
            to_i32("dilation", dilation[1])?,
        ],
        groups: to_i32("groups", groups)?,
    };
    dims4("an output dim", out.layout.shape())?;
    for arg in [input, out] {
        to_i32("an operand's element count", arg.layout.numel())?;
    }

    let mut scratch = Vec::new();
    // SAFETY: validated operands in live blocks (this function's contract).
    let outcome = unsafe { convolve(backend, &conv, input, weight, out, &mut scratch) };
    // Scratch copies go back in stream order: later users are queued after the convolution.
    for block in scratch {
        backend.allocator.free(block);
    }
    outcome
}

/// Queue the convolution, reading the input in place where cuDNN takes its strides.
///
/// # Safety
/// As [`conv2d`]'s.
unsafe fn convolve(
    backend: &CudaBackend,
    conv: &Conv,
    input: &TensorArg,
    weight: &TensorArg,
    out: &TensorArg,
    scratch: &mut Vec<Allocation>,
) -> Result<()> {
    // cuDNN picks kernels from the descriptors alone, so addresses must have the alignment its
    // vector loads assume: a broadcast or misaligned input and a non-dense or misaligned weight
    // are copied first, and a misaligned output is written through a scratch.
    let aligned = |a: &TensorArg| device_ptr(a).is_multiple_of(16);
    let broadcast = input
        .layout
        .shape()
        .iter()
        .zip(input.layout.strides())
        .any(|(&n, &s)| n > 1 && s == 0);
    let mut x = if broadcast || !aligned(input) {
        // SAFETY: validated operand in a live block (this function's contract).
        unsafe { dense_copy(backend, "input", input, scratch) }?
    } else {
        input.clone()
    };
    let w = if weight.layout.is_contiguous() && aligned(weight) {
        weight.clone()
    } else {
        // SAFETY: as above.
        unsafe { dense_copy(backend, "weight", weight, scratch) }?
    };
    let y = if aligned(out) {
        out.clone()
    } else {
        let block = backend
            .allocator
            .alloc(out.layout.numel() * out.dtype.size_in_bytes())?;
        let y = TensorArg {
            buffer: block.slice(),
            layout: out.layout.clone(),
            dtype: out.dtype,
        };
        scratch.push(block);
        y
    };
    if let Some(refusal) = attempt(backend, conv, &x, &w, &y, scratch)? {
        // cuDNN refused every algorithm for the input's strides: once more from a dense copy.
        if x.layout.is_contiguous() {
            return Err(refusal);
        }
        // SAFETY: as above.
        x = unsafe { dense_copy(backend, "input", input, scratch) }?;
        if let Some(refusal) = attempt(backend, conv, &x, &w, &y, scratch)? {
            return Err(refusal);
        }
    }
    if y.buffer == out.buffer {
        return Ok(());
    }
    let copy = Kernel::Copy {
        input: y,
        out: out.clone(),
    };
    // SAFETY: `out` is a validated operand in a live block (this function's contract) and `y` a
    // dense scratch of its shape and dtype, apart from it.
    unsafe { launch(backend, &copy) }
}

/// One try with `x` and `w` as given: `Ok(None)` when queued, `Ok(Some(why))` when cuDNN
/// refused every algorithm, `Err` for any other failure.
fn attempt(
    backend: &CudaBackend,
    conv: &Conv,
    x: &TensorArg,
    w: &TensorArg,
    y: &TensorArg,
    scratch: &[Allocation],
) -> Result<Option<Error>> {
    let device = backend.device;
    let strides = cudnn_strides(x.layout.shape(), x.layout.strides());
    let key = PlanKey {
        dtype: conv.dtype,
        math: conv.math,
        x_dims: conv.x_dims,
        x_strides: dims4("an input stride", &strides)?,
        w_dims: conv.w_dims,
        window: conv.window,
        groups: conv.groups,
    };
    backend.bind()?;
    let shared = handle(backend, conv.dtype)?;
    let mut cudnn = shared.lock().unwrap_or_else(|p| p.into_inner());
    let handle = cudnn.handle;
    let plan = match cudnn.plan(device, &key) {
        Ok(plan) => plan,
        Err(refusal) => return Ok(Some(refusal)),
    };
    let mut out_of_memory = None;
    let mut refusal = None;
    let mut index = 0;
    while index < plan.candidates.len() {
        let candidate = plan.candidates[index];
        let workspace = if candidate.workspace == 0 {
            None
        } else {
            match backend.allocator.alloc(candidate.workspace) {
                Ok(block) => Some(block),
                Err(e) => {
                    tracing::debug!(%device, bytes = candidate.workspace, algo = ?candidate.algo, error = %e, "conv2d: no workspace for this algorithm; trying the next");
                    out_of_memory = Some(e);
                    index += 1;
                    continue;
                }
            }
        };
        let mut slices = vec![x.buffer, w.buffer, y.buffer];
        slices.extend(scratch.iter().chain(workspace.iter()).map(|b| b.slice()));
        let queued = backend
            .order
            .before_compute(&backend.compute, &slices)
            .and_then(|()| forward(device, handle, plan, &candidate, x, w, y, workspace.as_ref()));
        // The workspace goes back in stream order.
        if let Some(block) = workspace {
            backend.allocator.free(block);
        }
        match queued {
            Ok(()) => return Ok(None),
            Err(e @ Error::Driver { op, .. }) if op.starts_with("cudnn") => {
                // cuDNN refused this algorithm for these operands (nothing was queued): drop it
                // from the plan and try the next.
                tracing::debug!(%device, algo = ?candidate.algo, error = %e, "conv2d: cuDNN refused this algorithm");
                plan.candidates.remove(index);
                refusal = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    match (refusal, out_of_memory) {
        (_, Some(oom)) => Err(oom),
        (Some(refusal), None) => Ok(Some(refusal)),
        (None, None) => Ok(Some(Error::unsupported(
            OP,
            conv.dtype,
            device,
            "cuDNN has no forward algorithm left for this convolution",
        ))),
    }
}

/// Four sizes as cuDNN's `int`s.
fn dims4(what: &str, v: &[usize]) -> Result<[c_int; 4]> {
    Ok([
        to_i32(what, v[0])?,
        to_i32(what, v[1])?,
        to_i32(what, v[2])?,
        to_i32(what, v[3])?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_one_dims_get_a_positive_stride() {
        // NHWC-backed [2, 3, 4, 5]: strides (60, 1, 15, 3) are kept.
        assert_eq!(cudnn_strides(&[2, 3, 4, 5], &[60, 1, 15, 3]), vec![60, 1, 15, 3]);
        // A size-1 batch with stride 0 gets one past the rest.
        assert_eq!(cudnn_strides(&[1, 3, 4, 5], &[0, 20, 5, 1]), vec![60, 20, 5, 1]);
        // All size 1.
        assert_eq!(cudnn_strides(&[1, 1, 1, 1], &[0, 0, 0, 0]), vec![1, 1, 1, 1]);
    }

    #[test]
    fn f32_math_follows_the_precision_setting() {
        use sys::cudnnMathType_t::*;
        assert_eq!(math_type(DType::F32, MatmulPrecision::Highest), CUDNN_FMA_MATH);
        assert_eq!(math_type(DType::F32, MatmulPrecision::High), CUDNN_DEFAULT_MATH);
        assert_eq!(math_type(DType::BF16, MatmulPrecision::Highest), CUDNN_TENSOR_OP_MATH);
        assert_eq!(math_type(DType::F16, MatmulPrecision::Highest), CUDNN_TENSOR_OP_MATH);
    }

    #[test]
    fn a_missing_library_is_a_reason_not_a_panic() {
        match available() {
            Ok(()) => eprintln!("cuDNN present"),
            Err(reason) => assert!(reason.contains("cuDNN"), "{reason}"),
        }
    }
}
