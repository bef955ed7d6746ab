//! `Kernel::Conv2d` and its two gradients (`Kernel::Conv2dBackwardInput`,
//! `Kernel::Conv2dBackwardWeight`) through cuDNN's convolution forward, backward-data and
//! backward-filter calls, loaded at run time.
//!
//! - cuDNN 9 (`libcudnn.so.9`) is looked for once per process ([`available`]): on the loader's
//!   path, else under `$CUDNN_PATH` and the usual toolkit folders, with every entry point this
//!   module calls checked (the backward entry points on their own, [`backward_available`]).
//!   Without it the backend does not list `Op::Conv2d` (or the backward ops) and the frontend
//!   composes the convolution (im2col and a matmul) and its gradients; a launch anyway gets
//!   `Unsupported` naming the library. Nothing panics.
//! - One cuDNN handle per device, created on first use and bound to the compute stream
//!   (`cudnnSetStream`), so every convolution is ordered with every other kernel.
//! - The operands read are described with their real strides (Nd tensor descriptors): the
//!   forward's input, and the output gradient and forward input of the backward passes, so a
//!   strided view (an NHWC-backed tensor, say) is read in place (copies: see below). Groups go
//!   to `cudnnSetConvolutionGroupCount`.
//! - Arithmetic: f16 and bf16 on tensor cores with f32 accumulation; f32 in true f32 (FMA math)
//!   unless the device's matmul precision is `High`, which allows TF32 (as PyTorch's default
//!   `allow_tf32` for cuDNN); f64 in f64. The same for all three passes.
//! - The algorithm: cuDNN's heuristics (`cudnnGetConvolutionForwardAlgorithm_v7`,
//!   `…BackwardDataAlgorithm_v7`, `…BackwardFilterAlgorithm_v7`) rank the candidates, and with
//!   the algorithm search on (the default; [`crate::CudaBackend::set_conv_benchmark`],
//!   `CARTAGE_CUDNN_BENCHMARK=0` turns it off) the first call of each plan times them with
//!   `cudnnFind…AlgorithmEx` and runs the fastest that fits from then on (`search`, as
//!   `torch.backends.cudnn.benchmark` does). Plans are cached with the descriptors per pass,
//!   shape, strides, dtype, math and search setting; the workspace is a block of the backend's
//!   caching allocator, given back in stream order after the call. The algorithm each plan ran
//!   is logged (`tracing` debug) when it changes and reported by
//!   [`crate::CudaBackend::conv_algorithms`].
//! - Layout: NCHW operands are described as they are, NHWC-backed views with their strides.
//!   cuDNN itself pads, folds or transposes NCHW data to NHWC where its tensor-core kernels need
//!   it (cuDNN's legacy API guide, "Data and Filter Formats"), and the search times each
//!   algorithm with those transformations included, so cartage adds no transposition of its
//!   own: one around the call would move the same bytes cuDNN's does, and pays only when the
//!   data stays NHWC across layers (a model kept channels-last), which is the caller's layout.
//!
//! Shapes, dtypes, alignment and a contiguous output apart from the inputs are core's
//! [`cartage_core::Kernel::validate`]; this module checks only cuDNN's 32-bit sizes. A broadcast
//! or misaligned (not 16-byte) operand read with its strides and a non-dense or misaligned
//! weight read (cuDNN filters take a dense format) are copied to dense scratch first, a
//! misaligned output is written through one, and when cuDNN refuses every algorithm for the
//! strides it was given the call runs once more from dense copies. Sums over nothing (no input
//! channels, an empty batch, no output channels) are a fill with zeros, not a cuDNN call.
//!
//! - Two APIs: besides the legacy calls above, cuDNN's graph (backend) API reaches engines the
//!   legacy calls do not (Hopper's implicit-GEMM kernels among them). Each plan tries it first
//!   (`graph`): with the search on, its best engines are timed against the legacy path's best
//!   algorithm and the faster runs; with the search off, its heuristics' first engine runs.
//!   Whatever the graph API cannot run falls back to the legacy calls silently;
//!   [`crate::CudaBackend::set_conv_engine_api`] (`CARTAGE_CUDNN_API`) forces either API.
//!
//! `library` finds cuDNN; `plan` holds the handle, the descriptors and the algorithm cache and
//! makes the calls; `search` times the algorithms; `graph` is the graph API's path; `choice` is
//! the public report and switches; this file takes the kernels' operands to them.

mod choice;
mod graph;
mod library;
mod plan;
mod search;

use std::ffi::c_int;

use cartage_core::raw::Allocation;
use cartage_core::{Capabilities, DType, Error, Kernel, Layout, MatmulPrecision, Op, Result, Scalar, TensorArg};
use cudarc::cudnn::sys;

use crate::backend::CudaBackend;
use crate::launch::{device_ptr, launch};
pub(crate) use choice::{ApiSwitch, benchmark_from_env};
pub use choice::{
    CUDNN_API_VAR, CUDNN_BENCHMARK_VAR, ConvAlgorithmChoice, ConvApi, ConvPass, GRAPH_NO_TENSOR_CORES,
    GRAPH_TENSOR_CORES,
};
pub(crate) use library::{available, backward_available, graph_available};
use plan::{Pass, PlanKey, data_type, execute, handle};
pub(crate) use plan::{existing as existing_cudnn, handle as cudnn_handle};

/// List `Op::Conv2d` and the two backward ops in `caps` for the dtypes cuDNN convolves on a
/// device of compute capability `cc` (bf16 from Ampere on), when cuDNN loads with their entry
/// points.
pub(crate) fn add_capabilities(caps: &mut Capabilities, cc: (i32, i32)) {
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .filter(|&d| d != DType::BF16 || cc.0 >= 8);
    match available() {
        Ok(()) => dtypes.clone().for_each(|d| caps.add(Op::Conv2d, d)),
        Err(reason) => {
            tracing::debug!(%reason, "conv2d is not listed (no fused kernel)");
            return;
        }
    }
    match backward_available() {
        Ok(()) => {
            for dtype in dtypes {
                caps.add(Op::Conv2dBackwardInput, dtype);
                caps.add(Op::Conv2dBackwardWeight, dtype);
            }
        }
        Err(reason) => tracing::debug!(%reason, "the conv2d backward kernels are not listed"),
    }
}

/// `v` as cuDNN's `int`, or an error of `op` naming `what`.
fn to_i32(op: &'static str, what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| {
        Error::invalid(
            op,
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

/// The strides `arg` is described to cuDNN with: packed row-major ones for a contiguous
/// operand (every output, so cuDNN sees the packed layout its kernels prefer), else
/// [`cudnn_strides`].
fn descriptor_strides(arg: &TensorArg) -> Vec<usize> {
    let shape = arg.layout.shape();
    if arg.layout.is_contiguous() {
        cartage_core::contiguous_strides(shape).to_vec()
    } else {
        cudnn_strides(shape, arg.layout.strides())
    }
}

/// True when some dim of more than one element has stride 0 (a broadcast cuDNN cannot read).
fn broadcast(arg: &TensorArg) -> bool {
    arg.layout
        .shape()
        .iter()
        .zip(arg.layout.strides())
        .any(|(&n, &s)| n > 1 && s == 0)
}

/// True when the operand's first element is 16-byte aligned (cuDNN picks kernels from the
/// descriptors alone, so addresses must have the alignment its vector loads assume).
fn aligned(arg: &TensorArg) -> bool {
    device_ptr(arg).is_multiple_of(16)
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

/// An operand cuDNN reads with its strides: as it is, or a dense copy when it is broadcast or
/// misaligned.
///
/// # Safety
/// As [`dense_copy`]'s.
unsafe fn read_strided(
    backend: &CudaBackend,
    what: &str,
    arg: &TensorArg,
    scratch: &mut Vec<Allocation>,
) -> Result<TensorArg> {
    if broadcast(arg) || !aligned(arg) {
        // SAFETY: this function's contract.
        unsafe { dense_copy(backend, what, arg, scratch) }
    } else {
        Ok(arg.clone())
    }
}

/// A weight cuDNN reads as a dense filter: as it is, or a dense copy.
///
/// # Safety
/// As [`dense_copy`]'s.
unsafe fn read_dense(backend: &CudaBackend, arg: &TensorArg, scratch: &mut Vec<Allocation>) -> Result<TensorArg> {
    if arg.layout.is_contiguous() && aligned(arg) {
        Ok(arg.clone())
    } else {
        // SAFETY: this function's contract.
        unsafe { dense_copy(backend, "weight", arg, scratch) }
    }
}

/// Where cuDNN writes the (contiguous) output `out`: `out` itself, or a scratch of its layout
/// when it is misaligned (copied into `out` afterwards).
fn write_target(backend: &CudaBackend, out: &TensorArg, scratch: &mut Vec<Allocation>) -> Result<TensorArg> {
    if aligned(out) {
        return Ok(out.clone());
    }
    let block = backend
        .allocator
        .alloc(out.layout.numel() * out.dtype.size_in_bytes())?;
    let target = TensorArg {
        buffer: block.slice(),
        layout: out.layout.clone(),
        dtype: out.dtype,
    };
    scratch.push(block);
    Ok(target)
}

/// The window of a convolution, as the kernels carry it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    /// Step of the window, (height, width).
    pub(crate) stride: [usize; 2],
    /// Zeros added on each side, (height, width).
    pub(crate) padding: [usize; 2],
    /// Spacing of the window's taps, (height, width).
    pub(crate) dilation: [usize; 2],
    /// Channel groups.
    pub(crate) groups: usize,
}

/// The convolution's fixed parameters, in cuDNN's 32-bit terms.
#[derive(Clone, Copy, Debug)]
struct Conv {
    pass: Pass,
    dtype: DType,
    math: u32,
    x_dims: [c_int; 4],
    w_dims: [c_int; 4],
    window: [c_int; 6],
    groups: c_int,
}

/// Run `Kernel::Conv2d`: `out` [N, O, OH, OW] from `input` and `weight`.
///
/// # Safety
/// The kernel passed [`cartage_core::Kernel::validate`] and every operand lies in a live block of
/// `backend`, freed only in stream order afterwards.
pub(crate) unsafe fn conv2d(
    backend: &CudaBackend,
    input: &TensorArg,
    weight: &TensorArg,
    window: Window,
    out: &TensorArg,
) -> Result<()> {
    // SAFETY: this function's contract.
    unsafe { run(backend, Pass::Forward, input, weight, out, window) }
}

/// Run `Kernel::Conv2dBackwardInput`: `out` [N, C, H, W] from `grad` and `weight`.
///
/// # Safety
/// As [`conv2d`]'s.
pub(crate) unsafe fn conv2d_backward_input(
    backend: &CudaBackend,
    grad: &TensorArg,
    weight: &TensorArg,
    window: Window,
    out: &TensorArg,
) -> Result<()> {
    // SAFETY: this function's contract.
    unsafe { run(backend, Pass::BackwardData, out, weight, grad, window) }
}

/// Run `Kernel::Conv2dBackwardWeight`: `out` [O, C/g, kh, kw] from `input` and `grad`.
///
/// # Safety
/// As [`conv2d`]'s.
pub(crate) unsafe fn conv2d_backward_weight(
    backend: &CudaBackend,
    input: &TensorArg,
    grad: &TensorArg,
    window: Window,
    out: &TensorArg,
) -> Result<()> {
    // SAFETY: this function's contract.
    unsafe { run(backend, Pass::BackwardFilter, input, out, grad, window) }
}

/// One pass over `x` [N, C, H, W], `w` [O, C/g, kh, kw] and `y` [N, O, OH, OW]; the pass says
/// which of them is written.
///
/// # Safety
/// As [`conv2d`]'s.
unsafe fn run(
    backend: &CudaBackend,
    pass: Pass,
    x: &TensorArg,
    w: &TensorArg,
    y: &TensorArg,
    window: Window,
) -> Result<()> {
    let (op, device, dtype) = (pass.op(), backend.device, x.dtype);
    let loaded = match pass {
        Pass::Forward => available(),
        Pass::BackwardData | Pass::BackwardFilter => backward_available(),
    };
    if let Err(reason) = loaded {
        return Err(Error::unsupported(op, dtype, device, reason));
    }
    if data_type(dtype).is_none() {
        return Err(Error::unsupported(op, dtype, device, "cuDNN convolves floats only"));
    }
    let (out, empty_sum) = match pass {
        // No input channels, or an input plane of no elements: every output is an empty sum.
        Pass::Forward => (y, w.layout.shape()[1] == 0 || x.layout.numel() == 0),
        // No output channels.
        Pass::BackwardData => (x, y.layout.numel() == 0),
        // An empty batch (or input plane).
        Pass::BackwardFilter => (w, x.layout.numel() == 0 || y.layout.numel() == 0),
    };
    if out.layout.numel() == 0 {
        return Ok(());
    }
    if empty_sum {
        let zero = Kernel::Fill {
            out: out.clone(),
            value: Scalar::Float(0.0),
        };
        // SAFETY: `out` is a validated operand in a live block (this function's contract).
        return unsafe { launch(backend, &zero) };
    }
    // cuDNN's limits first, before any scratch memory is taken.
    let conv = Conv {
        pass,
        dtype,
        math: math_type(dtype, cartage_core::Backend::matmul_precision(backend)) as u32,
        x_dims: dims4(op, "an input dim", x.layout.shape())?,
        w_dims: dims4(op, "a weight dim", w.layout.shape())?,
        window: [
            to_i32(op, "padding", window.padding[0])?,
            to_i32(op, "padding", window.padding[1])?,
            to_i32(op, "stride", window.stride[0])?,
            to_i32(op, "stride", window.stride[1])?,
            to_i32(op, "dilation", window.dilation[0])?,
            to_i32(op, "dilation", window.dilation[1])?,
        ],
        groups: to_i32(op, "groups", window.groups)?,
    };
    dims4(op, "an output dim", y.layout.shape())?;
    for arg in [x, w, y] {
        to_i32(op, "an operand's element count", arg.layout.numel())?;
    }

    let mut scratch = Vec::new();
    // SAFETY: validated operands in live blocks (this function's contract).
    let outcome = unsafe { convolve(backend, &conv, x, w, y, &mut scratch) };
    // Scratch copies go back in stream order: later users are queued after the convolution.
    for block in scratch {
        backend.allocator.free(block);
    }
    outcome
}

/// Queue the pass, reading strided operands in place where cuDNN takes their strides.
///
/// # Safety
/// As [`conv2d`]'s.
unsafe fn convolve(
    backend: &CudaBackend,
    conv: &Conv,
    x: &TensorArg,
    w: &TensorArg,
    y: &TensorArg,
    scratch: &mut Vec<Allocation>,
) -> Result<()> {
    // SAFETY: (every call below) validated operands in live blocks (this function's contract).
    let (mut xs, ws, mut ys) = unsafe {
        match conv.pass {
            Pass::Forward => (
                read_strided(backend, "input", x, scratch)?,
                read_dense(backend, w, scratch)?,
                write_target(backend, y, scratch)?,
            ),
            Pass::BackwardData => (
                write_target(backend, x, scratch)?,
                read_dense(backend, w, scratch)?,
                read_strided(backend, "output gradient", y, scratch)?,
            ),
            Pass::BackwardFilter => (
                read_strided(backend, "input", x, scratch)?,
                write_target(backend, w, scratch)?,
                read_strided(backend, "output gradient", y, scratch)?,
            ),
        }
    };
    if let Some(refusal) = attempt(backend, conv, &xs, &ws, &ys, scratch)? {
        // cuDNN refused every algorithm for the strides it was given: once more from dense
        // copies of the strided operands it reads.
        let strided_x = conv.pass != Pass::BackwardData && !xs.layout.is_contiguous();
        let strided_y = conv.pass != Pass::Forward && !ys.layout.is_contiguous();
        if !strided_x && !strided_y {
            return Err(refusal);
        }
        if strided_x {
            // SAFETY: as above.
            xs = unsafe { dense_copy(backend, "input", x, scratch) }?;
        }
        if strided_y {
            // SAFETY: as above.
            ys = unsafe { dense_copy(backend, "output gradient", y, scratch) }?;
        }
        if let Some(refusal) = attempt(backend, conv, &xs, &ws, &ys, scratch)? {
            return Err(refusal);
        }
    }
    let (target, out) = match conv.pass {
        Pass::Forward => (ys, y),
        Pass::BackwardData => (xs, x),
        Pass::BackwardFilter => (ws, w),
    };
    if target.buffer == out.buffer {
        return Ok(());
    }
    let copy = Kernel::Copy {
        input: target,
        out: out.clone(),
    };
    // SAFETY: `out` is a validated operand in a live block (this function's contract) and
    // `target` a dense scratch of its shape and dtype, apart from it.
    unsafe { launch(backend, &copy) }
}

/// One try with the operands as given: `Ok(None)` when queued, `Ok(Some(why))` when cuDNN
/// refused every algorithm, `Err` for any other failure.
fn attempt(
    backend: &CudaBackend,
    conv: &Conv,
    x: &TensorArg,
    w: &TensorArg,
    y: &TensorArg,
    scratch: &[Allocation],
) -> Result<Option<Error>> {
    let (device, op) = (backend.device, conv.pass.op());
    let key = PlanKey {
        pass: conv.pass,
        dtype: conv.dtype,
        math: conv.math,
        x_dims: conv.x_dims,
        x_strides: dims4(op, "an input stride", &descriptor_strides(x))?,
        w_dims: conv.w_dims,
        y_strides: dims4(op, "an output stride", &descriptor_strides(y))?,
        window: conv.window,
        groups: conv.groups,
        benchmark: backend.conv_benchmark(),
    };
    backend.bind()?;
    let shared = handle(backend, op, conv.dtype)?;
    let mut cudnn = shared.lock().unwrap_or_else(|p| p.into_inner());
    let handle = cudnn.handle;
    // The graph API first, where it may and can run this convolution (`graph`); the legacy
    // calls below otherwise.
    if graph::attempt(backend, &mut cudnn, &key, (x, w, y), scratch)? {
        return Ok(None);
    }
    cudnn.graph_ran.remove(&key);
    let plan = match cudnn.plan(device, &key) {
        Ok(plan) => plan,
        Err(refusal) => return Ok(Some(refusal)),
    };
    // The search waits for the device: never inside a graph capture (the next call outside
    // one searches).
    if key.benchmark && !plan.searched && !backend.capture.active() {
        if let Err(e) = search::search(backend, handle, plan, &key, (x, w, y), scratch) {
            tracing::debug!(%device, op, error = %e, "the cuDNN algorithm search did not run; cuDNN's heuristics choose");
        }
        plan.searched = true;
    }
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
                    tracing::debug!(%device, op, bytes = candidate.workspace, algo = ?candidate.algo, error = %e, "no workspace for this algorithm; trying the next");
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
            .and_then(|()| execute(device, handle, plan, &candidate, x, w, y, workspace.as_ref()));
        // The workspace goes back in stream order.
        if let Some(block) = workspace {
            backend.allocator.free(block);
        }
        match queued {
            Ok(()) => {
                if plan.chosen.is_none_or(|c| !c.same(&candidate)) {
                    tracing::debug!(
                        %device,
                        op,
                        ?key,
                        algo = ?candidate.algo,
                        math = ?candidate.math,
                        workspace = candidate.workspace,
                        search_ms = ?candidate.time_ms,
                        "cuDNN conv2d algorithm"
                    );
                }
                plan.chosen = Some(candidate);
                return Ok(None);
            }
            Err(e @ Error::Driver { op: called, .. }) if called.starts_with("cudnn") => {
                // cuDNN refused this algorithm for these operands (nothing was queued): drop it
                // from the plan and try the next.
                tracing::debug!(%device, op, algo = ?candidate.algo, error = %e, "cuDNN refused this algorithm");
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
            op,
            conv.dtype,
            device,
            format!("cuDNN has no {:?} algorithm left for this convolution", conv.pass),
        ))),
    }
}

/// Four sizes as cuDNN's `int`s.
fn dims4(op: &'static str, what: &str, v: &[usize]) -> Result<[c_int; 4]> {
    Ok([
        to_i32(op, what, v[0])?,
        to_i32(op, what, v[1])?,
        to_i32(op, what, v[2])?,
        to_i32(op, what, v[3])?,
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
