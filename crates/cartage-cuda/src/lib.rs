//! The CUDA backend of cartage: NVIDIA GPUs through cudarc, loaded at run time.
//!
//! - Building needs no CUDA toolkit: the driver, NVRTC and cuBLAS are opened with `dlopen` when a
//!   device is first asked for ([`loader`]). A machine without them gets
//!   [`Error::BackendUnavailable`] with the reason, and [`device_count`] returns 0; nothing panics.
//! - Kernels are CUDA C files in `kernels/`, embedded in the binary with their PTX compiled ahead
//!   of time ([`precompiled`]); each module is built for the device on first use by the driver's
//!   JIT (or by NVRTC where the PTX does not apply) and cached per device and on disk
//!   ([`modules`]).
//! - Memory comes from `cuMemAlloc` segments under core's caching allocator ([`memory`]); work is
//!   ordered across the compute and copy streams with events ([`ordering`]).
//! - Matmul runs through cuBLASLt or cuBLAS's GemmEx, chosen per shape, with an optional algorithm
//!   search ([`matmul`], `lt_route`) and an explicit f32 precision setting (R32); the fused
//!   linear layer runs cuBLASLt's bias and activation epilogues.
//! - Convolutions run on cuDNN, loaded at run time, with an algorithm search per shape (on by
//!   default, like `torch.backends.cudnn.benchmark`; [`CudaBackend::set_conv_benchmark`],
//!   `CARTAGE_CUDNN_BENCHMARK=0`) and a report of the algorithm each shape runs
//!   ([`CudaBackend::conv_algorithms`]); each shape runs through cuDNN's graph API (the
//!   Hopper implicit-GEMM engines) or its legacy API, whichever the search times faster
//!   ([`CudaBackend::set_conv_engine_api`]).
//! - Fused attention (bf16, f16) runs cartage's flash kernels or cuDNN's fused attention (graph
//!   API), whichever the search times faster for each shape ([`CudaBackend::set_attention_api`],
//!   `CARTAGE_ATTENTION_API`; [`CudaBackend::attention_choices`] tells which ran).
//!
//! Every device is `cuda:N` with an explicit ordinal; [`open`] returns the same backend for the
//! same ordinal within a process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cartage_core::{Backend, Device, Error, Result};

mod attention_cudnn;
mod backend;
mod blas;
mod conv;
mod copies;
mod cudnn_graph;
mod disk_cache;
mod driver;
mod events;
mod graph;
mod launch;
mod linear;
pub mod loader;
mod lt;
mod lt_route;
pub mod matmul;
pub mod memory;
pub mod modules;
#[cfg(feature = "nccl")]
pub mod nccl;
mod nvrtc;
pub mod ordering;
pub mod precompiled;
mod staging;

pub use attention_cudnn::{ATTENTION_API_VAR, AttentionApi, AttentionChoice, AttentionPass};
pub use backend::{CudaBackend, capabilities_for};
pub use conv::{
    CUDNN_API_VAR, CUDNN_BENCHMARK_VAR, ConvAlgorithmChoice, ConvApi, ConvPass, GRAPH_NO_TENSOR_CORES,
    GRAPH_TENSOR_CORES,
};
pub use lt_route::{MATMUL_SEARCH_VAR, MatmulCounters, MatmulLibrary, SEARCH_CANDIDATES, SEARCH_REPEATS};
pub use staging::TransferStats;

/// The number of CUDA devices on this machine: 0 when there is no driver or no device.
pub fn device_count() -> Result<usize> {
    if let Err(reason) = loader::driver() {
        tracing::debug!(%reason, "no CUDA driver: 0 devices");
        return Ok(0);
    }
    Ok(driver::device_count())
}

/// Open `cuda:ordinal` (once per process; later calls return the same backend).
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>> {
    Ok(open_cuda(ordinal)?)
}

/// [`open`], returning the concrete backend (for CUDA-specific extensions and benchmarks).
pub fn open_cuda(ordinal: usize) -> Result<Arc<CudaBackend>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<CudaBackend>>>> = OnceLock::new();
    let device = Device::cuda(ordinal);
    let mut opened = OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(backend) = opened.get(&ordinal) {
        return Ok(backend.clone());
    }
    let unavailable = |reason: String| Error::BackendUnavailable { device, reason };
    loader::driver().map_err(unavailable)?;
    let count = driver::device_count();
    if ordinal >= count {
        return Err(unavailable(format!(
            "this machine has {count} CUDA device(s), so the ordinals are 0..{count}; check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
        )));
    }
    loader::nvrtc().map_err(unavailable)?;
    loader::cublas().map_err(unavailable)?;
    let backend = std::panic::catch_unwind(|| CudaBackend::new(ordinal)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        unavailable(format!("the CUDA libraries failed while opening the device: {message}"))
    })??;
    let backend = Arc::new(backend);
    opened.insert(ordinal, backend.clone());
    Ok(backend)
}
