//! Pinned (page-locked) host memory and asynchronous copy handles (ARTICLE R9; DESIGN invariant 7).
//!
//! An asynchronous copy takes a [`PinnedBuffer`] by reference and returns a [`CopyHandle`] that
//! borrows it until [`CopyHandle::wait`]: the borrow checker forbids writing the source (or
//! reading the destination) while the copy may still be running.
//!
//! ```compile_fail
//! # use cartage_core::{PinnedBuffer, CopyHandle};
//! # fn start(_: &PinnedBuffer) -> CopyHandle<'_> { CopyHandle::completed() }
//! let mut buf = PinnedBuffer::host(16);
//! let copy = start(&buf);
//! buf.as_mut_slice()[0] = 1; // error: `buf` is borrowed by the copy in flight
//! copy.wait().unwrap();
//! ```

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::Device;
use crate::error::Result;

static PINNED_BYTES: AtomicU64 = AtomicU64::new(0);
static PINNED_PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes of pinned host memory alive in this process (it cannot be swapped out: count it).
pub fn pinned_bytes_in_use() -> u64 {
    PINNED_BYTES.load(Ordering::Relaxed)
}

/// The most pinned host memory alive at once in this process.
pub fn pinned_bytes_peak() -> u64 {
    PINNED_PEAK.load(Ordering::Relaxed)
}

type Release = Box<dyn FnOnce(NonNull<u8>, usize) + Send + Sync>;

/// Host memory a device can copy from and to asynchronously.
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    device: Device,
    release: Option<Release>,
}

// SAFETY: the buffer exclusively owns its allocation; access goes through &self/&mut self.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads through `as_slice`.
unsafe impl Sync for PinnedBuffer {}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl PinnedBuffer {
    /// Ordinary zeroed host memory standing in for pinned memory (the CPU backend's buffers, and
    /// backends without page-locking). Counted like pinned memory.
    pub fn host(len: usize) -> Self {
        let boxed: Box<[u64]> = vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice();
        let words = boxed.len();
        let raw = Box::into_raw(boxed) as *mut u8;
        // SAFETY: `Box::into_raw` never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw) };
        let release: Release = Box::new(move |p: NonNull<u8>, _len| {
            let slice = std::ptr::slice_from_raw_parts_mut(p.as_ptr() as *mut u64, words);
            // SAFETY: `p` came from `Box::into_raw` of a boxed slice of `words` u64s, released once.
            drop(unsafe { Box::from_raw(slice) });
        });
        // SAFETY: `ptr` is valid for `len` bytes (at least `words * 8`), zeroed, and owned here.
        unsafe { Self::from_raw(ptr, len, Device::cpu(), release) }
    }

    /// Wrap memory a backend page-locked.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, initialised, not aliased, and
    /// live until `release(ptr, len)` is called (once, by this buffer's drop).
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, device: Device, release: Release) -> Self {
        let now = PINNED_BYTES.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        PINNED_PEAK.fetch_max(now, Ordering::Relaxed);
        PinnedBuffer {
            ptr,
            len,
            device,
            release: Some(release),
        }
    }

    /// The device whose driver pinned this memory (`cpu` for [`PinnedBuffer::host`]).
    pub fn device(&self) -> Device {
        self.device
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `from_raw`'s contract: valid, initialised, owned for `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable (only when no copy borrows the buffer).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees no other borrow (no copy in flight).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The raw pointer, for backends issuing asynchronous copies.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The raw mutable pointer, for backends issuing asynchronous copies into the buffer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        PINNED_BYTES.fetch_sub(self.len as u64, Ordering::Relaxed);
        if let Some(release) = self.release.take() {
            release(self.ptr, self.len);
        }
    }
}

/// The completion of an asynchronous copy, implemented by each backend.
pub trait CopyCompletion: Send {
    /// Block until the copy has finished.
    fn wait(self: Box<Self>) -> Result<()>;
    /// True once the copy has finished (never blocks).
    fn is_done(&self) -> bool;
}

/// An asynchronous copy in flight. It borrows the pinned buffer (`'a`) until it completes;
/// dropping it without `wait` waits (so the borrow can never end early).
#[must_use = "an asynchronous copy must be waited on before its data is used"]
pub struct CopyHandle<'a> {
    completion: Option<Box<dyn CopyCompletion + 'a>>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> CopyHandle<'a> {
    /// A handle for a backend-specific completion.
    pub fn new(completion: Box<dyn CopyCompletion + 'a>) -> Self {
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

    /// Block until the copy completes; the borrow of the pinned buffer ends here.
    pub fn wait(mut self) -> Result<()> {
        match self.completion.take() {
            Some(c) => c.wait(),
            None => Ok(()),
        }
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

    #[test]
    fn pinned_bytes_are_counted() {
        let before = pinned_bytes_in_use();
        let mut b = PinnedBuffer::host(1000);
        assert!(pinned_bytes_in_use() >= before + 1000);
        b.as_mut_slice()[999] = 7;
        assert_eq!(b.as_slice()[999], 7);
        drop(b);
        assert!(pinned_bytes_peak() >= 1000);
    }
}
