//! The low-level types under [`crate::DeviceBuffer`]: segments, byte slices, allocations.
//!
//! Nothing here is needed to use cartage; it is what a backend implements and what the unsafe
//! methods of [`crate::Backend`] take.
//!
//! # The unsafe contract
//! - A [`BufferSlice`] is made only by the [`crate::CachingAllocator`] (for a block it hands
//!   out) and can only be narrowed ([`BufferSlice::slice`]): safe code cannot forge or stretch
//!   one. It is a plain value, though, and can outlive its block.
//! - So every backend method that reaches memory through a slice (`write`, `read`,
//!   `copy_within`, `launch`, `write_async`, `read_async`, `copy_to_peer`) is an `unsafe fn`
//!   whose caller promises that each slice lies in a live allocation of that backend. Backends
//!   validate everything else themselves: [`crate::Kernel::validate`] (structure, bounds,
//!   alignment, aliasing) and their own hardware limits.
//! - [`crate::DeviceBuffer`] owns a block and keeps it live while borrowed; its methods and
//!   [`crate::Kernel::run`] check that every slice lies inside borrowed buffers and are safe.
//! - [`SegmentSource::release_segment`] is `unsafe`: only the allocator releases a segment, once,
//!   when no block of it is in use.
//! - Memory cartage did not allocate (imported through DLPack) enters only through the `unsafe`
//!   [`crate::DeviceBuffer::import_external`], whose caller promises the memory stays valid
//!   while the buffer lives. The allocator mints its slice: in the segment of the cartage block
//!   it lies in, or else in the allocator's [`EXTERNAL_SEGMENT_ID`] segment at its address, so
//!   slices stay unforgeable and two imports of the same bytes are seen to overlap.

//!
//! A slice cannot be forged from safe code:
//!
//! ```compile_fail
//! use cartage_core::raw::{BufferSlice, SegmentHandle};
//! let forged = BufferSlice { segment: SegmentHandle { id: 1, addr: 0x1000 }, offset: 0, len: 1 << 30 };
//! ```
//!
//! and a backend cannot be told to touch memory without `unsafe`:
//!
//! ```compile_fail
//! fn launch(backend: &dyn cartage_core::Backend, kernel: &cartage_core::Kernel) {
//!     let _ = backend.launch(kernel);
//! }
//! ```
//!
//! while the sound path needs neither:
//!
//! ```
//! use std::sync::Arc;
//! use cartage_core::{Backend, DType, DeviceBuffer, Kernel, Layout, Scalar};
//! fn fill(backend: &Arc<dyn Backend>) -> cartage_core::Result<()> {
//!     let out = DeviceBuffer::new(backend, 16)?;
//!     let kernel = Kernel::Fill { out: out.arg(Layout::contiguous(&[4])?, DType::F32), value: Scalar::Float(0.0) };
//!     kernel.run(&[&out])
//! }
//! ```

pub use crate::allocator::{Allocation, BufferSlice, EXTERNAL_SEGMENT_ID, SegmentError, SegmentHandle, SegmentSource};
pub use crate::buffer::ExternalOwner;
