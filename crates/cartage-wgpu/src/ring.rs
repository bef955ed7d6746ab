//! Large copies from and to ordinary (pageable) host memory through rings of mapped staging
//! buffers, so that the host copy of one chunk overlaps the device copy of the next and no
//! buffer is created per copy.
//!
//! Uploads: [`UPLOAD_SLOTS`] `MAP_WRITE | COPY_SRC` buffers of [`CHUNK`] bytes, each mapped
//! while it waits for data. A chunk is copied into a mapped slot, the slot is unmapped, its copy
//! to the device recorded and submitted, and the slot asked to map again; the write returns once
//! every chunk is submitted (the source may then be reused: its bytes are in the slots).
//!
//! Read-backs: [`DOWNLOAD_SLOTS`] `MAP_READ | COPY_DST` buffers of [`CHUNK`] bytes. Copies of
//! the first chunks are submitted at once; each chunk is then mapped, copied out and its slot
//! reused for the chunk [`DOWNLOAD_SLOTS`] further on.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use cartage_core::raw::SegmentError;
use cartage_core::{Error, Result};

use crate::backend::WgpuBackend;
use crate::context::GpuContext;

/// Bytes of one staging slot (a copy's chunk).
pub(crate) const CHUNK: u64 = 16 << 20;
/// Upload slots.
const UPLOAD_SLOTS: usize = 4;
/// Read-back slots.
const DOWNLOAD_SLOTS: usize = 4;

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// An upload slot: its buffer and, while it maps again after a copy, where the map's result
/// arrives and the submission it waits for.
struct UploadSlot {
    buffer: wgpu::Buffer,
    remap: Option<(mpsc::Receiver<MapResult>, Option<wgpu::SubmissionIndex>)>,
}

/// The staging rings of one device, created at their first use.
#[derive(Default)]
pub(crate) struct Rings {
    upload: Mutex<Vec<UploadSlot>>,
    download: Mutex<Vec<wgpu::Buffer>>,
}

impl Rings {
    /// Copy `src` to `dst[offset..]` (`offset` and `src.len()` multiples of 4) through the
    /// upload ring, after the work recorded so far.
    pub fn upload(&self, backend: &WgpuBackend, dst: &wgpu::Buffer, offset: u64, src: &[u8]) -> Result<()> {
        let ctx = &backend.ctx;
        let mut slots = self.upload.lock().unwrap_or_else(|p| p.into_inner());
        if slots.is_empty() {
            for _ in 0..UPLOAD_SLOTS {
                let buffer = ctx
                    .create_buffer_mapped(
                        "cartage upload ring",
                        CHUNK,
                        wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    )
                    .map_err(|e| staging_error(ctx, "write", e))?;
                slots.push(UploadSlot { buffer, remap: None });
            }
        }
        for (i, chunk) in src.chunks(CHUNK as usize).enumerate() {
            let slot = &mut slots[i % UPLOAD_SLOTS];
            if let Some((receiver, submission)) = slot.remap.take() {
                wait_map(ctx, &receiver, submission, "write")?;
            }
            slot.buffer
                .get_mapped_range_mut(..chunk.len() as u64)
                .map_err(|e| driver(ctx, "write", &format!("the upload slot is not writable: {e}")))?
                .copy_from_slice(chunk);
            slot.buffer.unmap();
            let submission = {
                let mut recorder = backend.lock_recorder();
                let at = offset + (i as u64) * CHUNK;
                recorder.copy(ctx, &slot.buffer, 0, dst, at, chunk.len() as u64);
                recorder.submit(ctx)
            };
            let (sender, receiver) = mpsc::channel();
            slot.buffer.map_async(wgpu::MapMode::Write, .., move |result| {
                let _ = sender.send(result);
            });
            slot.remap = Some((receiver, submission));
        }
        Ok(())
    }

    /// Copy `src[lo..lo + 4 * k]` (the aligned range around the bytes wanted) into `dst`, which
    /// receives the bytes from `lo + skip` on.
    pub fn download(
        &self,
        backend: &WgpuBackend,
        src: &wgpu::Buffer,
        lo: u64,
        skip: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let ctx = &backend.ctx;
        let hi = (lo + skip as u64 + dst.len() as u64).div_ceil(4) * 4;
        let mut slots = self.download.lock().unwrap_or_else(|p| p.into_inner());
        if slots.is_empty() {
            for _ in 0..DOWNLOAD_SLOTS {
                let buffer = ctx
                    .create_buffer(
                        "cartage read-back ring",
                        CHUNK,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    )
                    .map_err(|e| staging_error(ctx, "read", e))?;
                slots.push(buffer);
            }
        }
        let chunks = (hi - lo).div_ceil(CHUNK) as usize;
        let range = |k: usize| {
            let start = lo + k as u64 * CHUNK;
            (start, (start + CHUNK).min(hi))
        };
        let mut in_flight = VecDeque::new();
        let issue = |k: usize, in_flight: &mut VecDeque<_>| {
            let buffer = &slots[k % DOWNLOAD_SLOTS];
            let (start, end) = range(k);
            let submission = {
                let mut recorder = backend.lock_recorder();
                recorder.copy(ctx, src, start, buffer, 0, end - start);
                recorder.submit(ctx)
            };
            let (sender, receiver) = mpsc::channel();
            buffer.map_async(wgpu::MapMode::Read, ..end - start, move |result| {
                let _ = sender.send(result);
            });
            in_flight.push_back((receiver, submission));
        };
        for k in 0..chunks.min(DOWNLOAD_SLOTS) {
            issue(k, &mut in_flight);
        }
        let mut result = Ok(());
        for k in 0..chunks {
            let Some((receiver, submission)) = in_flight.pop_front() else {
                break;
            };
            let buffer = &slots[k % DOWNLOAD_SLOTS];
            if result.is_ok() {
                result = wait_map(ctx, &receiver, submission, "read").and_then(|()| {
                    let (start, end) = range(k);
                    let view = buffer
                        .get_mapped_range(..end - start)
                        .map_err(|e| driver(ctx, "read", &format!("the mapped range is not readable: {e}")))?;
                    // The wanted bytes are `lo + skip .. lo + skip + dst.len()`.
                    let first = lo + skip as u64;
                    let from = start.max(first);
                    let to = end.min(first + dst.len() as u64);
                    if from < to {
                        let out = &mut dst[(from - first) as usize..(to - first) as usize];
                        out.copy_from_slice(&view[(from - start) as usize..(to - start) as usize]);
                    }
                    Ok(())
                });
            } else {
                // Drain: every slot must be unmapped before the ring is used again.
                let _ = wait_map(ctx, &receiver, submission, "read");
            }
            buffer.unmap();
            if result.is_ok() && k + DOWNLOAD_SLOTS < chunks {
                issue(k + DOWNLOAD_SLOTS, &mut in_flight);
            }
        }
        result
    }

    /// Drop the rings' buffers (they are created again on the next large copy).
    pub fn clear(&self) {
        self.upload.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.download.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Wait until the map whose result arrives on `receiver` completes (its copy was `submission`).
fn wait_map(
    ctx: &Arc<GpuContext>,
    receiver: &mpsc::Receiver<MapResult>,
    submission: Option<wgpu::SubmissionIndex>,
    op: &'static str,
) -> Result<()> {
    let result = match receiver.try_recv() {
        Ok(result) => result,
        Err(_) => {
            ctx.wait_for(submission, op)?;
            match receiver.try_recv() {
                Ok(result) => result,
                Err(_) => {
                    ctx.wait_for(None, op)?;
                    receiver
                        .recv()
                        .map_err(|_| driver(ctx, op, "the map callback of a staging slot never ran"))?
                }
            }
        }
    };
    result.map_err(|e| driver(ctx, op, &format!("mapping a staging slot failed: {e}")))
}

fn staging_error(ctx: &GpuContext, op: &'static str, e: SegmentError) -> Error {
    match e {
        SegmentError::Failed(e) => e,
        SegmentError::OutOfMemory => driver(
            ctx,
            op,
            &format!("no host-visible memory for the {}-byte staging slots", CHUNK),
        ),
    }
}

fn driver(ctx: &GpuContext, op: &'static str, message: &str) -> Error {
    Error::Driver {
        device: ctx.cartage_device,
        op,
        message: message.to_string(),
    }
}
