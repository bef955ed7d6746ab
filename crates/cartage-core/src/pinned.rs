//! Host memory for asynchronous copies: page-locked [`PinnedBuffer`], ordinary [`PageableBuffer`],
//! either of them as a [`StagingBuffer`], and [`CopyHandle`] (LESSONS R9; DESIGN invariant 7).
//!
//! An asynchronous copy takes a buffer by reference and returns a [`CopyHandle`] that borrows it
//! until [`CopyHandle::wait`]: the borrow checker forbids writing the source (or reading the
//! destination) while the copy may still be running.
//!
//! ```compile_fail
//! # use cartage_core::{PageableBuffer, CopyHandle};
//! # fn start(_: &PageableBuffer) -> CopyHandle<'_> { CopyHandle::completed() }
//! let mut buf = PageableBuffer::new(16).unwrap();
//! let copy = start(&buf);
//! buf.as_mut_slice()[0] = 1; // error: `buf` is borrowed by the copy in flight
//! copy.wait().unwrap();
//! ```
//!
//! The borrow is not the only guard: `mem::forget` on a handle ends the borrow without waiting.
//! So every buffer also remembers the copy in flight on it ([`HostStaging::track`]), and
//! `as_slice`, `as_mut_slice` and drop wait for that copy first. Forgetting a handle is harmless.
//!
//! Page-locked memory is a [`PinnedBuffer`] only when a driver really locked it; ordinary memory
//! is a [`PageableBuffer`], a type of its own, so a report or a user never mistakes one for the
//! other. Allocation is fallible: an impossible size is [`Error::OutOfMemory`], never an abort.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::allocator::OomReport;
use crate::device::Device;
use crate::error::{Error, Result};

static PINNED_BYTES: AtomicU64 = AtomicU64::new(0);
static PINNED_PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes of pinned (page-locked) host memory alive in this process (it cannot be swapped out:
/// count it).
pub fn pinned_bytes_in_use() -> u64 {
    PINNED_BYTES.load(Ordering::Relaxed)
}

/// The most pinned host memory alive at once in this process.
pub fn pinned_bytes_peak() -> u64 {
    PINNED_PEAK.load(Ordering::Relaxed)
}

/// How a backend gives page-locked memory back (called once, at drop).
pub type Release = Box<dyn FnOnce(NonNull<u8>, usize) + Send + Sync>;

/// The completion of an asynchronous copy, implemented by each backend. Waiting twice is
/// allowed (the buffer and the handle may both wait).
pub trait CopyCompletion: Send + Sync {
    /// Block until the copy has finished.
    fn wait(&self) -> Result<()>;
    /// True once the copy has finished (never blocks).
    fn is_done(&self) -> bool;
}

/// Host bytes with the copy in flight on them; the mechanics shared by both buffer types.
struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    release: Option<Release>,
    in_flight: Mutex<Option<Arc<dyn CopyCompletion>>>,
}

// SAFETY: the memory is exclusively owned; shared access reads through `&self` after waiting for
// the copy in flight, and writes need `&mut self`.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `in_flight` is behind a mutex.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Wait for the copy in flight, if any (logging its failure: the bytes are still ours).
    fn settle(&self) {
        let pending = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(copy) = pending
            && let Err(e) = copy.wait()
        {
            tracing::error!(error = %e, "an asynchronous copy on a host buffer failed");
        }
    }

    fn track(&self, copy: Arc<dyn CopyCompletion>) {
        let previous = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).replace(copy);
        if let Some(previous) = previous
            && let Err(e) = previous.wait()
        {
            tracing::error!(error = %e, "an asynchronous copy on a host buffer failed");
        }
    }

    fn as_slice(&self) -> &[u8] {
        self.settle();
        // SAFETY: valid and initialised for `len` bytes (constructors' contract), owned here; no
        // copy writes it any more (settled above; a new one needs `&mut` or `track`, which the
        // backends call only while holding a borrow of the buffer).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.settle();
        // SAFETY: as above, and `&mut self` excludes every other borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // A copy whose handle was forgotten may still use the memory: wait before freeing it.
        self.settle();
        if let Some(release) = self.release.take() {
            release(self.ptr, self.len);
        }
    }
}

/// Zeroed ordinary host memory of `len` bytes (8-byte aligned), or an out-of-memory error.
fn zeroed_host(len: usize) -> Result<(NonNull<u8>, Release)> {
    let words = len.div_ceil(8).max(1);
    let mut vec: Vec<u64> = Vec::new();
    if vec.try_reserve_exact(words).is_err() {
        return Err(host_oom(len, "the host has no room for ordinary memory of this size"));
    }
    vec.resize(words, 0);
    let raw = Box::into_raw(vec.into_boxed_slice()) as *mut u64 as *mut u8;
    // SAFETY: `Box::into_raw` never returns null.
    let ptr = unsafe { NonNull::new_unchecked(raw) };
    let release: Release = Box::new(move |p: NonNull<u8>, _len| {
        let slice = std::ptr::slice_from_raw_parts_mut(p.as_ptr() as *mut u64, words);
        // SAFETY: `p` came from `Box::into_raw` of a boxed slice of `words` u64s, released once.
        drop(unsafe { Box::from_raw(slice) });
    });
    Ok((ptr, release))
}

/// The out-of-memory error of a host buffer that could not be allocated.
pub fn host_oom(requested: usize, why: &str) -> Error {
    tracing::warn!(requested, why, "host buffer allocation failed");
    Error::OutOfMemory(Box::new(OomReport {
        device: Device::cpu(),
        requested,
        requested_at: None,
        capacity: None,
        free: None,
        limit: None,
        allocated: 0,
        reserved: 0,
        largest_free_block: 0,
        largest_live: Vec::new(),
    }))
}

/// Host memory an asynchronous copy can use. Sealed: [`PinnedBuffer`], [`PageableBuffer`] and
/// [`StagingBuffer`] are the only kinds.
pub trait HostStaging: Send + Sync + sealed::Sealed {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The device whose driver page-locked the memory; `None` for ordinary memory.
    fn pinned_for(&self) -> Option<Device>;
    /// The bytes, after any copy in flight on them has finished.
    fn as_slice(&self) -> &[u8];
    /// The bytes, writable, after any copy in flight on them has finished.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// The first byte, for backends issuing an asynchronous copy while they borrow the buffer.
    fn as_ptr(&self) -> *const u8;
    /// The first byte, writable, for backends issuing an asynchronous copy into the buffer.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Remember `copy` as the copy in flight on this buffer: reads, writes and drop wait for it.
    /// A backend calls this when it starts an asynchronous copy that uses the buffer.
    fn track(&self, copy: Arc<dyn CopyCompletion>);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::PinnedBuffer {}
    impl Sealed for super::PageableBuffer {}
    impl Sealed for super::StagingBuffer {}
}

/// Host memory page-locked by a device's driver: copies from and to it run at bus speed and
/// truly overlap with compute. Made by `Backend::alloc_pinned` on devices that can lock memory.
pub struct PinnedBuffer {
    memory: HostMemory,
    device: Device,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.memory.len)
            .field("device", &self.device)
            .finish()
    }
}

impl PinnedBuffer {
    /// Wrap memory a backend page-locked.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, initialised, not aliased,
    /// page-locked for `device`, and live until `release(ptr, len)` is called (once, by this
    /// buffer's drop).
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, device: Device, release: Release) -> Self {
        let now = PINNED_BYTES.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        PINNED_PEAK.fetch_max(now, Ordering::Relaxed);
        PinnedBuffer {
            memory: HostMemory {
                ptr,
                len,
                release: Some(release),
                in_flight: Mutex::new(None),
            },
            device,
        }
    }

    /// The device whose driver pinned this memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// The bytes (waits for a copy still in flight on the buffer).
    pub fn as_slice(&self) -> &[u8] {
        self.memory.as_slice()
    }

    /// The bytes, writable (waits for a copy still in flight on the buffer).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.memory.as_mut_slice()
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        PINNED_BYTES.fetch_sub(self.memory.len as u64, Ordering::Relaxed);
    }
}

/// Ordinary (pageable) host memory used for staging where a device offers nothing better (the
/// CPU; wgpu on an API that cannot keep a buffer mapped). Copies from it are correct but not
/// overlapped at bus speed.
///
/// ```
/// use cartage_core::PageableBuffer;
/// let mut staging = PageableBuffer::new(64)?;
/// staging.as_mut_slice()[0] = 7;
/// assert_eq!(staging.as_slice()[0], 7);
/// assert!(PageableBuffer::new(usize::MAX).is_err()); // an error, never an abort
/// # Ok::<(), cartage_core::Error>(())
/// ```
pub struct PageableBuffer {
    memory: HostMemory,
}

impl std::fmt::Debug for PageableBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageableBuffer").field("len", &self.memory.len).finish()
    }
}

impl PageableBuffer {
    /// `len` zeroed bytes of ordinary host memory; [`Error::OutOfMemory`] when the host has no
    /// room.
    pub fn new(len: usize) -> Result<Self> {
        let (ptr, release) = zeroed_host(len)?;
        Ok(PageableBuffer {
            memory: HostMemory {
                ptr,
                len,
                release: Some(release),
                in_flight: Mutex::new(None),
            },
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// The bytes (waits for a copy still in flight on the buffer).
    pub fn as_slice(&self) -> &[u8] {
        self.memory.as_slice()
    }

    /// The bytes, writable (waits for a copy still in flight on the buffer).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.memory.as_mut_slice()
    }
}

/// `HostStaging` for a buffer type holding its bytes in a `memory: HostMemory` field, with
/// `$pinned_for` (given the buffer) naming the device that locked it.
macro_rules! host_staging_over_memory {
    ($buffer:ty, |$this:ident| $pinned_for:expr) => {
        impl HostStaging for $buffer {
            fn len(&self) -> usize {
                self.memory.len
            }
            fn pinned_for(&self) -> Option<Device> {
                let $this = self;
                $pinned_for
            }
            fn as_slice(&self) -> &[u8] {
                self.memory.as_slice()
            }
            fn as_mut_slice(&mut self) -> &mut [u8] {
                self.memory.as_mut_slice()
            }
            fn as_ptr(&self) -> *const u8 {
                self.memory.ptr.as_ptr()
            }
            fn as_mut_ptr(&mut self) -> *mut u8 {
                self.memory.ptr.as_ptr()
            }
            fn track(&self, copy: Arc<dyn CopyCompletion>) {
                self.memory.track(copy)
            }
        }
    };
}

host_staging_over_memory!(PinnedBuffer, |buffer| Some(buffer.device));
host_staging_over_memory!(PageableBuffer, |_buffer| None);

/// Typed views (`as_slice_of::<f32>()`) for a host buffer type with `as_slice`/`as_mut_slice`.
macro_rules! typed_views {
    ($($buffer:ty),*) => {$(
        impl $buffer {
            /// The bytes viewed as `T` values (waits for a copy still in flight on the buffer).
            /// The view is checked, never undefined behaviour: a buffer whose address is not
            /// aligned for `T`, or whose length is not a whole number of `T`s, is
            /// [`Error::InvalidArgument`] naming the length, the address and `T`. Host buffers
            /// are at least 8-byte aligned (pinned ones page-aligned), so every numeric `T`
            /// fits when the length does.
            ///
            /// ```
            /// use cartage_core::PageableBuffer;
            /// let mut staging = PageableBuffer::new(16)?;
            /// staging.as_mut_slice_of::<f32>()?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
            /// assert_eq!(staging.as_slice_of::<f32>()?, &[1.0, 2.0, 3.0, 4.0]);
            /// assert_eq!(staging.as_slice_of::<u64>()?.len(), 2);
            /// assert!(PageableBuffer::new(6)?.as_slice_of::<f32>().is_err()); // 6 bytes: 1.5 f32s
            /// # Ok::<(), cartage_core::Error>(())
            /// ```
            pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
                let bytes = self.as_slice();
                let (len, address) = (bytes.len(), bytes.as_ptr() as usize);
                bytemuck::try_cast_slice(bytes).map_err(|e| view_error::<T>("as_slice_of", len, address, e))
            }

            /// The bytes viewed as writable `T` values (waits for a copy still in flight);
            /// checked as [`as_slice_of`](Self::as_slice_of).
            pub fn as_mut_slice_of<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
                let bytes = self.as_mut_slice();
                let (len, address) = (bytes.len(), bytes.as_ptr() as usize);
                bytemuck::try_cast_slice_mut(bytes)
                    .map_err(|e| view_error::<T>("as_mut_slice_of", len, address, e))
            }
        }
    )*};
}

typed_views!(PinnedBuffer, PageableBuffer, StagingBuffer);

/// The error of a typed view that does not fit the buffer's bytes.
fn view_error<T>(op: &'static str, len: usize, address: usize, error: bytemuck::PodCastError) -> Error {
    let name = std::any::type_name::<T>();
    let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    let reason = match error {
        bytemuck::PodCastError::TargetAlignmentGreaterAndInputNotAligned => format!(
            "the buffer's {len} bytes start at address {address:#x}, which is not aligned to {align} bytes as `{name}` needs; view it as bytes, or as a type of smaller alignment"
        ),
        bytemuck::PodCastError::OutputSliceWouldHaveSlop => format!(
            "the buffer holds {len} bytes, not a whole number of {size}-byte `{name}` values; allocate a multiple of {size} bytes"
        ),
        other => format!("cannot view {len} bytes as `{name}` ({size} bytes each): {other:?}"),
    };
    Error::invalid(op, reason)
}

/// The best staging memory a device offers: pinned where its driver can lock memory, pageable
/// elsewhere (`Backend::alloc_staging`).
#[derive(Debug)]
pub enum StagingBuffer {
    /// Page-locked by the device's driver.
    Pinned(PinnedBuffer),
    /// Ordinary host memory.
    Pageable(PageableBuffer),
}

impl StagingBuffer {
    fn inner(&self) -> &dyn HostStaging {
        match self {
            StagingBuffer::Pinned(b) => b,
            StagingBuffer::Pageable(b) => b,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn HostStaging {
        match self {
            StagingBuffer::Pinned(b) => b,
            StagingBuffer::Pageable(b) => b,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner().len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.inner().len() == 0
    }

    /// True when the memory is page-locked.
    pub fn is_pinned(&self) -> bool {
        matches!(self, StagingBuffer::Pinned(_))
    }

    /// The bytes (waits for a copy still in flight on the buffer).
    pub fn as_slice(&self) -> &[u8] {
        self.inner().as_slice()
    }

    /// The bytes, writable (waits for a copy still in flight on the buffer).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.inner_mut().as_mut_slice()
    }
}

impl HostStaging for StagingBuffer {
    fn len(&self) -> usize {
        self.inner().len()
    }
    fn pinned_for(&self) -> Option<Device> {
        self.inner().pinned_for()
    }
    fn as_slice(&self) -> &[u8] {
        self.inner().as_slice()
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.inner_mut().as_mut_slice()
    }
    fn as_ptr(&self) -> *const u8 {
        self.inner().as_ptr()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.inner_mut().as_mut_ptr()
    }
    fn track(&self, copy: Arc<dyn CopyCompletion>) {
        self.inner().track(copy)
    }
}

/// An asynchronous copy in flight. It borrows the host buffer (`'a`) until it completes;
/// dropping it without `wait` waits. Forgetting it is harmless: the buffer waits too.
#[must_use = "an asynchronous copy must be waited on before its data is used"]
pub struct CopyHandle<'a> {
    completion: Option<Arc<dyn CopyCompletion>>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> CopyHandle<'a> {
    /// A handle for a backend-specific completion (the backend also gives it to the buffer's
    /// [`HostStaging::track`]).
    pub fn new(completion: Arc<dyn CopyCompletion>) -> Self {
        CopyHandle {
            completion: Some(completion),
            _borrow: PhantomData,
        }
    }

    /// A handle for a copy that already completed (synchronous backends).
    pub fn completed() -> Self {
        CopyHandle {
            completion: None,
            _borrow: PhantomData,
        }
    }

    /// Block until the copy completes; the borrow of the buffer ends here.
    pub fn wait(mut self) -> Result<()> {
        match self.completion.take() {
            Some(c) => c.wait(),
            None => Ok(()),
        }
    }

    /// End the borrow without waiting, and let the copy finish on its own. This is as safe as
    /// forgetting the handle: the host buffer remembers the copy ([`HostStaging::track`]) and
    /// waits for it before it can be written, read through a slice or freed, and device work
    /// queued afterwards on the copy's device memory runs after the copy (each backend orders
    /// it: CUDA with an event its compute stream waits on, wgpu on its one queue, the CPU by
    /// copying at once). An error of a detached copy is only logged when the buffer next
    /// waits; keep the handle and [`CopyHandle::wait`] where the error must be seen.
    pub fn detach(mut self) {
        self.completion = None;
    }

    /// True once the copy has finished.
    pub fn is_done(&self) -> bool {
        self.completion.as_ref().is_none_or(|c| c.is_done())
    }
}

impl Drop for CopyHandle<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.completion.take()
            && let Err(e) = c.wait()
        {
            tracing::error!(error = %e, "asynchronous copy failed (handle dropped without wait)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn pageable_buffers_are_fallible_and_not_pinned() {
        let mut b = PageableBuffer::new(1000).unwrap();
        b.as_mut_slice()[999] = 7;
        assert_eq!(b.as_slice()[999], 7);
        assert_eq!(b.pinned_for(), None);
        assert!(matches!(PageableBuffer::new(usize::MAX), Err(Error::OutOfMemory(_))));
        assert!(matches!(PageableBuffer::new(1 << 62), Err(Error::OutOfMemory(_))));
    }

    /// A copy that finishes a while after it starts, flipping `done`.
    struct SlowCopy {
        done: Arc<AtomicBool>,
    }

    impl CopyCompletion for SlowCopy {
        fn wait(&self) -> Result<()> {
            std::thread::sleep(Duration::from_millis(50));
            self.done.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn is_done(&self) -> bool {
            self.done.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_forgotten_handle_still_makes_the_buffer_wait() {
        let mut b = PageableBuffer::new(16).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let copy: Arc<dyn CopyCompletion> = Arc::new(SlowCopy { done: done.clone() });
        b.track(copy.clone());
        std::mem::forget(CopyHandle::new(copy));
        // The borrow ended without a wait; touching the bytes must wait for the copy.
        b.as_mut_slice()[0] = 1;
        assert!(done.load(Ordering::SeqCst), "as_mut_slice ran before the copy finished");
    }
}
