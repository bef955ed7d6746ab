//! The graph API's side of the algorithm search: time a plan's engines on the call's own
//! operands (the written one replaced by a scratch block, the workspace the largest any engine
//! asks for) and order them fastest first, and time the legacy path's best algorithm with the
//! same clock (`timing`) so the two APIs are compared on equal terms.

use std::ffi::c_void;

use cartage_core::raw::Allocation;
use cartage_core::{Result, TensorArg};
use cudarc::cudnn::sys;

use super::conv_graph::UIDS;
use super::{GraphPlan, Operands};
use crate::backend::CudaBackend;
use crate::conv::plan::{Cudnn, Pass, PlanKey, execute as legacy_execute};
use crate::conv::search::SEARCH_WORKSPACE_LIMIT;
use crate::cudnn_graph::{execute, timing};
use crate::launch::device_ptr;

/// A scratch block in place of the pass's written operand, and that operand's index in
/// `(x, w, y)`.
fn written_target(
    backend: &CudaBackend,
    pass: Pass,
    (x, w, y): Operands<'_>,
) -> Result<(Allocation, TensorArg, usize)> {
    let (written, index) = match pass {
        Pass::Forward => (y, 2),
        Pass::BackwardData => (x, 0),
        Pass::BackwardFilter => (w, 1),
    };
    let block = backend
        .allocator
        .alloc(written.layout.numel() * written.dtype.size_in_bytes())?;
    let target = TensorArg {
        buffer: block.slice(),
        layout: written.layout.clone(),
        dtype: written.dtype,
    };
    Ok((block, target, index))
}

/// Time the plan's engines on the operands (the written one replaced by a scratch block) and
/// order them fastest first; an engine cuDNN refuses is dropped. An error that is not cuDNN's
/// stops the search and leaves the untimed engines after the timed ones.
pub(super) fn search(
    backend: &CudaBackend,
    handle: sys::cudnnHandle_t,
    plan: &mut GraphPlan,
    key: &PlanKey,
    operands: Operands<'_>,
    scratch: &[Allocation],
) -> Result<()> {
    let device = backend.device;
    let (target_block, target, written) = written_target(backend, key.pass, operands)?;
    let largest = plan.candidates.iter().map(|c| c.workspace).max().unwrap_or(0);
    let space = if largest == 0 {
        None
    } else {
        match backend.allocator.alloc(largest) {
            Ok(block) => Some(block),
            Err(e) => {
                backend.allocator.free(target_block);
                return Err(e);
            }
        }
    };
    let (x, w, y) = operands;
    let mut slices = vec![x.buffer, w.buffer, y.buffer, target_block.slice()];
    slices.extend(scratch.iter().chain(space.iter()).map(|b| b.slice()));
    let outcome = backend.order.before_compute(&backend.compute, &slices);
    let mut pointers = [x, w, y].map(|a| device_ptr(a) as *mut c_void);
    pointers[written] = device_ptr(&target) as *mut c_void;
    let space_ptr = space
        .as_ref()
        .map_or(std::ptr::null_mut(), |b| b.slice().addr() as *mut c_void);
    let candidates = std::mem::take(&mut plan.candidates);
    let search = "convolution";
    let (ranked, timing_outcome) = match outcome {
        Ok(()) => timing::rank_engines(backend, candidates, search, key.pass.op(), |candidate| {
            // SAFETY: as in `run`, with the written operand replaced by a scratch block of its
            // layout and a workspace at least as large as any engine here asks for; both are
            // given back in stream order after the search.
            Ok(unsafe { execute::execute(handle, candidate, &UIDS, &pointers, space_ptr) })
        }),
        Err(e) => (candidates, Err(e)),
    };
    tracing::debug!(%device, ?key, "cuDNN graph convolution search done");
    backend.allocator.free(target_block);
    if let Some(block) = space {
        backend.allocator.free(block);
    }
    plan.candidates = ranked;
    timing_outcome
}

/// The legacy path's best algorithm for `key`, timed with the graph search's clock on the same
/// operands (searching the legacy plan first when it has not been), or `None` when it cannot be
/// had (the legacy path refused the key, or a failure, logged).
pub(super) fn legacy_time(
    backend: &CudaBackend,
    cudnn: &mut Cudnn,
    key: &PlanKey,
    operands: Operands<'_>,
    scratch: &[Allocation],
) -> Option<f32> {
    let device = backend.device;
    let handle = cudnn.handle;
    let plan = cudnn.plan(device, key).ok()?;
    if !plan.searched {
        if let Err(e) = crate::conv::search::search(backend, handle, plan, key, operands, scratch) {
            tracing::debug!(%device, op = key.pass.op(), error = %e, "the cuDNN algorithm search did not run; cuDNN's heuristics choose");
        }
        plan.searched = true;
    }
    let candidate = plan
        .candidates
        .iter()
        .copied()
        .find(|c| c.workspace <= SEARCH_WORKSPACE_LIMIT)?;
    let (target_block, target, written) = written_target(backend, key.pass, operands).ok()?;
    let workspace = if candidate.workspace == 0 {
        None
    } else {
        match backend.allocator.alloc(candidate.workspace) {
            Ok(block) => Some(block),
            Err(e) => {
                tracing::debug!(%device, error = %e, "no workspace to time the legacy algorithm");
                backend.allocator.free(target_block);
                return None;
            }
        }
    };
    let (x, w, y) = operands;
    let mut args = [x.clone(), w.clone(), y.clone()];
    args[written] = target;
    let mut slices = vec![x.buffer, w.buffer, y.buffer, target_block.slice()];
    slices.extend(scratch.iter().chain(workspace.iter()).map(|b| b.slice()));
    let measured = backend.order.before_compute(&backend.compute, &slices).and_then(|()| {
        timing::time_ms(backend, || {
            legacy_execute(
                device,
                handle,
                plan,
                &candidate,
                &args[0],
                &args[1],
                &args[2],
                workspace.as_ref(),
            )
        })
    });
    backend.allocator.free(target_block);
    if let Some(block) = workspace {
        backend.allocator.free(block);
    }
    match measured {
        Ok(ms) => Some(ms),
        Err(e) => {
            tracing::debug!(%device, ?key, error = %e, "could not time the legacy algorithm; the graph API runs");
            None
        }
    }
}
