//! Copies between the host and a CUDA device, within a device and between two devices.
//!
//! - `write`/`read` from ordinary (pageable) slices are synchronous for the slice and correct in
//!   stream order. Small ones go through the driver; large ones through a pool of pinned
//!   staging sets ([`crate::staging`]), double-buffered so the host copy of one chunk overlaps
//!   the DMA of the other (R9: pageable is slow; this recovers much of pinned bandwidth). A read
//!   is one DMA into staging and one host copy, on several threads, straight into the caller's
//!   slice, whose pages are advised onto huge pages first (a fresh vector faults per page).
//!   A slice that is itself pinned memory is copied directly and waited for.
//! - `write_async`/`read_async` take any [`HostStaging`]. Memory pinned for this device is
//!   copied on the copy stream, ordered against the compute stream per segment
//!   ([`crate::ordering`]); the returned [`CopyHandle`] borrows the buffer until the copy's event
//!   completes, and the buffer itself tracks the copy ([`HostStaging::track`]), so reading,
//!   writing or freeing it waits for the copy even when the handle was forgotten. Pageable memory
//!   is copied synchronously (a completed handle); memory pinned for another device is refused.
//! - `alloc_pinned` is fallible: a size beyond the host's physical memory is refused before the
//!   driver is asked, and a driver that cannot pin the memory gives [`Error::OutOfMemory`].
//! - `copy_to_peer` copies cuda:i → cuda:j with `cuMemcpyPeerAsync` (direct when the devices
//!   can address each other), ordered against both devices' compute streams with events.

use std::ptr::NonNull;
use std::sync::Arc;

use cartage_core::pinned::host_oom;
use cartage_core::raw::BufferSlice;
use cartage_core::{Backend, CopyCompletion, CopyHandle, Device, Error, HostStaging, PinnedBuffer, Result};
use cudarc::driver::CudaEvent;

use crate::backend::CudaBackend;
use crate::driver;
use crate::staging::{CHUNK, StagingSet};

/// Pageable copies up to this size go through the driver's own staging.
const SMALL: usize = 1 << 20;
/// The most host threads that copy one chunk into or out of staging memory.
const COPY_THREADS: usize = 8;

fn check_len(op: &'static str, buffer: BufferSlice, host: usize) -> Result<()> {
    if host > buffer.len() {
        return Err(Error::invalid(
            op,
            format!("{host} host bytes do not fit a device range of {} bytes", buffer.len()),
        ));
    }
    Ok(())
}

/// Host threads for one chunk: up to [`COPY_THREADS`], fewer on a small host.
fn copy_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get() / 2)
            .clamp(1, COPY_THREADS)
    })
}

/// Copy `src` into `dst` with several threads when it is large (host memory bandwidth, and page
/// faults of fresh memory taken in parallel).
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let threads = if src.len() >= 4 << 20 { copy_threads() } else { 1 };
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

/// Ask for transparent huge pages over the 2 MiB-aligned interior of `dst` (Linux; advice only:
/// the contents are unaffected, and nothing changes where the system does not use them).
fn advise_huge_pages(dst: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (dst.as_mut_ptr() as usize).next_multiple_of(HUGE);
        let end = (dst.as_mut_ptr() as usize + dst.len()) & !(HUGE - 1);
        if end > start {
            // SAFETY: `[start, end)` lies inside `dst`, memory of this process that the caller
            // borrows mutably; MADV_HUGEPAGE only changes how later page faults are served (it
            // never changes or frees contents), and a refusal is harmless.
            let status = unsafe {
                libc::madvise(
                    std::ptr::with_exposed_provenance_mut::<libc::c_void>(start),
                    end - start,
                    libc::MADV_HUGEPAGE,
                )
            };
            if status != 0 {
                tracing::trace!("madvise(MADV_HUGEPAGE) refused; reading onto ordinary pages");
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = dst;
}

/// Host → device, synchronous for `src`.
///
/// # Safety
/// `dst` lies in a live allocation of `backend` (freed only in stream order afterwards).
pub(crate) unsafe fn write(backend: &CudaBackend, dst: BufferSlice, src: &[u8]) -> Result<()> {
    check_len("write", dst, src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[dst])?;
    let stream = backend.compute.cu_stream();
    let err = driver::error(backend.device, "copy host to device");
    let pinned = driver::is_pinned_host(src.as_ptr());
    if pinned || src.len() <= SMALL {
        // SAFETY: `dst` is a live block of this device (the caller's contract) at least
        // `src.len()` bytes long (checked); pageable `src` is staged by the driver before the
        // call returns, and pinned `src` is waited for below, so `src` outlives its use.
        unsafe { driver::htod_async(dst.addr(), src.as_ptr(), src.len(), stream) }.map_err(&err)?;
        backend.staging.count_direct(src.len());
        if pinned {
            backend
                .compute
                .synchronize()
                .map_err(driver::error(backend.device, "synchronize"))?;
        }
        return Ok(());
    }
    let mut staging = backend.staging.take(backend)?;
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let k = i % 2;
        staging.events[k]
            .synchronize()
            .map_err(driver::error(backend.device, "wait for staging"))?;
        parallel_copy(&mut staging.buffers[k].as_mut_slice()[..chunk.len()], chunk);
        backend.staging.count_host_copy(chunk.len());
        // SAFETY: the staging buffer is pinned, holds `chunk`, and is not touched again before
        // its event (recorded next) completes; the destination range lies inside `dst`, a live
        // block (the caller's contract).
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
    backend.staging.count_staged_write(src.len());
    Ok(())
}

/// Device → host; returns with `dst` filled (a host sync).
///
/// # Safety
/// `src` lies in a live allocation of `backend`.
pub(crate) unsafe fn read(backend: &CudaBackend, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
    check_len("read", src, dst.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[src])?;
    let stream = backend.compute.cu_stream();
    let err = driver::error(backend.device, "copy device to host");
    if driver::is_pinned_host(dst.as_ptr()) || dst.len() <= SMALL {
        // SAFETY: `src` is a live block of this device (the caller's contract) at least
        // `dst.len()` bytes long; `dst` is borrowed mutably until the stream is synchronised
        // below.
        unsafe { driver::dtoh_async(dst.as_mut_ptr(), src.addr(), dst.len(), stream) }.map_err(&err)?;
        backend.staging.count_direct(dst.len());
        return backend
            .compute
            .synchronize()
            .map_err(driver::error(backend.device, "synchronize"));
    }
    let mut staging = backend.staging.take(backend)?;
    let total = dst.len();
    let chunks = total.div_ceil(CHUNK);
    let issue = |staging: &mut StagingSet, i: usize| -> Result<()> {
        let k = i % 2;
        let len = CHUNK.min(total - i * CHUNK);
        // SAFETY: the pinned staging buffer `k` is free (its previous chunk was copied out
        // before this call, and DMAs into it are ordered on this stream) and is read only after
        // its event completes; the source range lies inside `src`, a live block (the caller's
        // contract).
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
    issue(&mut staging, 0)?;
    // While the first chunk is in flight: the destination is usually a fresh vector.
    advise_huge_pages(dst);
    for i in 0..chunks {
        if i + 1 < chunks {
            issue(&mut staging, i + 1)?;
        }
        let k = i % 2;
        staging.events[k]
            .synchronize()
            .map_err(driver::error(backend.device, "wait for staging"))?;
        let start = i * CHUNK;
        let len = CHUNK.min(total - start);
        parallel_copy(&mut dst[start..start + len], &staging.buffers[k].as_slice()[..len]);
        backend.staging.count_host_copy(len);
    }
    backend.staging.count_staged_read(total);
    Ok(())
}

/// Device → device within this device, in stream order.
///
/// # Safety
/// `src` and `dst` lie in live allocations of `backend`.
pub(crate) unsafe fn copy_within(backend: &CudaBackend, src: BufferSlice, dst: BufferSlice) -> Result<()> {
    check_len("copy_within", dst, src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    backend.bind()?;
    backend.order.before_compute(&backend.compute, &[src, dst])?;
    // SAFETY: both ranges are live blocks of this device (the caller's contract; `dst` at least
    // `src.len()` bytes, checked), queued on the compute stream after their earlier users.
    unsafe { driver::dtod_async(dst.addr(), src.addr(), src.len(), backend.compute.cu_stream()) }
        .map_err(driver::error(backend.device, "copy device to device"))
}

/// The host's memory as far as page-locking is concerned: the physical memory (the smaller of
/// `MemTotal` and the cgroup's limit, if any) and the memory available now, where known.
#[derive(Clone, Copy, Debug, Default)]
struct HostCapacity {
    total: Option<u64>,
    available: Option<u64>,
}

impl HostCapacity {
    /// Read `/proc/meminfo` and the cgroup limit (Linux); nothing elsewhere.
    fn read() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            meminfo.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(':')?;
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                kib.checked_mul(1024)
            })
        };
        let cgroup = [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok());
        let total = match (field("MemTotal"), cgroup) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        };
        HostCapacity {
            total,
            available: field("MemAvailable"),
        }
    }
}

/// [`Error::OutOfMemory`] for pinned memory that could not be allocated, with the host's
/// capacity and free memory where known.
fn pinned_oom(bytes: usize, host: HostCapacity, why: &str) -> Error {
    let mut error = host_oom(bytes, why);
    if let Error::OutOfMemory(report) = &mut error {
        report.capacity = host.total;
        report.free = host.available;
    }
    error
}

/// Page-locked host memory of `bytes` bytes, counted by `pinned_bytes_in_use`. A size the host
/// cannot hold is [`Error::OutOfMemory`]: refused up front when it exceeds the host's physical
/// memory (page-locked memory cannot be swapped out, and a driver pinning more than exists
/// would bring the out-of-memory killer), or when the driver fails to pin it.
pub(crate) fn alloc_pinned(backend: &CudaBackend, bytes: usize) -> Result<PinnedBuffer> {
    let host = HostCapacity::read();
    if let Some(total) = host.total
        && bytes as u64 > total
    {
        return Err(pinned_oom(
            bytes,
            host,
            "page-locked memory larger than the host's physical memory",
        ));
    }
    backend.bind()?;
    let ptr = match driver::host_alloc(bytes) {
        Ok(Some(ptr)) => ptr,
        Ok(None) => return Err(pinned_oom(bytes, host, "cuMemHostAlloc returned no memory")),
        Err(e) if driver::is_host_alloc_refusal(&e) => {
            return Err(pinned_oom(bytes, host, &format!("cuMemHostAlloc failed: {e}")));
        }
        Err(e) => return Err(driver::error(backend.device, "cuMemHostAlloc")(e)),
    };
    let ctx = backend.ctx.clone();
    let device = backend.device;
    let release = Box::new(move |ptr: NonNull<u8>, _len: usize| {
        // The buffer waits for the copy it tracks before it releases the memory, and every copy
        // into or out of it is tracked (the asynchronous ones) or waited for before returning
        // (the synchronous ones), so no copy uses the memory any more.
        if let Err(e) = ctx.bind_to_thread() {
            tracing::error!(%device, error = %e, "could not bind the context to free pinned memory");
        }
        // SAFETY: `ptr` came from `host_alloc`, is freed once (by the buffer's drop), and no
        // copy uses it any more (above).
        if let Err(e) = unsafe { driver::host_free(ptr.as_ptr()) } {
            tracing::error!(%device, error = %e, "cuMemFreeHost failed");
        }
    });
    // SAFETY: `ptr` is valid for `max(bytes, 1)` bytes, zeroed, exclusively owned, page-locked
    // by this device's driver, and stays allocated until `release` runs once at drop.
    Ok(unsafe { PinnedBuffer::from_raw(ptr, bytes, device, release) })
}

/// The completion of an asynchronous copy: its event on the copy stream.
struct CopyDone {
    device: Device,
    event: Arc<CudaEvent>,
}

impl CopyCompletion for CopyDone {
    fn wait(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(driver::error(self.device, "wait for copy"))
    }

    fn is_done(&self) -> bool {
        self.event.is_complete()
    }
}

/// Refuse host memory pinned for another device, or say whether it is pinned for this one
/// (`false`: ordinary pageable memory).
fn pinned_here(op: &'static str, backend: &CudaBackend, host: &dyn HostStaging) -> Result<bool> {
    match host.pinned_for() {
        None => Ok(false),
        Some(device) if device == backend.device => Ok(true),
        Some(device) => Err(Error::invalid(
            op,
            format!(
                "host memory pinned for {device}, used with {}; allocate it with alloc_pinned on this device",
                backend.device
            ),
        )),
    }
}

/// Record `event` on the copy stream after the DMA just queued there, make compute wait for it
/// before it next uses `slice`'s segment, and wrap it as the copy's completion.
///
/// The DMA is already queued: when recording fails, the copy stream is drained before the error
/// is returned, so the host buffer is never left in use by a copy nothing tracks.
fn finish_async(backend: &CudaBackend, slice: BufferSlice, event: Arc<CudaEvent>) -> Result<Arc<CopyDone>> {
    if let Err(e) = event.record(&backend.copy) {
        if let Err(sync) = backend.copy.synchronize() {
            tracing::error!(device = %backend.device, error = %sync, "could not drain the copy stream");
        }
        return Err(driver::error(backend.device, "record event")(e));
    }
    backend.order.after_copy(slice, event.clone());
    Ok(Arc::new(CopyDone {
        device: backend.device,
        event,
    }))
}

/// A fresh event for a copy's completion (created before the copy is queued, so that a failure
/// here leaves nothing in flight).
fn copy_event(backend: &CudaBackend) -> Result<Arc<CudaEvent>> {
    backend
        .ctx
        .new_event(None)
        .map(Arc::new)
        .map_err(driver::error(backend.device, "create event"))
}

/// Host → device. Pinned memory of this device is copied on the copy stream; `src` stays
/// borrowed until the handle completes and tracks the copy. Pageable memory is copied at once.
///
/// # Safety
/// `dst` lies in a live allocation of `backend`, freed only in stream order.
pub(crate) unsafe fn write_async<'a>(
    backend: &CudaBackend,
    dst: BufferSlice,
    src: &'a dyn HostStaging,
) -> Result<CopyHandle<'a>> {
    let len = dst.len().min(src.len());
    let dst = dst.prefix(len)?;
    if !pinned_here("write_async", backend, src)? {
        // SAFETY: `dst` is a live block of this device (the caller's contract); `as_slice` waits
        // for any copy still in flight on `src`.
        unsafe { write(backend, dst, &src.as_slice()[..len]) }?;
        return Ok(CopyHandle::completed());
    }
    if len == 0 {
        return Ok(CopyHandle::completed());
    }
    backend.bind()?;
    let event = copy_event(backend)?;
    backend
        .order
        .copy_after_compute(&backend.ctx, &backend.compute, &backend.copy, dst)?;
    // SAFETY: `dst` is a live block of this device (the caller's contract) of `len` bytes; `src`
    // is pinned memory of at least `len` bytes, borrowed by the returned handle until the copy's
    // event completes and tracking that event (below), so it is neither written nor freed while
    // the DMA reads it. An earlier copy still in flight on `src` ran on this same copy stream, so
    // this one reads after it.
    unsafe { driver::htod_async(dst.addr(), src.as_ptr(), len, backend.copy.cu_stream()) }
        .map_err(driver::error(backend.device, "copy host to device (async)"))?;
    let done = finish_async(backend, dst, event)?;
    src.track(done.clone());
    Ok(CopyHandle::new(done))
}

/// Device → host. Pinned memory of this device is filled on the copy stream; `dst` stays
/// borrowed until the handle completes and tracks the copy. Pageable memory is filled at once.
///
/// # Safety
/// `src` lies in a live allocation of `backend`, freed only in stream order.
pub(crate) unsafe fn read_async<'a>(
    backend: &CudaBackend,
    src: BufferSlice,
    dst: &'a mut dyn HostStaging,
) -> Result<CopyHandle<'a>> {
    let len = src.len().min(dst.len());
    let src = src.prefix(len)?;
    if !pinned_here("read_async", backend, dst)? {
        // SAFETY: `src` is a live block of this device (the caller's contract); `as_mut_slice`
        // waits for any copy still in flight on `dst`.
        unsafe { read(backend, src, &mut dst.as_mut_slice()[..len]) }?;
        return Ok(CopyHandle::completed());
    }
    if len == 0 {
        return Ok(CopyHandle::completed());
    }
    backend.bind()?;
    let event = copy_event(backend)?;
    backend
        .order
        .copy_after_compute(&backend.ctx, &backend.compute, &backend.copy, src)?;
    // SAFETY: `src` is a live block of this device (the caller's contract) of `len` bytes; `dst`
    // is pinned memory of at least `len` bytes, mutably borrowed by the returned handle until the
    // copy's event completes and tracking that event (below), so nothing reads, writes or frees
    // it while the DMA writes it. An earlier copy still in flight on `dst` ran on this same copy
    // stream, so this one writes after it.
    unsafe { driver::dtoh_async(dst.as_mut_ptr(), src.addr(), len, backend.copy.cu_stream()) }
        .map_err(driver::error(backend.device, "copy device to host (async)"))?;
    let done = finish_async(backend, src, event)?;
    dst.track(done.clone());
    Ok(CopyHandle::new(done))
}

/// cuda:i → cuda:j; `Ok(false)` when `dst_backend` is not a CUDA device.
///
/// # Safety
/// `src` lies in a live allocation of `backend` and `dst` in a live allocation of
/// `dst_backend`, both freed only in stream order.
pub(crate) unsafe fn copy_to_peer(
    backend: &CudaBackend,
    src: BufferSlice,
    dst_backend: &dyn Backend,
    dst: BufferSlice,
) -> Result<bool> {
    let Some(peer) = dst_backend.as_any().downcast_ref::<CudaBackend>() else {
        return Ok(false);
    };
    if std::ptr::eq(peer, backend) {
        // SAFETY: one backend: both ranges are live blocks of it (the caller's contract).
        unsafe { copy_within(backend, src, dst) }?;
        return Ok(true);
    }
    check_len("copy_to_peer", dst, src.len())?;
    if src.is_empty() {
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
    // SAFETY: `src` is a live block of this device and `dst` of the peer's (the caller's
    // contract; at least `src.len()` bytes, checked); the copy is queued after the source's
    // producers (stream order) and after the destination's users (the event above), and the peer
    // waits for it before using `dst`.
    unsafe {
        driver::peer_async(
            peer.ctx.cu_ctx(),
            dst.addr(),
            backend.ctx.cu_ctx(),
            src.addr(),
            src.len(),
            backend.compute.cu_stream(),
        )
    }
    .map_err(err("peer copy"))?;
    let copied = Arc::new(backend.ctx.new_event(None).map_err(err("create event"))?);
    copied.record(&backend.compute).map_err(err("record event"))?;
    peer.order.after_copy(dst, copied);
    Ok(true)
}
