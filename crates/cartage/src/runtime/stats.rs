//! Process-wide counters of what costs: host synchronisations (with their call sites) and the
//! copies the frontend had to make without being asked (with their bytes).
//!
//! A loop that reads a scalar back every step shows up here as one call site with a large count
//! (LESSONS R5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use cartage_core::Site;

static HOST_SYNCS: AtomicU64 = AtomicU64::new(0);
static IMPLICIT_COPIES: AtomicU64 = AtomicU64::new(0);
static IMPLICIT_COPY_BYTES: AtomicU64 = AtomicU64::new(0);
static SYNC_SITES: Mutex<Option<HashMap<Site, u64>>> = Mutex::new(None);

/// A snapshot of the runtime counters, from [`stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Host synchronisations: `to_vec`, `to_vec_f64` and `item` calls.
    pub host_syncs: u64,
    /// Each call site that synchronised, with its count, most frequent first.
    pub sync_sites: Vec<(Site, u64)>,
    /// Copies the frontend made that the program did not ask for by name (a `reshape` that
    /// could not be a view, a strided tensor read back or moved).
    pub implicit_copies: u64,
    /// Bytes written by those copies.
    pub implicit_copy_bytes: u64,
}

impl RuntimeStats {
    /// The number of host syncs recorded at `site`'s file and line.
    pub fn syncs_at(&self, file: &str, line: u32) -> u64 {
        self.sync_sites
            .iter()
            .filter(|(site, _)| site.file() == file && site.line() == line)
            .map(|(_, n)| n)
            .sum()
    }
}

fn sites() -> MutexGuard<'static, Option<HashMap<Site, u64>>> {
    SYNC_SITES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Count one host synchronisation at `site`.
pub(crate) fn record_host_sync(site: Site) {
    HOST_SYNCS.fetch_add(1, Ordering::Relaxed);
    *sites().get_or_insert_with(HashMap::new).entry(site).or_insert(0) += 1;
}

/// Count one copy the program did not ask for, and log it with its bytes and call site.
pub(crate) fn record_implicit_copy(what: &'static str, bytes: usize, site: Site) {
    IMPLICIT_COPIES.fetch_add(1, Ordering::Relaxed);
    IMPLICIT_COPY_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    tracing::debug!(what, bytes, %site, "implicit copy: the strided data had to be made contiguous");
}

/// The counters since the start of the process or the last [`reset_stats`].
pub fn stats() -> RuntimeStats {
    let mut sync_sites: Vec<(Site, u64)> = sites()
        .as_ref()
        .map(|m| m.iter().map(|(&s, &n)| (s, n)).collect())
        .unwrap_or_default();
    sync_sites.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.file().cmp(b.0.file()))
            .then_with(|| a.0.line().cmp(&b.0.line()))
    });
    RuntimeStats {
        host_syncs: HOST_SYNCS.load(Ordering::Relaxed),
        sync_sites,
        implicit_copies: IMPLICIT_COPIES.load(Ordering::Relaxed),
        implicit_copy_bytes: IMPLICIT_COPY_BYTES.load(Ordering::Relaxed),
    }
}

/// Set every counter back to zero.
pub fn reset_stats() {
    HOST_SYNCS.store(0, Ordering::Relaxed);
    IMPLICIT_COPIES.store(0, Ordering::Relaxed);
    IMPLICIT_COPY_BYTES.store(0, Ordering::Relaxed);
    *sites() = None;
}
