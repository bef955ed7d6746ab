//! Staging buffers kept for the next loader: pinned memory costs milliseconds to allocate (the
//! driver locks every page), so a [`super::PrefetchLoader`] takes its two buffers from here and
//! gives them back when it ends, and the next epoch's loader starts without allocating.
//!
//! The pool keeps at most [`KEPT_PER_DEVICE`] buffers per device; [`release_loader_staging`]
//! frees them all (they are counted by [`crate::pinned_bytes_in_use`] while kept).

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{Backend, Device, Result, StagingBuffer};

/// How many buffers a device keeps between loaders (two per loader, two loaders at once).
const KEPT_PER_DEVICE: usize = 4;

static POOL: Mutex<Vec<(Device, StagingBuffer)>> = Mutex::new(Vec::new());

fn pool() -> MutexGuard<'static, Vec<(Device, StagingBuffer)>> {
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A staging buffer of at least `bytes` for `device`: the smallest kept one that is large
/// enough, or a new one from `backend`.
pub(super) fn take(backend: &Arc<dyn Backend>, device: Device, bytes: usize) -> Result<StagingBuffer> {
    let kept = {
        let mut pool = pool();
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, (d, b))| *d == device && b.len() >= bytes)
            .min_by_key(|(_, (_, b))| b.len())
            .map(|(i, _)| i);
        best.map(|i| pool.swap_remove(i).1)
    };
    match kept {
        Some(buffer) => Ok(buffer),
        None => backend.alloc_staging(bytes.max(1)),
    }
}

/// Keep `buffer` for the next loader on `device`; past the limit the smallest kept buffer of
/// the device is freed instead.
pub(super) fn give_back(device: Device, buffer: StagingBuffer) {
    let freed = {
        let mut pool = pool();
        pool.push((device, buffer));
        let mine: Vec<usize> = (0..pool.len()).filter(|&i| pool[i].0 == device).collect();
        if mine.len() > KEPT_PER_DEVICE {
            let smallest = mine.into_iter().min_by_key(|&i| pool[i].1.len());
            smallest.map(|i| pool.swap_remove(i).1)
        } else {
            None
        }
    };
    // Freed outside the lock: dropping pinned memory waits for its copy and calls the driver.
    drop(freed);
}

/// Free every staging buffer kept for loaders; returns the bytes freed.
///
/// ```
/// let freed = cartage::loader::release_loader_staging();
/// assert_eq!(cartage::loader::release_loader_staging(), 0);
/// # let _ = freed;
/// ```
pub fn release_loader_staging() -> usize {
    let kept = std::mem::take(&mut *pool());
    kept.iter().map(|(_, b)| b.len()).sum()
}

/// How many staging buffers are kept for loaders on `device`.
pub fn kept_loader_staging(device: &Device) -> usize {
    pool().iter().filter(|(d, _)| d == device).count()
}
