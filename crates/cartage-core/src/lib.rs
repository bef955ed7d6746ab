//! cartage-core: the vocabulary every cartage backend and the frontend share.
//!
//! - [`Device`]: where data lives, always with an explicit ordinal (`cpu`, `cuda:0`, `wgpu:1`).
//! - [`DType`] and [`Element`]: element types and their byte sizes.
//! - [`Layout`]: shape, strides (broadcast = stride 0) and offset, with overflow-checked sizes.
//! - [`Kernel`]: one value per operation a backend can launch.
//! - [`Backend`]: the small trait each device implements (alloc, copy, launch, sync, stats).
//! - [`CachingAllocator`]: the one caching allocator every backend puts under its memory.
//! - [`DeviceBuffer`] and [`Kernel::run`]: the sound path to device memory; [`raw`] holds the
//!   low-level types (segments, slices) whose use is `unsafe`.
//! - [`Collective`]: all-reduce, broadcast, gather, scatter, send/recv and barrier among ranks,
//!   implemented by an engine beside its backend (NCCL in cartage-cuda).
//! - [`Error`]: one variant per failure, each message naming the likely cause and what to check.
//!
//! This crate depends on no GPU crate (an invariant checked by the workspace's tidy test).

pub mod allocator;
pub mod backend;
mod buffer;
pub mod collective;
pub mod device;
pub mod dtype;
mod epilogue;
pub mod error;
mod index_range;
pub mod kernel;
pub mod layout;
pub mod pinned;
mod pool;
pub mod random;
pub mod raw;
#[cfg(feature = "testsuite")]
pub mod testsuite;
mod update_rule;
mod validate;
mod validate_backward;

pub use validate::conv_out_size;

pub use allocator::format_bytes;
pub use layout::{checked_bytes, checked_numel, contiguous_strides, resolve_dim};
pub use pinned::pinned_bytes_peak;

pub use allocator::{AllocatorConfig, CachingAllocator, LiveBlock, MemoryInfo, MemoryStats, OomReport};
pub use backend::{Backend, Capabilities, CapturedGraph, DeviceInfo, Event, MatmulPrecision};
pub use buffer::DeviceBuffer;
pub use collective::{Collective, CollectiveArg, CollectiveEngine, CollectiveHandle, ReduceKind};
pub use device::{Device, DeviceKind};
pub use dtype::{DType, Element, Scalar};
#[allow(deprecated)]
pub use epilogue::{Activation, Epilogue};
pub use error::{Error, ErrorKind, Result, Site};
pub use index_range::IndexRange;
pub use kernel::{
    BinaryOp, CompareOp, Distribution, Kernel, NormBackwardArgs, NormKind, Op, ReduceOp, ScanOp, ScatterMode,
    TensorArg, UnaryOp,
};
pub use layout::{Dims, Layout, broadcast_shapes};
pub use pinned::{
    CopyCompletion, CopyHandle, HostStaging, PageableBuffer, PinnedBuffer, StagingBuffer, pinned_bytes_in_use,
};
pub use pool::{PoolKind, PoolMode, PoolWindow};
pub use update_rule::{AdamCoefficients, AdamUpdate, SgdCoefficients, SgdUpdate, UpdateKind, UpdateRule};
