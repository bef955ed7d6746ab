//! [`DeviceBuffer`] and [`Kernel::run`]: the sound way to reach device memory.
//!
//! The backend methods that touch memory take raw [`BufferSlice`]s and are `unsafe fn`: a slice
//! is a plain value that can outlive its block. A `DeviceBuffer` owns its block (it frees it when
//! dropped), so while one is borrowed its memory is live. Every method here checks that the
//! bytes it names lie inside the borrowed buffers, then calls the backend: safe code cannot
//! reach memory it does not hold. The frontend's tensors and the conformance suite use only this
//! path.
//!
//! ```
//! use std::sync::Arc;
//! use cartage_core::{Backend, DType, DeviceBuffer, Kernel, Layout, Scalar};
//! # fn demo(backend: Arc<dyn Backend>) -> cartage_core::Result<()> {
//! let out = DeviceBuffer::new(&backend, 4 * 4)?;
//! let fill = Kernel::Fill { out: out.arg(Layout::contiguous(&[4])?, DType::F32), value: Scalar::Float(1.5) };
//! fill.run(&[&out])?; // refused if an operand were not inside `out`
//! let mut bytes = [0u8; 16];
//! out.read(0, &mut bytes)?;
//! assert_eq!(f32::from_le_bytes(bytes[..4].try_into().unwrap()), 1.5);
//! # Ok(()) }
//! ```

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use crate::allocator::{Allocation, BufferSlice};
use crate::backend::Backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result, Site};
use crate::kernel::{Kernel, TensorArg};
use crate::layout::Layout;
use crate::pinned::{CopyHandle, HostStaging};

/// Device memory owned by one value: allocated from the backend's caching allocator, given back
/// when dropped (in stream order on asynchronous devices).
pub struct DeviceBuffer {
    backend: Arc<dyn Backend>,
    allocation: Option<Allocation>,
    /// The owner of imported memory ([`DeviceBuffer::import_external`]), dropped after the
    /// device has finished with the memory; `None` for memory of the caching allocator.
    external: Option<ExternalOwner>,
    /// The allocation's bytes, kept beside it so that the launch path reads a plain field.
    slice: BufferSlice,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.backend.device())
            .field("bytes", &self.len())
            .finish()
    }
}

impl DeviceBuffer {
    /// `bytes` bytes on `backend`, recording the caller as the creation site (shown on OOM).
    #[track_caller]
    pub fn new(backend: &Arc<dyn Backend>, bytes: usize) -> Result<Self> {
        Self::new_at(backend, bytes, Location::caller())
    }

    /// `bytes` bytes on `backend`, recording `site` as the creation site.
    pub fn new_at(backend: &Arc<dyn Backend>, bytes: usize, site: Site) -> Result<Self> {
        let allocation = backend.alloc(bytes, site)?;
        Ok(DeviceBuffer {
            backend: Arc::clone(backend),
            slice: allocation.slice(),
            allocation: Some(allocation),
            external: None,
        })
    }

    /// `len` bytes at `addr` that cartage did not allocate (another framework's tensor,
    /// imported through DLPack), owned by `owner`: the buffer drops `owner` (which gives the
    /// memory back to its framework) when it is dropped, after the device has finished every
    /// queued use of it ([`Backend::release_external`]). On error `owner` is dropped at once.
    ///
    /// The device checks the address first ([`Backend::check_external`]), and the allocator
    /// names the range with a slice of its own (see [`crate::raw`]): inside the cartage block it
    /// lies in, or else in the allocator's imported segment at its address, so the buffer's
    /// identity cannot be confused with another allocator's and overlapping imports are seen to
    /// overlap. The memory is not counted in [`crate::MemoryStats`] and never enters the cache.
    ///
    /// # Safety
    /// The `len` bytes at `addr` are memory this device's kernels and copies may read and write
    /// (host memory on the CPU; device memory reachable from the device's primary context on
    /// CUDA), and stay so until `owner` is dropped. While the buffer lives, nothing outside
    /// cartage writes the memory concurrently with cartage's work on it.
    pub unsafe fn import_external(
        backend: &Arc<dyn Backend>,
        addr: u64,
        len: usize,
        owner: ExternalOwner,
    ) -> Result<Self> {
        backend.check_external(addr, len)?;
        let slice = backend.allocator().external_slice(addr, len)?;
        Ok(DeviceBuffer {
            backend: Arc::clone(backend),
            slice,
            allocation: None,
            external: Some(owner),
        })
    }

    /// True when the memory was imported ([`DeviceBuffer::import_external`]) rather than
    /// allocated by cartage.
    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    /// The backend that owns the memory.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The device of the memory.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The buffer's bytes (exactly the bytes asked for).
    #[inline]
    pub fn slice(&self) -> BufferSlice {
        self.slice
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.slice().len()
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A kernel operand viewing this buffer through `layout` as `dtype`.
    #[inline]
    pub fn arg(&self, layout: Layout, dtype: DType) -> TensorArg {
        TensorArg {
            buffer: self.slice(),
            layout,
            dtype,
        }
    }

    /// Bytes `offset..offset + len` of the buffer, or an error naming the overrun.
    pub fn range(&self, offset: usize, len: usize) -> Result<BufferSlice> {
        self.slice().slice(offset, len)
    }

    /// Copy `src` into the buffer at byte `offset`; returns when `src` may be reused.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(offset, src.len())?;
        // SAFETY: `dst` lies inside this buffer's live block, which `&self` keeps alive.
        unsafe { self.backend.write(dst, src) }
    }

    /// Copy the buffer's bytes from `offset` into `dst` (a host synchronisation).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len())?;
        // SAFETY: `src` lies inside this buffer's live block, which `&self` keeps alive.
        unsafe { self.backend.read(src, dst) }
    }

    /// Copy `len` bytes from `src` at `src_offset` into this buffer at `offset`, on one device.
    /// Overlapping ranges of one buffer are refused.
    pub fn copy_from(&self, offset: usize, src: &DeviceBuffer, src_offset: usize, len: usize) -> Result<()> {
        if !Arc::ptr_eq(&self.backend, &src.backend) {
            return Err(Error::invalid(
                "copy_from",
                format!(
                    "the buffers live on {} and {}; copy between devices with copy_to_peer or through the host",
                    src.device(),
                    self.device()
                ),
            ));
        }
        let (to, from) = (self.range(offset, len)?, src.range(src_offset, len)?);
        if to.same_segment(&from) && to.offset() < from.offset() + len && from.offset() < to.offset() + len {
            return Err(Error::invalid(
                "copy_from",
                "the source and destination byte ranges overlap; copy through a temporary buffer",
            ));
        }
        // SAFETY: both ranges lie inside live blocks of this backend held by `&self` and `&src`.
        unsafe { self.backend.copy_within(from, to) }
    }

    /// Start copying the first `len` bytes of `src` into the buffer at `offset`; `src` stays
    /// borrowed until the handle completes.
    pub fn write_async<'a>(&self, offset: usize, src: &'a dyn HostStaging, len: usize) -> Result<CopyHandle<'a>> {
        host_fits("write_async", len, src.len())?;
        let dst = self.range(offset, len)?;
        // SAFETY: `dst` lies inside this buffer's live block; the block is freed only in stream
        // order, after the copy, even if the buffer is dropped before the handle completes.
        unsafe { self.backend.write_async(dst, src) }
    }

    /// Start copying `len` bytes of the buffer from `offset` into the front of `dst`; `dst`
    /// stays borrowed until the handle completes.
    pub fn read_async<'a>(&self, offset: usize, dst: &'a mut dyn HostStaging, len: usize) -> Result<CopyHandle<'a>> {
        host_fits("read_async", len, dst.len())?;
        let src = self.range(offset, len)?;
        // SAFETY: `src` lies inside this buffer's live block (freed only in stream order).
        unsafe { self.backend.read_async(src, dst) }
    }

    /// Copy `len` bytes at `offset` straight into `dst` (another device's buffer) at
    /// `dst_offset`, when the devices can; `Ok(false)` when the caller should stage through the
    /// host.
    pub fn copy_to_peer(&self, offset: usize, dst: &DeviceBuffer, dst_offset: usize, len: usize) -> Result<bool> {
        let (from, to) = (self.range(offset, len)?, dst.range(dst_offset, len)?);
        // SAFETY: both ranges lie inside live blocks held by `&self` and `&dst`, each of the
        // backend that owns it.
        unsafe { self.backend.copy_to_peer(from, dst.backend.as_ref(), to) }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(allocation) = self.allocation.take() {
            self.backend.free(allocation);
        }
        if let Some(owner) = self.external.take() {
            self.backend.release_external(self.slice);
            drop(owner);
        }
    }
}

/// What keeps imported memory alive ([`DeviceBuffer::import_external`]): dropping it gives the
/// memory back to the framework that lent it (a DLPack deleter). It may be dropped on any
/// thread.
pub type ExternalOwner = Box<dyn std::any::Any + Send + Sync>;

impl Kernel {
    /// Launch the kernel soundly: every operand must lie inside one of `buffers`, which are
    /// borrowed (so alive) for the call and must all belong to one backend. The backend then
    /// validates the kernel's structure ([`Kernel::validate`]) and runs it.
    #[inline]
    pub fn run(&self, buffers: &[&DeviceBuffer]) -> Result<()> {
        let backend = self.check_buffers(buffers)?;
        // SAFETY: every operand lies inside a block owned by one of `buffers`, all of this
        // backend, all borrowed (so live) for the duration of the call; blocks are freed in
        // stream order after queued work.
        unsafe { backend.launch(self) }
    }

    /// The one backend of `buffers`, after checking that every operand lies inside one of them.
    #[inline]
    pub(crate) fn check_buffers<'b>(&self, buffers: &[&'b DeviceBuffer]) -> Result<&'b Arc<dyn Backend>> {
        let Some(first) = buffers.first() else {
            return Err(Error::invalid("launch", "a kernel needs the buffers of its operands"));
        };
        let backend = &first.backend;
        for other in &buffers[1..] {
            if !Arc::ptr_eq(backend, &other.backend) {
                return Err(foreign_buffer(self, first.device(), other.device()));
            }
        }
        for arg in self.operand_slots().into_iter().flatten() {
            if !buffers.iter().any(|b| b.slice().contains(&arg.buffer)) {
                return Err(uncovered_operand(self));
            }
        }
        Ok(backend)
    }
}

fn host_fits(op: &'static str, len: usize, host: usize) -> Result<()> {
    if len <= host {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("the host buffer holds {host} bytes but the copy needs {len}"),
        ))
    }
}

#[cold]
fn foreign_buffer(kernel: &Kernel, a: Device, b: Device) -> Error {
    Error::invalid(
        "launch",
        format!(
            "`{}` was given buffers of two backends ({a} and {b}); a kernel runs on one device",
            kernel.op().name()
        ),
    )
}

#[cold]
fn uncovered_operand(kernel: &Kernel) -> Error {
    Error::invalid(
        "launch",
        format!(
            "an operand of `{}` does not lie inside any buffer given to `run`; pass the buffers the \
             operands were made from",
            kernel.op().name()
        ),
    )
}
