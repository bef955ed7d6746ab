//! cuDNN's graph (backend) API, shared by the convolutions (`conv::graph`) and the fused
//! attention (`attention_cudnn`): owned backend descriptors with typed attribute setters
//! (`descriptor`), a builder for operation graphs of tensors (real, virtual or pass-by-value) and
//! matmul, pointwise, reduction and reshape operations (`builder`), cuDNN's heuristics and the
//! finalized execution plans (`engines`), the variant pack and `cudnnBackendExecute`
//! (`execute`), and the device clock the plan searches time engines with (`timing`).
//!
//! When a graph or an engine fails, cuDNN's own log says why: run with
//! `CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr` (cuDNN 9; level 2 for warnings and errors
//! only) and `RUST_LOG=cartage_cuda=debug` for the statuses cartage logged.

pub(crate) mod builder;
pub(crate) mod descriptor;
pub(crate) mod engines;
pub(crate) mod execute;
pub(crate) mod timing;
