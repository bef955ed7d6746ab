//! Host memory for the cpu backend: [`HostSegments`], the [`SegmentSource`] under its caching
//! allocator, and the machine's RAM figures from `/proc/meminfo`.
//!
//! Segments are 64-byte aligned and zero-initialised (`alloc_zeroed`: fresh pages from the kernel
//! are already zero, so this costs nothing for large segments). Every byte a kernel reads is
//! therefore initialised, and kernels treat buffers as raw bytes of plain-old-data elements, so
//! no bit pattern is invalid (bool is read as a byte and compared with zero).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cartage_core::MemoryInfo;
use cartage_core::raw::{SegmentError, SegmentHandle, SegmentSource};

/// Alignment of every segment: a cache line, and enough for any SIMD load.
pub const SEGMENT_ALIGN: usize = 64;

/// Aligned host allocations, one per segment, remembered by id so they can be released.
#[derive(Debug, Default)]
pub struct HostSegments {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, (usize, Layout)>>,
}

impl HostSegments {
    /// An empty source.
    pub fn new() -> Self {
        HostSegments::default()
    }

    /// Segments currently held.
    pub fn live_segments(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl SegmentSource for HostSegments {
    fn allocate_segment(&self, bytes: usize) -> Result<SegmentHandle, SegmentError> {
        if exceeds_available(bytes, read_meminfo()) {
            // More than the machine can give now: refuse instead of meeting the OOM killer later
            // (zeroed pages are only committed when touched, so the allocation itself would pass).
            return Err(SegmentError::OutOfMemory);
        }
        let layout = Layout::from_size_align(bytes.max(1), SEGMENT_ALIGN).map_err(|_| SegmentError::OutOfMemory)?;
        // SAFETY: `layout` has a non-zero size (at least 1 byte).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(SegmentError::OutOfMemory);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (ptr as usize, layout));
        tracing::trace!(id, bytes, "cpu segment allocated");
        Ok(SegmentHandle { id, addr: ptr as u64 })
    }

    unsafe fn release_segment(&self, segment: SegmentHandle) {
        let entry = self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&segment.id);
        match entry {
            Some((addr, layout)) => {
                // SAFETY: `addr` came from `alloc_zeroed(layout)` in `allocate_segment` and was
                // removed from the table above, so it is released exactly once.
                unsafe { dealloc(addr as *mut u8, layout) };
                tracing::trace!(id = segment.id, bytes = layout.size(), "cpu segment released");
            }
            None => tracing::error!(id = segment.id, "release of an unknown cpu segment (ignored)"),
        }
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        read_meminfo()
    }
}

impl Drop for HostSegments {
    fn drop(&mut self) {
        let live = self.live.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, (addr, layout)) in live.drain() {
            // SAFETY: every entry is a live allocation of `layout` owned by this source.
            unsafe { dealloc(addr as *mut u8, layout) };
        }
    }
}

/// True when a segment of `bytes` is more than the machine has available now (`MemAvailable`,
/// or `MemFree` on kernels without it). Without the figures nothing is refused here.
fn exceeds_available(bytes: usize, info: Option<MemoryInfo>) -> bool {
    info.is_some_and(|info| bytes as u64 > info.free)
}

/// Total and available RAM from `/proc/meminfo`, `None` where it cannot be read.
pub fn read_meminfo() -> Option<MemoryInfo> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Parse the `MemTotal` and `MemAvailable` lines (in kB) of a `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> Option<MemoryInfo> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        kib.checked_mul(1024)
    };
    let total = field("MemTotal:")?;
    let free = field("MemAvailable:").or_else(|| field("MemFree:"))?;
    Some(MemoryInfo { free, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_kib_lines() {
        let text = "MemTotal:       24684132 kB\nMemFree:        22000000 kB\nMemAvailable:   23000000 kB\n";
        let info = parse_meminfo(text).unwrap();
        assert_eq!(info.total, 24684132 * 1024);
        assert_eq!(info.free, 23000000 * 1024);
        assert!(parse_meminfo("nothing here").is_none());
    }

    #[test]
    fn segments_beyond_available_memory_are_refused() {
        let info = MemoryInfo {
            free: 1 << 30,
            total: 64 << 30,
        };
        assert!(!exceeds_available(1 << 30, Some(info)));
        assert!(
            exceeds_available((1 << 30) + 1, Some(info)),
            "below MemTotal but above MemAvailable"
        );
        assert!(!exceeds_available(usize::MAX, None));
        // On this machine: more than MemAvailable is refused even when it is below MemTotal.
        if let Some(info) = read_meminfo()
            && info.free < info.total
        {
            let source = HostSegments::new();
            let bytes = usize::try_from(info.free).unwrap_or(usize::MAX).saturating_add(1 << 30);
            if (bytes as u64) < info.total {
                assert!(matches!(source.allocate_segment(bytes), Err(SegmentError::OutOfMemory)));
            }
            assert_eq!(source.live_segments(), 0);
        }
    }

    #[test]
    fn segments_are_aligned_zeroed_and_released() {
        let source = HostSegments::new();
        let a = source.allocate_segment(4096).unwrap();
        let b = source.allocate_segment(100).unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!(a.addr as usize % SEGMENT_ALIGN, 0);
        // SAFETY: `a` is a live 4096-byte allocation.
        let bytes = unsafe { std::slice::from_raw_parts(a.addr as *const u8, 4096) };
        assert!(bytes.iter().all(|&x| x == 0));
        assert_eq!(source.live_segments(), 2);
        // SAFETY: `a` came from this source and nothing uses it; the second release of an
        // unknown handle must be refused by the source (logged, ignored), not freed twice.
        unsafe {
            source.release_segment(a);
            source.release_segment(a);
        }
        assert_eq!(source.live_segments(), 1);
        assert!(matches!(
            source.allocate_segment(usize::MAX),
            Err(SegmentError::OutOfMemory)
        ));
    }
}
