//! Low-level access under the [`crate::Tensor`] API, for backend-level code (benches, custom
//! kernels): the raw types of core's [`cartage_core::raw`] and the backend of a device.
//!
//! Nothing here can reach device memory without `unsafe`: a [`BufferSlice`] cannot be forged or
//! stretched, the backend methods that take one are `unsafe fn`, and the safe path is
//! [`crate::DeviceBuffer`] with [`crate::Kernel::run`] (what tensors use).

pub use cartage_core::raw::{Allocation, BufferSlice, SegmentError, SegmentHandle, SegmentSource};

pub use crate::runtime::backend;
