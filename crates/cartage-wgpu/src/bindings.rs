//! Binding windows and the bind-group cache.
//!
//! An operand lives in a sub-range of a segment buffer. When the whole segment fits one storage
//! binding (`max_storage_buffer_binding_size`), the kernel binds the whole segment and receives
//! the operand's element offset: consecutive ops on tensors of the same segments then share one
//! bind group, found in [`BindGroupCache`] instead of being created per op. A segment larger than
//! the limit is bound through a window around the operand, aligned to the adapter's storage-offset
//! alignment; an operand whose own extent exceeds the limit cannot be bound (callers chunk
//! element-wise work or return a typed error naming the limit).

use std::collections::HashMap;
use std::sync::Mutex;

use cartage_core::{Error, Result, TensorArg};

use crate::context::GpuContext;
use crate::memory::SegmentTable;

/// A byte range of a segment bound to one storage binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Window {
    /// Segment id.
    pub segment: u64,
    /// First byte bound.
    pub offset: u64,
    /// Bytes bound (a multiple of 4).
    pub size: u64,
}

/// An operand's window and the element offset of its view's first element inside it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    /// The bound range.
    pub window: Window,
    /// `layout.offset` plus the buffer's start, in elements of the operand's dtype, counted
    /// from the window's first byte.
    pub element_offset: u64,
}

/// Round `n` down to a multiple of `to`.
pub(crate) fn align_down(n: u64, to: u64) -> u64 {
    n / to * to
}

/// Round `n` up to a multiple of `to`.
pub(crate) fn align_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// The window to bind for `arg` on `op`. `range` restricts it to a byte range of the segment
/// (a chunk of a contiguous operand); then `element_offset` counts from the range's first byte,
/// otherwise from the view's first element.
///
/// The bound range never leaves the segment: the operand's buffer and the byte range the kernel
/// addresses are checked against the segment's size here, on every build (shaders are compiled
/// without wgpu's own bounds checks unless `CARTAGE_WGPU_CHECKED=1`).
pub(crate) fn bind_operand(
    ctx: &GpuContext,
    table: &SegmentTable,
    arg: &TensorArg,
    op: &str,
    range: Option<(u64, u64)>,
) -> Result<Bound> {
    let segment = arg.buffer.segment().id;
    let Some(seg_size) = table.size(segment) else {
        return Err(unknown_segment(op, segment));
    };
    let es = arg.dtype.size_in_bytes() as u64;
    let buffer_start = arg.buffer.offset() as u64;
    let view_start = arg.byte_offset() as u64;
    let (lo, hi) = range.unwrap_or_else(|| match arg.layout.extent() as u64 {
        // No element is read or written: bind the buffer's start, whatever the view's offset.
        0 => (buffer_start, buffer_start),
        extent => (view_start, buffer_start.saturating_add(extent.saturating_mul(es))),
    });
    let buffer_end = buffer_start.saturating_add(arg.buffer.len() as u64);
    if buffer_end > seg_size || lo > seg_size || hi > seg_size {
        return Err(outside_segment(
            op,
            segment,
            seg_size,
            lo.min(buffer_start),
            hi.max(buffer_end),
        ));
    }
    let max = ctx.max_binding();
    let window = if seg_size <= max {
        Window {
            segment,
            offset: 0,
            size: seg_size,
        }
    } else {
        let start = align_down(lo, ctx.binding_alignment());
        let end = align_up(hi.max(start + 4), 16).min(seg_size);
        let size = end.saturating_sub(start);
        if size > max {
            return Err(binding_limit_error(ctx, arg, op, size));
        }
        Window {
            segment,
            offset: start,
            size,
        }
    };
    Ok(Bound {
        window,
        element_offset: (lo - window.offset) / es,
    })
}

#[cold]
fn unknown_segment(op: &str, segment: u64) -> Error {
    Error::invalid(
        "launch",
        format!(
            "`{op}`: operand refers to segment {segment}, which this wgpu device does not hold (freed, or from another device)"
        ),
    )
}

#[cold]
fn outside_segment(op: &str, segment: u64, size: u64, lo: u64, hi: u64) -> Error {
    Error::invalid(
        "launch",
        format!(
            "`{op}`: an operand addresses bytes {lo}..{hi} of segment {segment}, which holds {size} bytes; \
             its buffer does not come from this device's allocator"
        ),
    )
}

/// The typed error for an operand too large for one storage binding.
pub(crate) fn binding_limit_error(ctx: &GpuContext, arg: &TensorArg, op: &str, bytes: u64) -> Error {
    Error::unsupported(
        op,
        arg.dtype,
        ctx.cartage_device,
        format!(
            "an operand of shape {:?} spans {} but this adapter binds at most {} per storage buffer \
             (max_storage_buffer_binding_size); this op has no chunked form for such operands: split the tensor",
            arg.layout.shape(),
            cartage_core::format_bytes(bytes),
            cartage_core::format_bytes(ctx.max_binding())
        ),
    )
}

/// The cache key of a bind group: the layout (number of storage bindings) and the windows.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    /// Index of the bind-group layout (one per storage-binding count).
    pub layout: usize,
    /// The windows, in binding order.
    pub windows: Vec<Window>,
}

/// Bind groups by their windows, dropped when a segment they use is released.
#[derive(Default)]
pub(crate) struct BindGroupCache {
    map: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
}

/// Beyond this many cached bind groups the cache starts over.
const CACHE_LIMIT: usize = 16384;

impl BindGroupCache {
    /// The bind group for `key`, created with `create` on a miss.
    pub fn get_or_create(
        &self,
        key: BindKey,
        create: impl FnOnce(&BindKey) -> Result<wgpu::BindGroup>,
    ) -> Result<wgpu::BindGroup> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(group) = map.get(&key) {
            return Ok(group.clone());
        }
        let group = create(&key)?;
        if map.len() >= CACHE_LIMIT {
            map.clear();
        }
        map.insert(key, group.clone());
        Ok(group)
    }

    /// Drop every bind group that uses segment `id` (it is being released).
    pub fn forget_segment(&self, id: u64) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|key, _| key.windows.iter().all(|w| w.segment != id));
    }
}
