//! The algorithm search (PyTorch's `torch.backends.cudnn.benchmark`): on the first call of a
//! plan while the search is on ([`crate::CudaBackend::set_conv_benchmark`]), cuDNN's
//! `cudnnFindConvolution{Forward,BackwardData,BackwardFilter}AlgorithmEx` runs every algorithm
//! of the pass on the call's own operands and reports its time; the plan's candidates become
//! the measured ones, fastest first, followed by the heuristic candidates the search did not
//! time (the fallbacks when a workspace cannot be had later).
//!
//! - The operand the pass writes is replaced by a scratch block of its layout during the search
//!   (cuDNN writes it once per algorithm tried), so the caller's output is written only by the
//!   call that follows, exactly as without the search. The inputs are only read.
//! - The workspace offered is the largest any heuristic candidate asks for, at most
//!   [`SEARCH_WORKSPACE_LIMIT`], taken from the caching allocator (a smaller one when that size
//!   cannot be had); an algorithm needing more is not timed. The winner's workspace is what
//!   cuDNN sizes for it, so the calls that follow take it from the allocator as before.
//! - The f32 rule of the heuristics holds: under FMA math (precision `Highest`) tensor-op
//!   results are dropped, so the search never introduces TF32.
//! - The find calls wait for the device (cuDNN times with events), so the search is skipped
//!   while a CUDA graph is captured; that call runs the heuristics' choice and the search
//!   happens at the next call outside a capture.

use std::ffi::{c_int, c_void};

use cartage_core::raw::Allocation;
use cartage_core::{Error, Result, TensorArg};
use cudarc::cudnn::sys;

use super::library::{cudnn_error, search_available};
use super::plan::{Algo, Candidate, Pass, Plan, PlanKey, math_from_u32, workspace_size};
use crate::backend::CudaBackend;
use crate::launch::device_ptr;

/// The largest workspace the search offers cuDNN: 1 GiB.
pub(super) const SEARCH_WORKSPACE_LIMIT: usize = 1 << 30;

/// One algorithm's result in the search.
struct Found {
    algo: Algo,
    status: sys::cudnnStatus_t,
    time_ms: f32,
    memory: usize,
    math: sys::cudnnMathType_t,
}

/// Run the pass's `cudnnFind…AlgorithmEx` (`$find`, perf struct `$perf`, `$count` entries at
/// most) with the descriptor/pointer arguments given and collect its results as [`Found`].
macro_rules! find_with {
    ($handle:expr, $find:ident, $perf:ty, $count:expr, $wrap:path, ($($arg:expr),+), $ws:expr, $ws_bytes:expr, $err:expr) => {{
        const COUNT: usize = $count as usize;
        // SAFETY: a plain C struct of enums and numbers, for which all-zero bytes are valid
        // (status 0 is success, algorithm 0 exists in every pass); cuDNN overwrites the ones
        // it returns.
        let mut perf: [$perf; COUNT] = unsafe { std::mem::zeroed() };
        let mut returned: c_int = 0;
        // SAFETY: a live handle and the plan's live descriptors; the pointers are the operands'
        // device addresses (the caller's contract) and the written one a scratch block of the
        // described size; `perf` holds COUNT results; the workspace is a live block of
        // `$ws_bytes` bytes (or null and 0).
        unsafe { sys::$find($handle, $($arg),+, COUNT as c_int, &mut returned, perf.as_mut_ptr(), $ws, $ws_bytes) }
            .result()
            .map_err($err(stringify!($find)))?;
        perf.iter()
            .take((returned.max(0) as usize).min(COUNT))
            .map(|p| Found {
                algo: $wrap(p.algo),
                status: p.status,
                time_ms: p.time,
                memory: p.memory,
                math: p.mathType,
            })
            .collect::<Vec<Found>>()
    }};
}

/// Order `plan.candidates` by the time cuDNN measures for each algorithm of `key`'s pass on the
/// operands `x`, `w`, `y` (as [`super::plan::execute`] takes them: validated, in live blocks of
/// `backend`, with `scratch` the caller's blocks that hold any of them). An error leaves the plan
/// as it was; the caller keeps the heuristic order then.
pub(super) fn search(
    backend: &CudaBackend,
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    key: &PlanKey,
    (x, w, y): (&TensorArg, &TensorArg, &TensorArg),
    scratch: &[Allocation],
) -> Result<()> {
    let device = backend.device;
    search_available().map_err(|reason| Error::unsupported(key.pass.op(), key.dtype, device, reason))?;
    let written = match key.pass {
        Pass::Forward => y,
        Pass::BackwardData => x,
        Pass::BackwardFilter => w,
    };
    let target = backend
        .allocator
        .alloc(written.layout.numel() * written.dtype.size_in_bytes())?;
    let outcome = workspace(backend, plan).and_then(|(space, bytes)| {
        let found = find(
            backend,
            handle,
            plan,
            key,
            (x, w, y),
            &target,
            (space.as_ref(), bytes),
            scratch,
        );
        // The blocks go back in stream order (the find calls have returned by then anyway).
        if let Some(space) = space {
            backend.allocator.free(space);
        }
        found.map(|found| (found, bytes))
    });
    backend.allocator.free(target);
    let (found, offered) = outcome?;
    let measured = measured(handle, plan, key, found, offered);
    tracing::debug!(
        %device,
        ?key,
        offered,
        measured = ?measured.iter().map(|c| (c.algo, c.math, c.workspace, c.time_ms)).collect::<Vec<_>>(),
        "cuDNN algorithm search"
    );
    let mut candidates = measured;
    for c in &plan.candidates {
        if !candidates.iter().any(|m| m.same(c)) {
            candidates.push(*c);
        }
    }
    plan.candidates = candidates;
    Ok(())
}

/// The search's workspace: the largest a heuristic candidate asks for, at most
/// [`SEARCH_WORKSPACE_LIMIT`], or the next smaller one when the allocator cannot give it.
fn workspace(backend: &CudaBackend, plan: &Plan) -> Result<(Option<Allocation>, usize)> {
    let mut sizes: Vec<usize> = plan
        .candidates
        .iter()
        .map(|c| c.workspace)
        .filter(|&b| b <= SEARCH_WORKSPACE_LIMIT)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    for bytes in sizes {
        if bytes == 0 {
            break;
        }
        match backend.allocator.alloc(bytes) {
            Ok(block) => return Ok((Some(block), bytes)),
            Err(Error::OutOfMemory(_)) => {
                tracing::debug!(device = %backend.device, bytes, "no room for this search workspace; offering less");
            }
            Err(e) => return Err(e),
        }
    }
    Ok((None, 0))
}

/// The find call of `key`'s pass, writing `target` in place of the pass's output.
#[allow(clippy::too_many_arguments)]
fn find(
    backend: &CudaBackend,
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    key: &PlanKey,
    (x, w, y): (&TensorArg, &TensorArg, &TensorArg),
    target: &Allocation,
    (space, bytes): (Option<&Allocation>, usize),
    scratch: &[Allocation],
) -> Result<Vec<Found>> {
    let err = |op| cudnn_error(backend.device, op);
    let d = plan.descriptors();
    // SAFETY: a live descriptor of this plan.
    unsafe { sys::cudnnSetConvolutionMathType(d.conv, math_from_u32(key.math)) }
        .result()
        .map_err(err("cudnnSetConvolutionMathType"))?;
    let mut slices = vec![x.buffer, w.buffer, y.buffer, target.slice()];
    slices.extend(scratch.iter().chain(space).map(|b| b.slice()));
    backend.order.before_compute(&backend.compute, &slices)?;
    let ws = space.map_or(std::ptr::null_mut(), |b| b.slice().addr() as *mut c_void);
    let out = target.slice().addr() as *mut c_void;
    let (xp, wp, yp) = (
        device_ptr(x) as *const c_void,
        device_ptr(w) as *const c_void,
        device_ptr(y) as *const c_void,
    );
    let found = match key.pass {
        Pass::Forward => find_with!(
            handle,
            cudnnFindConvolutionForwardAlgorithmEx,
            sys::cudnnConvolutionFwdAlgoPerf_t,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
            Algo::Forward,
            (d.x, xp, d.w, wp, d.conv, d.y, out),
            ws,
            bytes,
            err
        ),
        Pass::BackwardData => find_with!(
            handle,
            cudnnFindConvolutionBackwardDataAlgorithmEx,
            sys::cudnnConvolutionBwdDataAlgoPerf_t,
            sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            Algo::Data,
            (d.w, wp, d.y, yp, d.conv, d.x, out),
            ws,
            bytes,
            err
        ),
        Pass::BackwardFilter => find_with!(
            handle,
            cudnnFindConvolutionBackwardFilterAlgorithmEx,
            sys::cudnnConvolutionBwdFilterAlgoPerf_t,
            sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
            Algo::Filter,
            (d.x, xp, d.y, yp, d.conv, d.w, out),
            ws,
            bytes,
            err
        ),
    };
    Ok(found)
}

/// The search's usable results as candidates, fastest first: successes that fit the offered
/// workspace, without tensor-op math under FMA math, each once, with the workspace cuDNN sizes
/// for it (at least what it used in the search).
fn measured(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    key: &PlanKey,
    found: Vec<Found>,
    offered: usize,
) -> Vec<Candidate> {
    let requested = math_from_u32(key.math);
    let fma = requested == sys::cudnnMathType_t::CUDNN_FMA_MATH;
    let d = plan.descriptors();
    let mut out: Vec<Candidate> = Vec::new();
    for f in found {
        if f.status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS || f.memory > offered || !f.time_ms.is_finite() {
            continue;
        }
        let tensor_ops = matches!(
            f.math,
            sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH | sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
        );
        if fma && tensor_ops {
            continue;
        }
        let math = if fma { requested } else { f.math };
        // SAFETY: a live descriptor of this plan.
        if unsafe { sys::cudnnSetConvolutionMathType(d.conv, math) }
            .result()
            .is_err()
        {
            continue;
        }
        let Some(sized) = workspace_size(handle, &d, f.algo) else {
            continue;
        };
        let candidate = Candidate {
            algo: f.algo,
            math,
            workspace: sized.max(f.memory),
            time_ms: Some(f.time_ms),
        };
        if !out.iter().any(|c| c.same(&candidate)) {
            out.push(candidate);
        }
    }
    out.sort_by(|a, b| a.time_ms.partial_cmp(&b.time_ms).unwrap_or(std::cmp::Ordering::Equal));
    out
}
