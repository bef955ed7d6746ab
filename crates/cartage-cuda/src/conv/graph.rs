//! Convolutions through cuDNN's graph (backend) API, the route to the engines the legacy calls
//! do not reach (Hopper's implicit-GEMM kernels among them), chosen per plan against the legacy
//! API ([`crate::CudaBackend::set_conv_engine_api`]).
//!
//! - Each pass is an operation graph of one convolution operation over three non-virtual
//!   tensors with unique ids, their real strides (NCHW or a channels-last view alike, no copies)
//!   and their byte alignment; the alignment is baked into the plans, so it is part of the cache
//!   key ([`GraphKey`]) beside the legacy path's [`PlanKey`] (`conv_graph`). Only operands that
//!   all start on 16 bytes take the graph API: cuDNN's fused attention engines were seen making
//!   16-byte reads of an operand they were told is 2-byte aligned, so an operand off 16 bytes
//!   stays on the legacy API, whose algorithms have run every alignment.
//! - cuDNN's heuristics (mode A, then the fallback mode) list engine configurations; those the
//!   precision rule allows (f32 at precision `Highest` takes no tensor-core engine, as the legacy
//!   path takes no tensor-op algorithm; no engine that down-converts inputs or reduces in
//!   reduced precision) are finalized as execution plans (`crate::cudnn_graph::engines`, shared
//!   with the fused attention, as are the descriptors, the execution and the timing).
//! - With the algorithm search on, the first call of a plan (outside a graph capture) times up
//!   to [`SEARCH_COUNT`] plans on the call's own operands, the written one replaced by a scratch
//!   block, and, under [`ConvApi::Auto`], the legacy path's best algorithm with the same clock
//!   (`search`, `cudnn_graph::timing`); the faster API runs that plan from then on. With the search off the graph
//!   API's first plan runs. Under [`ConvApi::Graph`] the graph API runs whenever it can.
//! - Anything the graph API cannot do (an older cuDNN without its entry points, f64, no
//!   engine finalizing, every engine refusing at execution) is logged (`tracing` debug) and the
//!   legacy path runs instead; the user never sees the graph API's refusal.
//! - Plans are built outside graph captures only (a call captured before its plan exists runs
//!   on the legacy API); a plan built earlier also runs inside a capture.
//! - Each call binds the operands' addresses and a workspace from the caching allocator in a
//!   variant pack and queues the plan on the handle's stream, the compute stream (`execute`).
//!
//! When a graph or an engine fails, cuDNN's own log says why: run with
//! `CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr` (cuDNN 9; level 2 for warnings and errors
//! only) and `RUST_LOG=cartage_cuda=debug` for the status this module logged.

mod conv_graph;
mod search;

use std::collections::HashMap;
use std::ffi::c_void;

use cartage_core::raw::Allocation;
use cartage_core::{DType, Error, Result, TensorArg};
use cudarc::cudnn::sys;

pub(crate) use crate::cudnn_graph::engines::EngineInfo;
use crate::cudnn_graph::engines::{self, ExecPlan};
use crate::cudnn_graph::execute;

use super::choice::ConvApi;
use super::library::graph_available;
use super::plan::{Cudnn, PlanKey};
use super::search::SEARCH_WORKSPACE_LIMIT;
use crate::backend::CudaBackend;
use crate::launch::device_ptr;

/// Execution plans timed by the search at most.
pub(crate) const SEARCH_COUNT: usize = 8;

/// What a graph plan depends on: the legacy key and the operands' byte alignments `[x, w, y]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    key: PlanKey,
    alignment: [i64; 3],
}

/// The graph API's plans of one key, best first, with the graph they run.
pub(crate) struct GraphPlan {
    /// Finalized plans: the heuristics' order, or the search's (timed first, fastest first).
    candidates: Vec<ExecPlan>,
    /// True once the search has run for this plan.
    searched: bool,
    /// True once the search's best was timed against the legacy path's (under
    /// [`ConvApi::Auto`]; a plan searched under [`ConvApi::Graph`] is compared at its first
    /// call under `Auto`).
    compared: bool,
    /// Whether this plan runs through the graph API under [`ConvApi::Auto`] (false when the
    /// search timed the legacy API faster).
    use_graph: bool,
    /// The operation graph (dropped after the plans).
    _graph: conv_graph::OpGraph,
}

/// Every graph plan of a handle, or why the graph API could not plan that key.
pub(crate) type GraphPlans = HashMap<GraphKey, std::result::Result<GraphPlan, String>>;

/// The engine a key ran last through the graph API, for the report.
#[derive(Clone, Debug)]
pub(crate) struct GraphChoice {
    /// The engine.
    pub(crate) engine: EngineInfo,
    /// Workspace bytes per call.
    pub(crate) workspace: usize,
    /// Its time in the search (`None` when the search did not choose it).
    pub(crate) time_ms: Option<f32>,
}

/// The operands' roles as the graph's tensors: `x`, `w`, `y`.
type Operands<'a> = (&'a TensorArg, &'a TensorArg, &'a TensorArg);

/// True for the dtypes the graph path takes (f64 stays on the legacy API).
fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
}

/// The byte alignment cuDNN is told for `arg`.
fn alignment(arg: &TensorArg) -> i64 {
    if device_ptr(arg).is_multiple_of(16) {
        16
    } else {
        arg.dtype.size_in_bytes() as i64
    }
}

/// Whether `key`'s math allows tensor cores: every math but FMA (f32 at `Highest`).
fn tensor_cores(key: &PlanKey) -> bool {
    key.math != sys::cudnnMathType_t::CUDNN_FMA_MATH as u32
}

/// Build the graph and its plans for `gkey` (up to [`SEARCH_COUNT`] with the search on, else
/// the first that finalizes), or say why not.
fn build(backend: &CudaBackend, handle: sys::cudnnHandle_t, gkey: &GraphKey) -> std::result::Result<GraphPlan, String> {
    let key = &gkey.key;
    let device = backend.device;
    let graph =
        conv_graph::build(handle, key, gkey.alignment).map_err(|f| f.error(device, key.pass.op()).to_string())?;
    let want = if key.benchmark { SEARCH_COUNT } else { 1 };
    let tc = tensor_cores(key);
    let allow = |engine: &EngineInfo| engines::precise(engine, tc);
    let candidates = engines::plans(handle, &graph.graph, &allow, want, SEARCH_WORKSPACE_LIMIT)
        .map_err(|f| f.error(device, key.pass.op()).to_string())?;
    if candidates.is_empty() {
        return Err(format!(
            "cuDNN's graph heuristics offer no engine the precision rule allows for {:?} (tensor cores {})",
            key.pass,
            if tensor_cores(key) { "allowed" } else { "not allowed" }
        ));
    }
    tracing::debug!(
        %device,
        ?key,
        engines = ?candidates.iter().map(|c| (c.engine.index, c.workspace)).collect::<Vec<_>>(),
        "cuDNN graph plan"
    );
    Ok(GraphPlan {
        candidates,
        searched: false,
        compared: false,
        use_graph: true,
        _graph: graph,
    })
}

/// Queue the pass of `key` through the graph API when it may and can: `Ok(true)` when queued,
/// `Ok(false)` when the legacy path is to run it (the API is set to legacy, the graph API
/// cannot run it, or the search timed the legacy path faster), `Err` for a failure that is not
/// cuDNN's (the stream ordering, say).
///
/// `(x, w, y)` and `scratch` are as the legacy path's `attempt` takes them: validated operands
/// in live blocks of `backend` (the written one dense), `scratch` the blocks holding copies.
pub(super) fn attempt(
    backend: &CudaBackend,
    cudnn: &mut Cudnn,
    key: &PlanKey,
    operands: Operands<'_>,
    scratch: &[Allocation],
) -> Result<bool> {
    let api = backend.conv_engine_api();
    if api == ConvApi::Legacy || !supported(key.dtype) {
        return Ok(false);
    }
    let device = backend.device;
    if let Err(reason) = graph_available() {
        tracing::debug!(%device, %reason, "cuDNN's graph API is not available; the legacy API runs");
        return Ok(false);
    }
    let (x, w, y) = operands;
    let gkey = GraphKey {
        key: key.clone(),
        alignment: [alignment(x), alignment(w), alignment(y)],
    };
    if gkey.alignment.iter().any(|&a| a < 16) {
        // cuDNN's fused attention engines were seen reading 16-byte vectors from an operand
        // told to be 2-byte aligned (a misaligned-address fault); the legacy API, whose
        // algorithms have run every alignment, keeps operands that do not start on 16 bytes.
        return Ok(false);
    }
    let handle = cudnn.handle;
    if !cudnn.graphs.contains_key(&gkey) {
        if backend.capture.active() {
            // Finalizing plans may compile and load kernels: not inside a graph capture. This
            // call runs on the legacy API; the first one outside a capture builds the plan.
            return Ok(false);
        }
        let built = build(backend, handle, &gkey);
        if let Err(reason) = &built {
            tracing::debug!(%device, ?gkey, %reason, "the cuDNN graph API cannot run this convolution; the legacy API will");
        }
        cudnn.graphs.insert(gkey.clone(), built);
    }
    // The search and the comparison with the legacy path wait for the device: never inside a
    // graph capture (the next call outside one does them).
    let can_time = key.benchmark && !backend.capture.active();
    let (needs_search, needs_compare) = match cudnn.graphs.get(&gkey) {
        Some(Ok(plan)) => (
            can_time && !plan.searched,
            can_time && api == ConvApi::Auto && !plan.compared,
        ),
        _ => (false, false),
    };
    let legacy_ms = if needs_compare {
        search::legacy_time(backend, cudnn, key, operands, scratch)
    } else {
        None
    };
    let Some(Ok(plan)) = cudnn.graphs.get_mut(&gkey) else {
        return Ok(false);
    };
    if needs_search {
        if let Err(e) = search::search(backend, handle, plan, key, operands, scratch) {
            tracing::debug!(%device, ?key, error = %e, "the cuDNN graph search did not finish; the heuristics' order stays");
        }
        plan.searched = true;
    }
    if needs_compare {
        let graph_ms = plan.candidates.first().and_then(|c| c.time_ms);
        plan.use_graph = match (graph_ms, legacy_ms) {
            (Some(g), Some(l)) => g <= l,
            _ => true,
        };
        plan.compared = true;
        tracing::debug!(
            %device,
            ?key,
            graph_ms,
            legacy_ms,
            use_graph = plan.use_graph,
            "cuDNN graph API against the legacy API"
        );
    }
    if plan.candidates.is_empty() {
        cudnn
            .graphs
            .insert(gkey, Err("every graph engine refused these operands".into()));
        return Ok(false);
    }
    if api == ConvApi::Auto && !plan.use_graph {
        return Ok(false);
    }
    match run(backend, handle, plan, key, operands, scratch)? {
        Ran::Queued(choice) => {
            cudnn.graph_ran.insert(key.clone(), choice);
            Ok(true)
        }
        Ran::NoMemory(e) => {
            tracing::debug!(%device, error = %e, "no workspace for any graph engine; the legacy API runs");
            Ok(false)
        }
        Ran::Refused => {
            cudnn
                .graphs
                .insert(gkey, Err("every graph engine refused at execution".into()));
            Ok(false)
        }
    }
}

/// The outcome of [`run`].
enum Ran {
    /// Queued, with the engine that ran.
    Queued(GraphChoice),
    /// No engine's workspace could be had.
    NoMemory(Error),
    /// Every engine refused (and was dropped from the plan).
    Refused,
}

/// Queue the plan's best engine that runs, dropping those cuDNN refuses.
fn run(
    backend: &CudaBackend,
    handle: sys::cudnnHandle_t,
    plan: &mut GraphPlan,
    key: &PlanKey,
    (x, w, y): Operands<'_>,
    scratch: &[Allocation],
) -> Result<Ran> {
    let device = backend.device;
    let mut out_of_memory = None;
    let mut index = 0;
    while index < plan.candidates.len() {
        let candidate = &plan.candidates[index];
        let workspace = if candidate.workspace == 0 {
            None
        } else {
            match backend.allocator.alloc(candidate.workspace) {
                Ok(block) => Some(block),
                Err(e) => {
                    tracing::debug!(%device, bytes = candidate.workspace, engine = candidate.engine.index, error = %e, "no workspace for this graph engine; trying the next");
                    out_of_memory = Some(e);
                    index += 1;
                    continue;
                }
            }
        };
        let mut slices = vec![x.buffer, w.buffer, y.buffer];
        slices.extend(scratch.iter().chain(workspace.iter()).map(|b| b.slice()));
        let ordered = backend.order.before_compute(&backend.compute, &slices);
        let queued = ordered.map(|()| {
            let pointers = [x, w, y].map(|a| device_ptr(a) as *mut c_void);
            let space = workspace
                .as_ref()
                .map_or(std::ptr::null_mut(), |b| b.slice().addr() as *mut c_void);
            // SAFETY: the operands are validated, in live blocks freed only in stream order
            // (this function's contract), described by the plan's graph (its key holds their
            // dims and strides, and its alignment theirs); the written one is apart from the
            // inputs (validated); the workspace is a live block of the size the plan asked for,
            // given back in stream order below; the handle is the plan's.
            unsafe { execute::execute(handle, candidate, &conv_graph::UIDS, &pointers, space) }
        });
        // The workspace goes back in stream order.
        if let Some(block) = workspace {
            backend.allocator.free(block);
        }
        match queued {
            Err(e) => return Err(e),
            Ok(Ok(())) => {
                return Ok(Ran::Queued(GraphChoice {
                    engine: candidate.engine.clone(),
                    workspace: candidate.workspace,
                    time_ms: if plan.searched { candidate.time_ms } else { None },
                }));
            }
            Ok(Err(failure)) => {
                tracing::debug!(%device, ?key, %failure, "cuDNN refused this graph engine; trying the next");
                plan.candidates.remove(index);
            }
        }
    }
    Ok(match out_of_memory {
        Some(e) => Ran::NoMemory(e),
        None => Ran::Refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fma_math_keeps_tensor_cores_out() {
        let key = |math: sys::cudnnMathType_t| PlanKey {
            pass: crate::conv::ConvPass::Forward,
            dtype: DType::F32,
            math: math as u32,
            x_dims: [1, 8, 8, 8],
            x_strides: [512, 64, 8, 1],
            w_dims: [8, 8, 3, 3],
            y_strides: [512, 64, 8, 1],
            window: [1, 1, 1, 1, 1, 1],
            groups: 1,
            benchmark: false,
        };
        assert!(!tensor_cores(&key(sys::cudnnMathType_t::CUDNN_FMA_MATH)));
        assert!(tensor_cores(&key(sys::cudnnMathType_t::CUDNN_DEFAULT_MATH)));
        assert!(tensor_cores(&key(sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)));
    }

    #[test]
    fn f64_stays_on_the_legacy_api() {
        assert!(!supported(DType::F64));
        assert!(supported(DType::BF16) && supported(DType::F16) && supported(DType::F32));
    }
}
