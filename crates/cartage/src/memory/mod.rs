//! Memory you can read (LESSONS R2, R19–R23).
//!
//! - [`memory_summary`]: one device's allocator as a table (allocated, reserved, peaks, blocks,
//!   segments, counts, cache hits, OOMs, fragmentation, pinned host memory, largest live blocks).
//! - [`MemoryTracker`]: allocated/reserved per step, a leak check (steady growth by a
//!   least-squares fit over a window, threshold in bytes per step) and the curve as SVG.
//! - [`tensor_bytes`] and [`TrainingEstimate`]: what a tensor or a training job needs, and
//!   whether it fits the device's free memory, before allocating anything.
//!
//! The counters themselves come from [`crate::memory_stats`]; [`crate::empty_cache`] returns
//! cached free segments to the device (between phases, not every step: R21).

mod estimate;
#[cfg(feature = "svg")]
mod plot;
mod summary;
mod tracker;

pub use estimate::{FitReport, Optimizer, TrainingEstimate, tensor_bytes};
pub use summary::{MemorySummary, SUMMARY_LIVE_BLOCKS, memory_summary};
pub use tracker::{DEFAULT_THRESHOLD, DEFAULT_WINDOW, LeakCheck, MIN_R_SQUARED, MemorySample, MemoryTracker};
