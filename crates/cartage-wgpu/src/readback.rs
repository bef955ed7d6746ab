//! Read-back through pooled staging buffers: copy into a `MAP_READ` buffer, submit, map, poll
//! until the map completes, copy out, unmap, and keep the staging buffer for the next read.
//!
//! Staging buffers come in power-of-two size classes from 64 KiB; the pool keeps at most
//! [`POOL_BYTES`] of them, larger ones are dropped after use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::mpsc;

use cartage_core::raw::SegmentError;
use cartage_core::{Error, Result};

use crate::context::GpuContext;

/// Total bytes of idle staging buffers kept for reuse.
const POOL_BYTES: u64 = 256 << 20;
/// The smallest staging buffer.
const MIN_STAGING: u64 = 64 << 10;

/// A pool of `MAP_READ | COPY_DST` buffers.
#[derive(Default)]
pub(crate) struct StagingPool {
    idle: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
}

impl StagingPool {
    /// A staging buffer of at least `bytes` bytes.
    pub fn take(&self, ctx: &GpuContext, bytes: u64) -> std::result::Result<wgpu::Buffer, SegmentError> {
        let class = bytes.max(MIN_STAGING).next_power_of_two();
        if let Some(buffer) = self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&class)
            .and_then(Vec::pop)
        {
            return Ok(buffer);
        }
        ctx.create_buffer(
            "cartage read-back staging",
            class,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// Return a staging buffer (unmapped) to the pool.
    pub fn give_back(&self, buffer: wgpu::Buffer) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let held: u64 = idle.iter().map(|(class, list)| class * list.len() as u64).sum();
        if held + buffer.size() <= POOL_BYTES {
            idle.entry(buffer.size()).or_default().push(buffer);
        }
    }

    /// Drop every idle staging buffer.
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Map `staging[..len]` for reading once `submission` has completed, and copy it to `dst`
/// starting at byte `skip` of the mapped range.
pub(crate) fn map_and_copy(
    ctx: &GpuContext,
    staging: &wgpu::Buffer,
    submission: Option<wgpu::SubmissionIndex>,
    len: u64,
    skip: usize,
    dst: &mut [u8],
) -> Result<()> {
    let (sender, receiver) = mpsc::channel();
    let slice = staging.slice(..len);
    slice.map_async(wgpu::MapMode::Read, move |result| {
        let _ = sender.send(result);
    });
    ctx.wait_for(submission, "read")?;
    receiver
        .recv()
        .map_err(|_| driver(ctx, "the map callback never ran"))?
        .map_err(|e| driver(ctx, &format!("mapping the staging buffer failed: {e}")))?;
    let _: () = ();
    {
        let view = slice
            .get_mapped_range()
            .map_err(|e| driver(ctx, &format!("the mapped range is not readable: {e}")))?;
        dst.copy_from_slice(&view[skip..skip + dst.len()]);
    }
    staging.unmap();
    Ok(())
}

fn driver(ctx: &GpuContext, message: &str) -> Error {
    Error::Driver {
        device: ctx.cartage_device,
        op: "read",
        message: message.to_string(),
    }
}
