//! Pinned host memory on wgpu: a [`PinnedBuffer`] is a host-visible wgpu buffer that stays
//! mapped while the caller reads and writes it in place, and is unmapped only for the length
//! of a device copy into or out of it (no extra host copy either way).
//!
//! One buffer serves both directions, so it is `MAP_READ | COPY_SRC | COPY_DST` (the adapter
//! feature `MAPPABLE_PRIMARY_BUFFERS` allows the combination). wgpu places `MAP_READ` buffers
//! in host memory the CPU caches, which the device reads and writes over the bus like CUDA's
//! page-locked memory; a `MAP_WRITE` buffer would be write-combined memory, often on the
//! device itself, and slow for the CPU to read back from. The mapping is persistent on Vulkan
//! and Metal (the driver maps the memory once, at allocation), so the address a buffer hands
//! out stays valid across its unmap/map cycles; other wgpu backends get no pinned memory, and
//! every remap checks that the address did not move.
//!
//! A copy: wait for the previous copy on the buffer, unmap it, record the copy in the shared
//! recorder (after the work recorded before it), submit, and ask for the mapping back. The
//! copy is complete when the mapping is: [`MappedCopy`] is its [`CopyCompletion`].
//!
//! wgpu runs a map callback on whichever thread's poll finds the mapping resolved. Once the
//! copy's submission is done, the callback has run or is running on another thread that polled
//! at the same moment; a waiter therefore waits for the callback's signal (bounded by
//! [`MAP_CALLBACK_TIMEOUT`]) instead of concluding from its own poll that the mapping never came.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cartage_core::pinned::host_oom;
use cartage_core::raw::SegmentError;
use cartage_core::{CopyCompletion, Error, PinnedBuffer, Result};

use crate::backend::WgpuBackend;
use crate::context::GpuContext;

/// Usages of a pinned buffer: mapped for the host, copied both ways by the device.
const PINNED_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::MAP_READ
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Which way a copy moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Pinned host buffer → device memory.
    Upload,
    /// Device memory → pinned host buffer.
    Download,
}

/// A live pinned buffer: its wgpu buffer and the last copy started on it.
struct Entry {
    buffer: wgpu::Buffer,
    len: usize,
    pending: Option<Arc<MappedCopy>>,
}

/// The pinned buffers of one device, by the address of their first byte.
#[derive(Default)]
pub(crate) struct PinnedBuffers {
    live: Arc<Mutex<HashMap<usize, Entry>>>,
}

/// The size of the mapped buffer behind `bytes` bytes of pinned memory: at least 1 byte, rounded
/// up to a multiple of 4 (map ranges must be), or `None` when that overflows or exceeds `max`
/// (the adapter's `max_buffer_size`).
fn mapped_size(bytes: usize, max: u64) -> Option<u64> {
    u64::try_from(bytes.max(1))
        .ok()
        .and_then(|b| b.checked_next_multiple_of(4))
        .filter(|&size| size <= max)
}

/// Why pinned memory is unavailable on `ctx`'s adapter, or `None` when it is available.
pub(crate) fn unavailable(ctx: &GpuContext) -> Option<&'static str> {
    if !matches!(ctx.info.backend, wgpu::Backend::Vulkan | wgpu::Backend::Metal) {
        return Some(
            "pinned memory is a persistently mapped wgpu buffer, which only the Vulkan and Metal backends keep at one address; use alloc_staging() (ordinary memory here)",
        );
    }
    if !ctx.has(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS) {
        return Some(
            "the adapter lacks the wgpu feature MAPPABLE_PRIMARY_BUFFERS, which a mapped buffer copied both ways needs; use alloc_staging() (ordinary memory here)",
        );
    }
    None
}

impl PinnedBuffers {
    /// A mapped host buffer of `bytes` bytes, zeroed.
    pub fn alloc(&self, ctx: &Arc<GpuContext>, bytes: usize) -> Result<PinnedBuffer> {
        if let Some(reason) = unavailable(ctx) {
            return Err(Error::unsupported_feature("alloc_pinned", ctx.cartage_device, reason));
        }
        // Map ranges must be non-empty multiples of 4 bytes. Rounded with checked arithmetic (a
        // wrapped size would map a buffer shorter than the `bytes` the PinnedBuffer claims) and
        // refused past the adapter's largest buffer.
        let max = ctx.limits.max_buffer_size;
        let size = mapped_size(bytes, max).ok_or_else(|| {
            host_oom(
                bytes,
                &format!(
                    "a mapped buffer of {bytes} bytes exceeds the adapter's max_buffer_size ({max} bytes); \
                         copy in smaller pieces or use alloc_staging() with a smaller size"
                ),
            )
        })?;
        let buffer = ctx
            .create_buffer("cartage pinned host buffer", size, PINNED_USAGE)
            .map_err(|e| match e {
                SegmentError::OutOfMemory => host_oom(
                    bytes,
                    "the wgpu adapter has no host-visible memory for a mapped buffer of this size",
                ),
                SegmentError::Failed(e) => e,
            })?;
        let (sender, receiver) = std::sync::mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, .., move |result| {
            let _ = sender.send(result);
        });
        ctx.wait_for(None, "alloc_pinned")?;
        receiver
            .recv()
            .map_err(|_| driver(ctx, "alloc_pinned", "the map callback never ran"))?
            .map_err(|e| driver(ctx, "alloc_pinned", &format!("mapping the host buffer failed: {e}")))?;
        let address = mapped_address(ctx, &buffer, "alloc_pinned")?;
        let ptr = NonNull::new(address as *mut u8)
            .ok_or_else(|| driver(ctx, "alloc_pinned", "the mapped range has a null address"))?;
        let entry = Entry {
            buffer,
            len: bytes,
            pending: None,
        };
        lock(&self.live).insert(address, entry);
        let live = Arc::clone(&self.live);
        let release = Box::new(move |ptr: NonNull<u8>, _len: usize| {
            // The buffer waited for the copy it tracks before releasing, and every copy on it is
            // tracked: dropping the wgpu buffer here frees memory no copy uses any more.
            if lock(&live).remove(&(ptr.as_ptr() as usize)).is_none() {
                tracing::error!("release of an unknown wgpu pinned buffer (ignored)");
            }
        });
        // SAFETY: `ptr` is the start of the buffer's mapped range of `size >= bytes` bytes, valid
        // for reads and writes (host-visible, coherent memory, mapped for the buffer's life on the
        // Vulkan and Metal backends, the only ones admitted above) and zeroed by wgpu when first
        // mapped. It is aliased only by the device copies this module starts, each tracked by the
        // buffer. The wgpu buffer lives in `live` until `release` removes it, once, at drop.
        Ok(unsafe { PinnedBuffer::from_raw(ptr, bytes, ctx.cartage_device, release) })
    }

    /// Start copying `len` bytes between the pinned buffer starting at `host` and
    /// `device[device_offset..]`, in the direction `direction`. `len` and `device_offset` are
    /// multiples of 4.
    pub fn start(
        &self,
        backend: &WgpuBackend,
        host: *const u8,
        direction: Direction,
        device: &wgpu::Buffer,
        device_offset: u64,
        len: usize,
    ) -> Result<Arc<MappedCopy>> {
        let ctx = &backend.ctx;
        let op = match direction {
            Direction::Upload => "write_async",
            Direction::Download => "read_async",
        };
        let address = host as usize;
        // A copy still running on the buffer (its handle forgotten, or a second upload from the
        // same buffer on another thread) finishes before the buffer is unmapped again.
        let mut live = loop {
            let live = lock(&self.live);
            let Some(entry) = live.get(&address) else {
                return Err(Error::invalid(
                    op,
                    format!(
                        "the pinned buffer at {address:#x} was not allocated by {}; allocate it with alloc_pinned on this device",
                        ctx.cartage_device
                    ),
                ));
            };
            if len > entry.len {
                return Err(Error::invalid(
                    op,
                    format!("the copy moves {len} bytes but the pinned buffer holds {}", entry.len),
                ));
            }
            match entry.pending.as_ref().map(|p| (p.settle(), p)) {
                Some((None, pending)) => {
                    let pending = Arc::clone(pending);
                    drop(live);
                    pending.wait()?;
                }
                Some((Some(Err(message)), _)) => {
                    return Err(driver(
                        ctx,
                        op,
                        &format!("an earlier copy on this pinned buffer failed ({message}); allocate a new one"),
                    ));
                }
                Some((Some(Ok(())), _)) | None => break live,
            }
        };
        let entry = live
            .get_mut(&address)
            .ok_or_else(|| Error::invalid(op, "the pinned buffer was released during the copy"))?;
        entry.buffer.unmap();
        let submission = {
            let mut recorder = backend.lock_recorder();
            match direction {
                Direction::Upload => recorder.copy(ctx, &entry.buffer, 0, device, device_offset, len as u64),
                Direction::Download => recorder.copy(ctx, device, device_offset, &entry.buffer, 0, len as u64),
            }
            recorder.submit(ctx)
        };
        let state: Arc<Mutex<MapState>> = Arc::new(Mutex::new(MapState::Waiting));
        let changed = Arc::new(Condvar::new());
        let (sink, signal) = (Arc::clone(&state), Arc::clone(&changed));
        entry.buffer.map_async(wgpu::MapMode::Read, .., move |result| {
            *lock(&sink) = match result {
                Ok(()) => MapState::Mapped,
                Err(e) => MapState::Done(Err(format!("mapping the pinned buffer back failed: {e}"))),
            };
            signal.notify_all();
        });
        let copy = Arc::new(MappedCopy {
            ctx: Arc::clone(ctx),
            buffer: entry.buffer.clone(),
            address,
            op,
            submission,
            state,
            changed,
        });
        entry.pending = Some(Arc::clone(&copy));
        Ok(copy)
    }
}

/// The state of a pinned buffer's mapping after a copy.
enum MapState {
    /// The copy (and the remap after it) is still running.
    Waiting,
    /// Mapped again; the address is not checked yet.
    Mapped,
    /// Finished: mapped at the buffer's address, or why not.
    Done(std::result::Result<(), String>),
}

/// The completion of a copy into or out of a pinned buffer: the buffer mapped again, at the
/// address the [`PinnedBuffer`] holds.
pub(crate) struct MappedCopy {
    ctx: Arc<GpuContext>,
    buffer: wgpu::Buffer,
    address: usize,
    op: &'static str,
    submission: Option<wgpu::SubmissionIndex>,
    state: Arc<Mutex<MapState>>,
    /// Notified by the map callback when it has set `state`.
    changed: Arc<Condvar>,
}

/// How long a waiter gives a map callback, once the copy's submission is done, before it reports
/// the mapping as lost.
const MAP_CALLBACK_TIMEOUT: Duration = Duration::from_secs(10);

impl MappedCopy {
    /// Turn `Mapped` into `Done`, checking that the mapping kept its address; the final result,
    /// or `None` while the copy is running.
    fn settle(&self) -> Option<std::result::Result<(), String>> {
        let mut state = lock(&self.state);
        match &*state {
            MapState::Waiting => None,
            MapState::Done(result) => Some(result.clone()),
            MapState::Mapped => {
                let result = match mapped_address(&self.ctx, &self.buffer, self.op) {
                    Ok(address) if address == self.address => Ok(()),
                    Ok(address) => Err(format!(
                        "the pinned buffer was mapped back at {address:#x}, not at {:#x}",
                        self.address
                    )),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = &result {
                    tracing::error!(device = %self.ctx.cartage_device, error = %e, "pinned buffer remap failed");
                }
                *state = MapState::Done(result.clone());
                Some(result)
            }
        }
    }
}

impl CopyCompletion for MappedCopy {
    fn wait(&self) -> Result<()> {
        if self.settle().is_none() {
            // Map callbacks run inside the poll; the state lock is not held here.
            self.ctx.wait_for(self.submission.clone(), self.op)?;
        }
        if self.settle().is_none() {
            self.ctx.wait_for(None, self.op)?;
        }
        // Another thread's poll may have taken the callback and not run it yet: wait for its
        // signal, polling now and then in case no poll has resolved the mapping at all.
        let deadline = Instant::now() + MAP_CALLBACK_TIMEOUT;
        loop {
            match self.settle() {
                Some(Ok(())) => return Ok(()),
                Some(Err(message)) => return Err(driver(&self.ctx, self.op, &message)),
                None if Instant::now() >= deadline => {
                    let message = format!(
                        "the copy's buffer was never mapped back (its map callback did not run within {} s of the copy finishing)",
                        MAP_CALLBACK_TIMEOUT.as_secs()
                    );
                    return Err(driver(&self.ctx, self.op, &message));
                }
                None => {
                    let state = lock(&self.state);
                    if matches!(*state, MapState::Waiting) {
                        drop(
                            self.changed
                                .wait_timeout(state, Duration::from_millis(1))
                                .unwrap_or_else(|p| p.into_inner()),
                        );
                    }
                    let _ = self.ctx.device.poll(wgpu::PollType::Poll);
                }
            }
        }
    }

    fn is_done(&self) -> bool {
        if self.settle().is_some() {
            return true;
        }
        let _ = self.ctx.device.poll(wgpu::PollType::Poll);
        self.settle().is_some()
    }
}

/// The address of `buffer`'s mapped range (the buffer is mapped for reading).
fn mapped_address(ctx: &GpuContext, buffer: &wgpu::Buffer, op: &'static str) -> Result<usize> {
    let view = buffer
        .get_mapped_range(..)
        .map_err(|e| driver(ctx, op, &format!("the mapped range is not readable: {e}")))?;
    Ok(view.as_ptr() as usize)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn driver(ctx: &GpuContext, op: &'static str, message: &str) -> Error {
    Error::Driver {
        device: ctx.cartage_device,
        op,
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::mapped_size;

    #[test]
    fn mapped_sizes_never_wrap() {
        assert_eq!(mapped_size(0, u64::MAX), Some(4));
        assert_eq!(mapped_size(5, u64::MAX), Some(8));
        assert_eq!(mapped_size(8, 8), Some(8));
        assert_eq!(mapped_size(9, 8), None);
        // Rounding these up to a multiple of 4 overflows u64 (it used to wrap to 0).
        for bytes in [usize::MAX, usize::MAX - 1, usize::MAX - 2] {
            assert_eq!(mapped_size(bytes, u64::MAX), None, "{bytes}");
        }
        assert_eq!(mapped_size(usize::MAX - 3, u64::MAX), Some(usize::MAX as u64 - 3));
    }
}
