//! cartage: tensors that know where they live.
//!
//! A [`Tensor`] is shared device storage plus a strided [`Layout`], a [`DType`], the [`Device`] it
//! lives on and its origin (the source line where it was created or last moved). Everything that
//! costs — moving between devices, reading back to the host, copying a strided view — is an
//! explicit call, and every op checks devices and dtypes with errors that name both operands and
//! where each came from.
//!
//! ```
//! use cartage::prelude::*;
//!
//! # fn main() -> cartage::Result<()> {
//! let device = Device::pick()?; // CARTAGE_DEVICE, else the best device found
//! let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &device)?.reshape(&[2, 3])?;
//! let y = Tensor::full(&[3], 0.5, DType::F32, &device)?;
//! let z = x.mul(&y)?.sum(&[1], false)?;
//! assert_eq!(z.to_vec::<f32>()?, vec![1.5, 6.0]);
//! # Ok(())
//! # }
//! ```
//!
//! - [`runtime`]: the device registry (one backend per device, opened on first use), memory
//!   statistics and `empty_cache` per device, host-sync and implicit-copy counters.
//! - [`DevicePick`]: `Device::pick()` and `Device::best_available()`.
//! - [`tensor`]: [`Tensor`] — constructors, views, ops, moves and host reads.
//!
//! The backends compiled in are chosen by the features `cpu` (default), `cuda` and `wgpu`.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod autocast;
pub mod autograd;
pub mod bench;
pub mod distributed;
pub mod dlpack;
mod generator;
pub mod graph;
pub mod loader;
pub mod memory;
pub mod optim;
pub mod raw;
pub mod runtime;
pub mod safetensors_io;
pub mod tensor;

/// The `half` crate, for `f16`/`bf16` host values (`cartage::half::bf16::from_f32(1.5)`).
pub use half;

pub use autocast::{AutocastGuard, autocast, autocast_dtype, autocast_with};
pub use autograd::{
    GradHook, GradHookId, Gradients, GraphMemory, NoGradGuard, Var, VarId, graph_memory, is_grad_enabled,
    live_graph_nodes, no_grad, saved_activation_bytes,
};
#[allow(deprecated)]
pub use cartage_core::Activation;
pub use cartage_core::Epilogue;
pub use cartage_core::error::ErrorKind;
pub use cartage_core::{AdamUpdate, SgdUpdate, UpdateKind, UpdateRule};
pub use cartage_core::{
    Backend, Capabilities, DType, Device, DeviceInfo, DeviceKind, Element, Error, Layout, MatmulPrecision, MemoryStats,
    Result, Scalar, format_bytes,
};
pub use cartage_core::{
    BinaryOp, CompareOp, CopyHandle, DeviceBuffer, Dims, Distribution, Event, HostStaging, Kernel, LiveBlock,
    MemoryInfo, NormKind, OomReport, Op, PageableBuffer, PinnedBuffer, ReduceOp, ScanOp, ScatterMode, Site,
    StagingBuffer, TensorArg, UnaryOp, pinned_bytes_in_use, pinned_bytes_peak,
};
pub use distributed::{DistEnv, ProcessGroup, ReduceKind};
pub use dlpack::DlpackTensor;
pub use generator::Generator;
pub use graph::{CudaGraph, cuda_graph};
pub use loader::{HostBatch, PrefetchLoader};
pub use memory::{MemoryTracker, TrainingEstimate, memory_summary};
pub use runtime::{DeviceExt, device_capabilities, device_info};
pub use runtime::{
    DevicePick, RuntimeStats, alloc_pinned, alloc_staging, backend, devices, empty_cache, memory_stats,
    reset_peak_memory_stats, reset_stats, set_matmul_algo_search, set_matmul_precision, stats, synchronize,
};
pub use safetensors_io::{SafetensorsFile, load_safetensors, save_safetensors, save_safetensors_with_metadata};
pub use tensor::create::NestedArray;
pub use tensor::nn::{Conv2dOptions, CrossEntropy, Reduction};
pub use tensor::slicing::{ShapeArg, ShapeInt, SliceArg, SliceBound, SliceItem, SliceSpec, s};
pub use tensor::{LerpWeight, NormOrd, Storage, Tensor};

/// The README's example, compiled and run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;

/// The names most programs need: `use cartage::prelude::*;`.
pub mod prelude {
    pub use crate::{DType, Device, DeviceExt, DevicePick, Generator, Result, Tensor, Var, no_grad, s};
}
