//! [`memory_summary`]: one device's memory as a table, like PyTorch's `memory_summary` (R20, R22).
//!
//! Allocated is what live tensors hold; reserved is what cartage took from the device, allocated
//! plus freed blocks kept for reuse. Reserved ≫ allocated is normal; allocated growing step after
//! step is a leak (see [`super::MemoryTracker`]). Fragmentation is 1 − largest free block / free
//! cached bytes: near 1 means the cache has room in total but only in small holes.

use std::fmt;

use cartage_core::{
    Device, LiveBlock, MemoryInfo, MemoryStats, Result, format_bytes, pinned_bytes_in_use, pinned_bytes_peak,
};

use crate::runtime;

/// How many of the largest live blocks a summary lists.
pub const SUMMARY_LIVE_BLOCKS: usize = 5;

/// Everything [`memory_summary`] prints, as data.
#[derive(Clone, Debug)]
pub struct MemorySummary {
    /// The device.
    pub device: Device,
    /// The allocator's counters.
    pub stats: MemoryStats,
    /// The device's own free and total memory, where it can tell.
    pub device_memory: Option<MemoryInfo>,
    /// An allocator cap on reserved memory, if set.
    pub limit: Option<usize>,
    /// Pinned host memory alive in this process now (bytes).
    pub pinned_in_use: u64,
    /// The most pinned host memory alive at once (bytes).
    pub pinned_peak: u64,
    /// The largest live blocks with their creation sites, largest first.
    pub largest_live: Vec<LiveBlock>,
    /// The autograd graph's share: recorded ops alive on this device and the activations they
    /// hold for backward (part of the allocated memory above).
    pub graph: crate::GraphMemory,
}

impl MemorySummary {
    /// Read the current state of `device`.
    pub fn collect(device: &Device) -> Result<MemorySummary> {
        let backend = runtime::backend(device)?;
        let allocator = backend.allocator();
        Ok(MemorySummary {
            device: *device,
            stats: backend.memory_stats(),
            device_memory: allocator.source().memory_info(),
            limit: allocator.limit(),
            pinned_in_use: pinned_bytes_in_use(),
            pinned_peak: pinned_bytes_peak(),
            largest_live: allocator.largest_live(SUMMARY_LIVE_BLOCKS),
            graph: crate::graph_memory(device),
        })
    }
}

/// The memory of `device` as a table: allocated, requested and reserved bytes with their peaks,
/// active and inactive blocks, segments, allocation and free counts, cache hits and misses,
/// `empty_cache` calls, out-of-memory errors, the largest free block and fragmentation, the
/// device's free memory, pinned host memory, and the largest live blocks with creation sites.
///
/// ```
/// let text = cartage::memory::memory_summary(&cartage::Device::cpu()).unwrap();
/// assert!(text.contains("Allocated memory"));
/// ```
pub fn memory_summary(device: &Device) -> Result<String> {
    Ok(MemorySummary::collect(device)?.to_string())
}

const WIDTH: usize = 78;

fn rule(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    writeln!(f, "|{}|", c.to_string().repeat(WIDTH - 2))
}

fn row(f: &mut fmt::Formatter<'_>, name: &str, current: &str, peak: &str) -> fmt::Result {
    writeln!(f, "| {name:<32} | {current:>18} | {peak:>18} |")
}

fn bytes(n: usize) -> String {
    format_bytes(n as u64)
}

impl fmt::Display for MemorySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        rule(f, '=')?;
        writeln!(
            f,
            "| {:<w$} |",
            format!("cartage memory summary: {}", self.device),
            w = WIDTH - 4
        )?;
        rule(f, '-')?;
        row(f, "Metric", "Current", "Peak / total")?;
        rule(f, '-')?;
        row(
            f,
            "Allocated memory (live tensors)",
            &bytes(s.allocated_bytes),
            &bytes(s.peak_allocated_bytes),
        )?;
        row(f, "Requested memory", &bytes(s.requested_bytes), "")?;
        row(
            f,
            "  of which saved for backward",
            &bytes(self.graph.saved_bytes),
            &format!("{} graph nodes", self.graph.nodes),
        )?;
        row(
            f,
            "Reserved memory (segments)",
            &bytes(s.reserved_bytes),
            &bytes(s.peak_reserved_bytes),
        )?;
        rule(f, '-')?;
        row(f, "Active blocks", &s.active_blocks.to_string(), "")?;
        row(
            f,
            "Cached free blocks / bytes",
            &s.inactive_blocks.to_string(),
            &bytes(s.inactive_bytes),
        )?;
        row(
            f,
            "Segments (taken / returned)",
            &s.segments.to_string(),
            &format!("{} / {}", s.segment_allocs, s.segment_frees),
        )?;
        row(
            f,
            "Allocations / frees",
            &s.alloc_count.to_string(),
            &s.free_count.to_string(),
        )?;
        row(
            f,
            "Cache hits / misses",
            &s.cache_hits.to_string(),
            &s.cache_misses.to_string(),
        )?;
        row(f, "empty_cache calls", &s.empty_cache_count.to_string(), "")?;
        row(f, "Out-of-memory errors", &s.oom_count.to_string(), "")?;
        rule(f, '-')?;
        row(f, "Largest free block", &bytes(s.largest_free_block), "")?;
        row(
            f,
            "Fragmentation of the cache",
            &format!("{:.1} %", 100.0 * s.fragmentation()),
            "",
        )?;
        if let Some(info) = self.device_memory {
            row(
                f,
                "Device memory free / total",
                &format_bytes(info.free),
                &format_bytes(info.total),
            )?;
        }
        if let Some(limit) = self.limit {
            row(f, "Allocator limit", &bytes(limit), "")?;
        }
        row(
            f,
            "Pinned host memory (process)",
            &format_bytes(self.pinned_in_use),
            &format_bytes(self.pinned_peak),
        )?;
        if !self.largest_live.is_empty() {
            rule(f, '-')?;
            writeln!(
                f,
                "| {:<w$} |",
                "Largest live blocks, with the line that created them:",
                w = WIDTH - 4
            )?;
            for block in &self.largest_live {
                let line = format!("{:>12}  {}", bytes(block.bytes), block.site);
                writeln!(f, "| {line:<w$} |", w = WIDTH - 4)?;
            }
        }
        rule(f, '=')
    }
}

#[cfg(test)]
mod tests {
    use std::panic::Location;

    use super::*;

    #[test]
    fn every_counter_is_printed() {
        let stats = MemoryStats {
            allocated_bytes: 3 << 20,
            requested_bytes: 3 << 20,
            reserved_bytes: 20 << 20,
            peak_allocated_bytes: 5 << 20,
            peak_reserved_bytes: 22 << 20,
            active_blocks: 3,
            inactive_blocks: 2,
            inactive_bytes: 17 << 20,
            largest_free_block: 15 << 20,
            segments: 2,
            alloc_count: 11,
            free_count: 8,
            cache_hits: 7,
            cache_misses: 4,
            segment_allocs: 3,
            segment_frees: 1,
            oom_count: 1,
            empty_cache_count: 2,
        };
        let summary = MemorySummary {
            device: Device::cuda(1),
            stats,
            device_memory: Some(MemoryInfo {
                free: 1 << 30,
                total: 4 << 30,
            }),
            limit: None,
            pinned_in_use: 4096,
            pinned_peak: 8192,
            graph: crate::GraphMemory {
                nodes: 12,
                saved_bytes: 3 << 20,
            },
            largest_live: vec![LiveBlock {
                bytes: 2 << 20,
                site: Location::caller(),
            }],
        };
        let text = summary.to_string();
        for expected in [
            "cuda:1",
            "3.00 MiB",
            "5.00 MiB",
            "20.00 MiB",
            "22.00 MiB",
            "17.00 MiB",
            "15.00 MiB",
            "11.8 %",
            "Out-of-memory errors",
            "4.00 KiB",
            "8.00 KiB",
            "1.00 GiB",
            "summary.rs",
            "saved for backward",
            "12 graph nodes",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert!(
            text.lines().all(|l| l.chars().count() == WIDTH),
            "ragged table:\n{text}"
        );
    }
}
