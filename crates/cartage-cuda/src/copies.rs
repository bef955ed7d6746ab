//! Copies between the host and a CUDA device, within a device and between two devices.
//!
//! - `write`/`read` from ordinary (pageable) slices are synchronous for the slice and correct in
//!   stream order. Small ones go through the driver; large ones through a reused pool of two
//!   pinned 16 MiB staging buffers, double-buffered so the host copy of one chunk overlaps the
//!   DMA of the other (R9: pageable is slow; this recovers much of pinned bandwidth).
//!   A slice that is itself pinned memory is copied directly and waited for.
//! - `write_async`/`read_async` take a [`PinnedBuffer`] and return a [`CopyHandle`] that borrows
//!   it until the copy's event completes; the copy runs on the copy stream, ordered against the
//!   compute stream per segment ([`crate::ordering`]).
//! - `copy_to_peer` copies cuda:i → cuda:j with `cuMemcpyPeerAsync` (direct when the devices
//!   can address each other), ordered against both devices' compute streams with events.

use std::ptr::NonNull;
use std::sync::Arc;

use cartage_core::{Backend, BufferSlice, CopyCompletion, CopyHandle, Device, Error, PinnedBuffer, Result};
use cudarc::driver::CudaEvent;

use crate::backend::CudaBackend;
use crate::driver;

/// Bytes per staging chunk.
const CHUNK: usize = 16 << 20;
/// Pageable copies up to this size go through the driver's own staging.
const SMALL: usize = 1 << 20;
/// Host threads that copy one chunk into or out of staging memory.
const COPY_THREADS: usize = 4;

/// Two pinned buffers and the events of the last DMA that used each.
pub(crate) struct Staging {
    buffers: [PinnedBuffer; 2],
    events: [CudaEvent; 2],
}

fn check_len(op: &'static str, buffer: BufferSlice, host: usize) -> Result<()> {
    if host > buffer.len {
        return Err(Error::invalid(
            op,
            format!("{host} host bytes do not fit a device range of {} bytes", buffer.len),
        ));
    }
    Ok(())
}

/// Copy `src` into `dst` with several threads when it is large (host memory bandwidth).
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let threads = if src.len() >= 4 << 20 { COPY_THREADS } else { 1 };
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(part).zip(src.chunks(part)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

fn staging<'a>(backend: &CudaBackend, slot: &'a mut Option<Staging>) -> Result<&'a mut Staging> {
    if slot.is_none() {
        let event = || {
            backend
                .ctx
                .new_event(None)
                .map_err(driver::error(backend.device, "create event"))
        };
        *slot = Some(Staging {
            buffers: [alloc_pinned(backend, CHUNK)?, alloc_pinned(backend, CHUNK)?],
            events: [event()?, event()?],
        });
    }
    slot.as_mut()
        .ok_or_else(|| Error::invalid("write", "staging buffers missing"))
}

/// Host → device, synchronous for `src`.
pub(crate) fn write(backend: &CudaBackend, dst: BufferSlice, src: &[u8]) -> Result<()> {
    check_len("write", dst, src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[dst])?;
    let stream = backend.compute.cu_stream();
    let err = driver::error(backend.device, "copy host to device");
    if driver::is_pinned_host(src.as_ptr()) || src.len() <= SMALL {
        // SAFETY: `dst` is a block of this device at least `src.len()` bytes long (checked);
        // pageable `src` is staged by the driver before the call returns, and pinned `src` is
        // waited for below, so `src` outlives its use.
        unsafe { driver::htod_async(dst.addr(), src.as_ptr(), src.len(), stream) }.map_err(&err)?;
        if driver::is_pinned_host(src.as_ptr()) {
            backend
                .compute
                .synchronize()
                .map_err(driver::error(backend.device, "synchronize"))?;
        }
        return Ok(());
    }
    let mut slot = backend.staging.lock().unwrap_or_else(|p| p.into_inner());
    let staging = staging(backend, &mut slot)?;
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let k = i % 2;
        staging.events[k]
            .synchronize()
            .map_err(driver::error(backend.device, "wait for staging"))?;
        parallel_copy(&mut staging.buffers[k].as_mut_slice()[..chunk.len()], chunk);
        // SAFETY: the staging buffer is pinned, holds `chunk`, and is not touched again before
        // its event (recorded next) completes; the destination range lies inside `dst`.
        unsafe {
            driver::htod_async(
                dst.addr() + (i * CHUNK) as u64,
                staging.buffers[k].as_ptr(),
                chunk.len(),
                stream,
            )
        }
        .map_err(&err)?;
        staging.events[k]
            .record(&backend.compute)
            .map_err(driver::error(backend.device, "record event"))?;
    }
    Ok(())
}

/// Device → host; returns with `dst` filled (a host sync).
pub(crate) fn read(backend: &CudaBackend, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
    check_len("read", src, dst.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[src])?;
    let stream = backend.compute.cu_stream();
    let err = driver::error(backend.device, "copy device to host");
    if driver::is_pinned_host(dst.as_ptr()) || dst.len() <= SMALL {
        // SAFETY: `src` is a block of this device at least `dst.len()` bytes long; `dst` is
        // borrowed mutably until the stream is synchronised below.
        unsafe { driver::dtoh_async(dst.as_mut_ptr(), src.addr(), dst.len(), stream) }.map_err(&err)?;
        return backend
            .compute
            .synchronize()
            .map_err(driver::error(backend.device, "synchronize"));
    }
    let mut slot = backend.staging.lock().unwrap_or_else(|p| p.into_inner());
    let staging = staging(backend, &mut slot)?;
    let total = dst.len();
    let chunks = total.div_ceil(CHUNK);
    let issue = |staging: &mut Staging, i: usize| -> Result<()> {
        let k = i % 2;
        let len = CHUNK.min(total - i * CHUNK);
        // SAFETY: the pinned staging buffer `k` is free (its previous chunk was copied out
        // before this call) and is read only after its event completes.
        unsafe {
            driver::dtoh_async(
                staging.buffers[k].as_mut_ptr(),
                src.addr() + (i * CHUNK) as u64,
                len,
                stream,
            )
        }
        .map_err(&err)?;
        staging.events[k]
            .record(&backend.compute)
            .map_err(driver::error(backend.device, "record event"))
    };
    issue(staging, 0)?;
    for i in 0..chunks {
        if i + 1 < chunks {
            issue(staging, i + 1)?;
        }
        let k = i % 2;
        staging.events[k]
            .synchronize()
            .map_err(driver::error(backend.device, "wait for staging"))?;
        let start = i * CHUNK;
        let len = CHUNK.min(total - start);
        parallel_copy(&mut dst[start..start + len], &staging.buffers[k].as_slice()[..len]);
    }
    Ok(())
}

/// Device → device within this device, in stream order.
pub(crate) fn copy_within(backend: &CudaBackend, src: BufferSlice, dst: BufferSlice) -> Result<()> {
    check_len("copy_within", dst, src.len)?;
    if src.len == 0 {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[src, dst])?;
    // SAFETY: both ranges are blocks of this device (`dst` at least `src.len` bytes, checked),
    // queued on the compute stream after their earlier users.
    unsafe { driver::dtod_async(dst.addr(), src.addr(), src.len, backend.compute.cu_stream()) }
        .map_err(driver::error(backend.device, "copy device to device"))
}

/// Page-locked host memory of `bytes` bytes, counted by `pinned_bytes_in_use`.
pub(crate) fn alloc_pinned(backend: &CudaBackend, bytes: usize) -> Result<PinnedBuffer> {
    backend.bind()?;
    let ptr = driver::host_alloc(bytes).map_err(driver::error(backend.device, "cuMemHostAlloc"))?;
    let ptr = NonNull::new(ptr).ok_or_else(|| Error::Driver {
        device: backend.device,
        op: "cuMemHostAlloc",
        message: "returned a null pointer".into(),
    })?;
    let ctx = backend.ctx.clone();
    let copy = backend.copy.clone();
    let device = backend.device;
    let release = Box::new(move |ptr: NonNull<u8>, _len: usize| {
        // A copy whose handle was leaked could still be running: let the copy stream drain.
        if let Err(e) = ctx.bind_to_thread().and_then(|()| copy.synchronize()) {
            tracing::error!(%device, error = %e, "synchronize before freeing pinned memory failed");
        }
        // SAFETY: `ptr` came from `host_alloc`, is freed once (by the buffer's drop), and no
        // copy uses it any more (drained above; handles borrow the buffer until they complete).
        if let Err(e) = unsafe { driver::host_free(ptr.as_ptr()) } {
            tracing::error!(%device, error = %e, "cuMemFreeHost failed");
        }
    });
    // SAFETY: `ptr` is valid for `max(bytes, 1)` bytes, zeroed, exclusively owned, and stays
    // allocated until `release` runs once at drop.
    Ok(unsafe { PinnedBuffer::from_raw(ptr, bytes, device, release) })
}

/// The completion of an asynchronous copy: its event on the copy stream.
struct CopyDone {
    device: Device,
    event: Arc<CudaEvent>,
}

impl CopyCompletion for CopyDone {
    fn wait(self: Box<Self>) -> Result<()> {
        self.event
            .synchronize()
            .map_err(driver::error(self.device, "wait for copy"))
    }

    fn is_done(&self) -> bool {
        self.event.is_complete()
    }
}

fn finish_async<'a>(backend: &CudaBackend, slice: BufferSlice) -> Result<CopyHandle<'a>> {
    let event = Arc::new(
        backend
            .ctx
            .new_event(None)
            .map_err(driver::error(backend.device, "create event"))?,
    );
    event
        .record(&backend.copy)
        .map_err(driver::error(backend.device, "record event"))?;
    backend.order.after_copy(slice, event.clone());
    Ok(CopyHandle::new(Box::new(CopyDone {
        device: backend.device,
        event,
    })))
}

/// Host (pinned) → device on the copy stream; `src` stays borrowed until the handle completes.
pub(crate) fn write_async<'a>(
    backend: &CudaBackend,
    dst: BufferSlice,
    src: &'a PinnedBuffer,
) -> Result<CopyHandle<'a>> {
    let len = dst.len.min(src.len());
    let dst = dst.slice(0, len)?;
    backend.bind()?;
    backend
        .order
        .copy_after_compute(&backend.ctx, &backend.compute, &backend.copy, dst)?;
    // SAFETY: `dst` is a block of this device of `len` bytes; `src` is borrowed by the returned
    // handle until the copy's event completes (its drop waits), so it stays valid and unwritten.
    unsafe { driver::htod_async(dst.addr(), src.as_ptr(), len, backend.copy.cu_stream()) }
        .map_err(driver::error(backend.device, "copy host to device (async)"))?;
    finish_async(backend, dst)
}

/// Device → host (pinned) on the copy stream; `dst` stays borrowed until the handle completes.
pub(crate) fn read_async<'a>(
    backend: &CudaBackend,
    src: BufferSlice,
    dst: &'a mut PinnedBuffer,
) -> Result<CopyHandle<'a>> {
    let len = src.len.min(dst.len());
    let src = src.slice(0, len)?;
    backend.bind()?;
    backend
        .order
        .copy_after_compute(&backend.ctx, &backend.compute, &backend.copy, src)?;
    // SAFETY: `src` is a block of this device of `len` bytes; `dst` is mutably borrowed by the
    // returned handle until the copy's event completes, so nothing else reads or writes it.
    unsafe { driver::dtoh_async(dst.as_mut_ptr(), src.addr(), len, backend.copy.cu_stream()) }
        .map_err(driver::error(backend.device, "copy device to host (async)"))?;
    finish_async(backend, src)
}

/// cuda:i → cuda:j; `Ok(false)` when `dst_backend` is not a CUDA device.
pub(crate) fn copy_to_peer(
    backend: &CudaBackend,
    src: BufferSlice,
    dst_backend: &dyn Backend,
    dst: BufferSlice,
) -> Result<bool> {
    let Some(peer) = dst_backend.as_any().downcast_ref::<CudaBackend>() else {
        return Ok(false);
    };
    if peer.device == backend.device {
        copy_within(backend, src, dst)?;
        return Ok(true);
    }
    check_len("copy_to_peer", dst, src.len)?;
    if src.len == 0 {
        return Ok(true);
    }
    let err = |op| driver::error(backend.device, op);
    if driver::can_access_peer(backend.ctx.cu_device(), peer.ctx.cu_device()) {
        backend.bind()?;
        if let Err(e) = driver::enable_peer_access(peer.ctx.cu_ctx()) {
            tracing::debug!(error = %e, "peer access not enabled; the copy is staged by the driver");
        }
    }
    // The destination may still be used by the peer's queued work.
    peer.bind()?;
    let peer_done = peer.ctx.new_event(None).map_err(err("create event"))?;
    peer_done.record(&peer.compute).map_err(err("record event"))?;
    backend.bind()?;
    backend.compute.wait(&peer_done).map_err(err("order peer copy"))?;
    backend.order.before_compute(&backend.compute, &[src])?;
    // SAFETY: `src` is a block of this device and `dst` of the peer's (at least `src.len` bytes,
    // checked); the copy is queued after the source's producers (stream order) and after the
    // destination's users (the event above), and the peer waits for it before using `dst`.
    unsafe {
        driver::peer_async(
            peer.ctx.cu_ctx(),
            dst.addr(),
            backend.ctx.cu_ctx(),
            src.addr(),
            src.len,
            backend.compute.cu_stream(),
        )
    }
    .map_err(err("peer copy"))?;
    let copied = Arc::new(backend.ctx.new_event(None).map_err(err("create event"))?);
    copied.record(&backend.compute).map_err(err("record event"))?;
    peer.order.after_copy(dst, copied);
    Ok(true)
}
