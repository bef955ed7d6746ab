//! Device memory for core's caching allocator: [`DeviceMemory`] hands out `cuMemAlloc`
//! segments and frees them with `cuMemFree`; the allocator above it does the pooling, the
//! statistics and the out-of-memory report (DESIGN invariant 6).
//!
//! Freed blocks go back to the pool at once. That is safe in stream order: kernels and
//! synchronous copies all run on the one compute stream, so a block reused by later work runs
//! after the work that used it before; the copy stream, which is not in that order, waits for the
//! compute work of a segment before touching it ([`crate::ordering`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cartage_core::raw::{SegmentError, SegmentHandle, SegmentSource};
use cartage_core::{Device, MemoryInfo};
use cudarc::driver::CudaContext;

use crate::driver;
use crate::ordering::StreamOrder;

/// `cuMemAlloc` / `cuMemFree` segments of one device.
pub struct DeviceMemory {
    device: Device,
    ctx: Arc<CudaContext>,
    order: Arc<StreamOrder>,
    next_id: AtomicU64,
}

impl DeviceMemory {
    /// Segments of `ctx`'s device; releases are reported to `order`.
    pub(crate) fn new(device: Device, ctx: Arc<CudaContext>, order: Arc<StreamOrder>) -> Self {
        DeviceMemory {
            device,
            ctx,
            order,
            next_id: AtomicU64::new(1),
        }
    }
}

impl SegmentSource for DeviceMemory {
    fn allocate_segment(&self, bytes: usize) -> Result<SegmentHandle, SegmentError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| SegmentError::Failed(driver::error(self.device, "bind context")(e)))?;
        // A request beyond the free memory is refused without asking cuMemAlloc, whose failure
        // would be reported as an API error by tools such as compute-sanitizer.
        if driver::mem_info().is_ok_and(|(free, _)| bytes > free) {
            return Err(SegmentError::OutOfMemory);
        }
        match driver::mem_alloc(bytes) {
            Ok(addr) => Ok(SegmentHandle {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                addr,
            }),
            Err(e) if driver::is_out_of_memory(&e) => Err(SegmentError::OutOfMemory),
            Err(e) => Err(SegmentError::Failed(driver::error(self.device, "cuMemAlloc")(e))),
        }
    }

    /// # Safety
    /// `segment` came from [`DeviceMemory::allocate_segment`], is released once, and no live
    /// block refers to it (the trait's contract; queued work is waited for below).
    unsafe fn release_segment(&self, segment: SegmentHandle) {
        self.order.forget_segment(segment.id);
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::error!(device = %self.device, error = %e, "could not bind the context to free a segment");
            return;
        }
        // Blocks of a free segment may still be read by queued work (freed blocks return to the
        // pool at once, and the allocator also empties its cache on the way to an out-of-memory
        // error): wait for the device before giving the memory back. Releases are rare.
        if let Err(e) = self.ctx.synchronize() {
            tracing::error!(device = %self.device, error = %e, "synchronize before cuMemFree failed");
        }
        // SAFETY: the caller releases a segment once and only when none of its blocks is live
        // (the trait's contract), the device has finished all queued work (above), and the
        // address came from `mem_alloc` in this context.
        if let Err(e) = unsafe { driver::mem_free(segment.addr) } {
            tracing::error!(device = %self.device, error = %e, "cuMemFree failed");
        }
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.ctx.bind_to_thread().ok()?;
        driver::mem_info().ok().map(|(free, total)| MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }
}
