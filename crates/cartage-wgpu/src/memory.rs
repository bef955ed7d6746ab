//! Device memory: wgpu buffers as the segments of core's [`CachingAllocator`].
//!
//! Each segment is one `wgpu::Buffer` (`STORAGE | COPY_SRC | COPY_DST`) in a table keyed by the
//! segment id; [`SegmentHandle::addr`] is unused (0). The allocator hands out sub-ranges of
//! segments, so kernels bind a segment with an offset and a size (see `bindings.rs`). Blocks are
//! rounded to a multiple of the adapter's storage-offset alignment, so every block starts at an
//! offset a binding may use.
//!
//! wgpu cannot report free device memory; [`SegmentSource::memory_info`] therefore answers
//! `None` and an out-of-memory report carries the allocator's own figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cartage_core::raw::{SegmentError, SegmentHandle, SegmentSource};
use cartage_core::{AllocatorConfig, MemoryInfo};

use crate::bindings::BindGroupCache;
use crate::context::GpuContext;

/// The buffers behind the allocator's segments.
#[derive(Default)]
pub(crate) struct SegmentTable {
    buffers: RwLock<HashMap<u64, wgpu::Buffer>>,
    next_id: AtomicU64,
}

impl SegmentTable {
    /// The buffer of segment `id` (a cheap handle clone), if it exists.
    pub fn get(&self, id: u64) -> Option<wgpu::Buffer> {
        self.buffers.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// The size in bytes of segment `id`, if it exists.
    pub fn size(&self, id: u64) -> Option<u64> {
        self.buffers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .map(wgpu::Buffer::size)
    }

    /// Register a buffer under a fresh id (segments, and internal buffers kernels bind).
    pub fn insert(&self, buffer: wgpu::Buffer) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, buffer);
        id
    }

    /// Unregister buffer `id` (a released segment, or an internal buffer replaced).
    pub fn remove(&self, id: u64) -> Option<wgpu::Buffer> {
        self.buffers.write().unwrap_or_else(|p| p.into_inner()).remove(&id)
    }
}

/// The [`SegmentSource`] of a wgpu device.
pub(crate) struct BufferSource {
    ctx: Arc<GpuContext>,
    table: Arc<SegmentTable>,
    bind_groups: Arc<BindGroupCache>,
}

impl BufferSource {
    /// A source creating buffers on `ctx`, registering them in `table`.
    pub fn new(ctx: Arc<GpuContext>, table: Arc<SegmentTable>, bind_groups: Arc<BindGroupCache>) -> Self {
        BufferSource {
            ctx,
            table,
            bind_groups,
        }
    }
}

/// Usages of every segment buffer.
pub(crate) const SEGMENT_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl SegmentSource for BufferSource {
    fn allocate_segment(&self, bytes: usize) -> Result<SegmentHandle, SegmentError> {
        let buffer = self.ctx.create_buffer("cartage segment", bytes as u64, SEGMENT_USAGE)?;
        let id = self.table.insert(buffer);
        tracing::trace!(id, bytes, "wgpu segment allocated");
        Ok(SegmentHandle { id, addr: 0 })
    }

    /// # Safety
    /// As the trait says: `segment` came from this source, is released once, and nothing in use
    /// refers to it. Work already submitted keeps the buffer alive inside wgpu until it
    /// completes, so dropping our handle here never frees memory a queued kernel reads.
    unsafe fn release_segment(&self, segment: SegmentHandle) {
        self.bind_groups.forget_segment(segment.id);
        if self.table.remove(segment.id).is_none() {
            tracing::error!(id = segment.id, "release of an unknown wgpu segment (ignored)");
        }
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }
}

/// The allocator configuration for `ctx`: blocks rounded to the storage-offset alignment.
pub(crate) fn allocator_config(ctx: &GpuContext) -> AllocatorConfig {
    let defaults = AllocatorConfig::default();
    let round = (ctx.binding_alignment() as usize)
        .max(defaults.round)
        .next_power_of_two();
    AllocatorConfig { round, ..defaults }
}
