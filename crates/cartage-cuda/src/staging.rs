//! The pool of pinned staging buffers behind `read` and `write` of pageable memory, and the
//! counters that show how each byte travelled ([`TransferStats`]).
//!
//! A staging set is two pinned 16 MiB buffers with the event of the last DMA that used each, so
//! that the host copy of one chunk overlaps the DMA of the other. A copy takes a set from the pool
//! for its duration ([`StagingPool::take`]) and gives it back when done, so concurrent copies from
//! several threads each get their own set instead of queueing on one; at most [`KEEP`] sets stay
//! allocated between copies.
//!
//! Reading back is one DMA into staging and one host copy out of it, straight into the caller's
//! memory (`to_vec`'s vector): [`TransferStats::host_copy_bytes`] grows by exactly the bytes read.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cartage_core::{PinnedBuffer, Result};
use cudarc::driver::CudaEvent;

use crate::backend::CudaBackend;
use crate::driver;

/// Bytes per staging buffer (one chunk of a copy).
pub(crate) const CHUNK: usize = 16 << 20;

/// Staging sets kept allocated between copies.
const KEEP: usize = 4;

/// Two pinned buffers and the events of the last DMA that used each.
pub(crate) struct StagingSet {
    pub(crate) buffers: [PinnedBuffer; 2],
    pub(crate) events: [CudaEvent; 2],
}

impl StagingSet {
    /// Wait for every DMA that used this set.
    fn drain(&self) {
        for event in &self.events {
            if let Err(e) = event.synchronize() {
                tracing::error!(error = %e, "waiting for a staging copy failed");
            }
        }
    }
}

/// How bytes moved between the host and one device since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Device → host bytes that went through pinned staging.
    pub staged_read_bytes: u64,
    /// Host → device bytes that went through pinned staging.
    pub staged_write_bytes: u64,
    /// Bytes copied by the host between staging and the caller's memory (once per staged byte).
    pub host_copy_bytes: u64,
    /// Bytes copied by the DMA engine directly to or from the caller's memory (pinned memory, or
    /// small pageable copies staged by the driver).
    pub direct_bytes: u64,
    /// Staging sets allocated so far (each two pinned chunks).
    pub staging_sets: u64,
}

/// The backend's staging sets and transfer counters.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<StagingSet>>,
    staged_read: AtomicU64,
    staged_write: AtomicU64,
    host_copy: AtomicU64,
    direct: AtomicU64,
    sets: AtomicU64,
}

/// A staging set lent to one copy; back to the pool on drop.
pub(crate) struct Lease<'a> {
    pool: &'a StagingPool,
    set: Option<StagingSet>,
}

impl Deref for Lease<'_> {
    type Target = StagingSet;
    fn deref(&self) -> &StagingSet {
        self.set.as_ref().expect("a lease holds its set until dropped")
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut StagingSet {
        self.set.as_mut().expect("a lease holds its set until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(set) = self.set.take() else { return };
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < KEEP {
            // A later user waits for the set's events before it touches a buffer.
            free.push(set);
        } else {
            drop(free);
            // Freed now: no DMA may still use its memory.
            set.drain();
        }
    }
}

impl StagingPool {
    /// A free staging set, allocating one when every kept set is in use.
    pub(crate) fn take<'a>(&'a self, backend: &CudaBackend) -> Result<Lease<'a>> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let set = match reused {
            Some(set) => set,
            None => {
                let event = || {
                    backend
                        .ctx
                        .new_event(None)
                        .map_err(driver::error(backend.device, "create event"))
                };
                let set = StagingSet {
                    buffers: [
                        crate::copies::alloc_pinned(backend, CHUNK)?,
                        crate::copies::alloc_pinned(backend, CHUNK)?,
                    ],
                    events: [event()?, event()?],
                };
                self.sets.fetch_add(1, Ordering::Relaxed);
                set
            }
        };
        Ok(Lease {
            pool: self,
            set: Some(set),
        })
    }

    /// Count a staged read of `bytes` (one DMA into staging, one host copy out of it).
    pub(crate) fn count_staged_read(&self, bytes: usize) {
        self.staged_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Count a staged write of `bytes`.
    pub(crate) fn count_staged_write(&self, bytes: usize) {
        self.staged_write.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Count `bytes` copied by the host between staging and the caller's memory.
    pub(crate) fn count_host_copy(&self, bytes: usize) {
        self.host_copy.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Count `bytes` copied by DMA directly to or from the caller's memory.
    pub(crate) fn count_direct(&self, bytes: usize) {
        self.direct.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> TransferStats {
        TransferStats {
            staged_read_bytes: self.staged_read.load(Ordering::Relaxed),
            staged_write_bytes: self.staged_write.load(Ordering::Relaxed),
            host_copy_bytes: self.host_copy.load(Ordering::Relaxed),
            direct_bytes: self.direct.load(Ordering::Relaxed),
            staging_sets: self.sets.load(Ordering::Relaxed),
        }
    }
}

impl Drop for StagingPool {
    fn drop(&mut self) {
        for set in self.free.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            set.drain();
        }
    }
}
