//! [`MemoryTracker`]: allocated and reserved bytes per step, a leak check and the curve (R20, R23).
//!
//! Record once per training step, at the same point of the step. A leak is *steady* growth of
//! allocated memory: over the last `window` samples the least-squares slope of allocated bytes
//! against the step exceeds a threshold (bytes per step, settable) and the line explains the
//! samples well (R² ≥ [`MIN_R_SQUARED`]), so that a one-off allocation — a cache filled once, a
//! larger batch — is not mistaken for a leak. Reserved memory is recorded and drawn but never
//! judged: the cache keeping freed blocks is normal.

use std::fmt;
#[cfg(feature = "svg")]
use std::path::Path;

use cartage_core::{Device, MemoryStats, Result, format_bytes};

use crate::runtime;

/// Default number of most recent samples the leak check fits.
pub const DEFAULT_WINDOW: usize = 16;

/// Default leak threshold in bytes per step: any block kept every step (the allocator rounds to
/// 512 bytes) is above it.
pub const DEFAULT_THRESHOLD: f64 = 256.0;

/// The fit must explain at least this share of the variance for growth to count as steady.
pub const MIN_R_SQUARED: f64 = 0.9;

/// One recorded step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// The step number (0, 1, 2, … in recording order unless given).
    pub step: u64,
    /// Bytes held by live tensors.
    pub allocated: usize,
    /// Bytes held in segments (allocated + cached free).
    pub reserved: usize,
    /// Bytes saved for backward by the live autograd graph on the device (0 for samples
    /// recorded from statistics alone).
    pub activations: usize,
}

/// The result of the leak check over the last window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeakCheck {
    /// Samples fitted.
    pub window: usize,
    /// Least-squares growth of allocated memory, in bytes per step.
    pub bytes_per_step: f64,
    /// How well a straight line explains the samples (1 for perfectly steady growth; 1 also when
    /// memory is perfectly flat).
    pub r_squared: f64,
    /// The threshold the slope was compared with.
    pub threshold: f64,
    /// Allocated bytes at the first and last sample of the window.
    pub first_allocated: usize,
    /// Bytes saved for backward by the live graph at the window's first sample.
    pub first_activations: usize,
    /// Bytes saved for backward by the live graph at the window's last sample.
    pub last_activations: usize,
    /// Allocated bytes at the last sample.
    pub last_allocated: usize,
}

impl LeakCheck {
    /// True when allocated memory grows steadily faster than the threshold.
    pub fn is_leak(&self) -> bool {
        self.bytes_per_step > self.threshold && self.r_squared >= MIN_R_SQUARED
    }
}

impl fmt::Display for LeakCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocated went from {} to {} over the last {} steps: {:+.0} B/step (fit R² {:.2}, threshold {:.0} B/step)",
            format_bytes(self.first_allocated as u64),
            format_bytes(self.last_allocated as u64),
            self.window,
            self.bytes_per_step,
            self.r_squared,
            self.threshold
        )?;
        let graph_growth = self.last_activations.saturating_sub(self.first_activations);
        let growth = self.last_allocated.saturating_sub(self.first_allocated);
        if self.is_leak() && graph_growth > 0 && graph_growth >= growth / 2 {
            write!(
                f,
                ": LEAK — the autograd graph grows ({} more saved for backward): a value kept with \
                 its graph, such as a loss pushed to a Vec every step, holds every activation of \
                 its step. Keep `loss.detach()` instead",
                format_bytes(graph_growth as u64)
            )
        } else if self.is_leak() {
            write!(
                f,
                ": LEAK — something keeps a tensor every step (a list of per-step losses?). \
                 Accumulate on the device and read once at the end"
            )
        } else {
            write!(f, ": steady")
        }
    }
}

/// Records memory per step, flags leaks and draws the curve. See the module docs.
///
/// ```
/// use cartage::memory::MemoryTracker;
/// use cartage::MemoryStats;
/// let mut tracker = MemoryTracker::detached().with_window(8);
/// for step in 0..8 {
///     let stats = MemoryStats { allocated_bytes: 1024 * step, reserved_bytes: 2 << 20, ..Default::default() };
///     tracker.record_stats(&stats);
/// }
/// assert!(tracker.leak_check().unwrap().is_leak());
/// ```
#[derive(Clone, Debug)]
pub struct MemoryTracker {
    device: Option<Device>,
    samples: Vec<MemorySample>,
    window: usize,
    threshold: f64,
}

impl MemoryTracker {
    /// A tracker that reads `device`'s statistics on [`MemoryTracker::record`].
    pub fn new(device: &Device) -> Self {
        MemoryTracker {
            device: Some(*device),
            ..MemoryTracker::detached()
        }
    }

    /// A tracker fed only through [`MemoryTracker::record_stats`] / [`MemoryTracker::record_sample`].
    pub fn detached() -> Self {
        MemoryTracker {
            device: None,
            samples: Vec::new(),
            window: DEFAULT_WINDOW,
            threshold: DEFAULT_THRESHOLD,
        }
    }

    /// Fit the leak check over the last `window` samples (at least 3).
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(3);
        self
    }

    /// Flag growth above `bytes_per_step`.
    pub fn with_leak_threshold(mut self, bytes_per_step: f64) -> Self {
        self.threshold = bytes_per_step;
        self
    }

    /// The device this tracker reads, if any.
    pub fn device(&self) -> Option<Device> {
        self.device
    }

    /// Record the device's current allocated and reserved bytes as the next step.
    /// (A detached tracker records nothing and returns an error.)
    pub fn record(&mut self) -> Result<MemorySample> {
        let device = self.device.ok_or_else(|| {
            cartage_core::Error::invalid(
                "MemoryTracker::record",
                "a detached tracker has no device; use record_stats",
            )
        })?;
        let stats = runtime::memory_stats(&device)?;
        let mut sample = self.record_stats(&stats);
        sample.activations = crate::graph_memory(&device).saved_bytes;
        if let Some(last) = self.samples.last_mut() {
            last.activations = sample.activations;
        }
        Ok(sample)
    }

    /// Record a statistics snapshot as the next step (one after the last sample's, which
    /// stays at `u64::MAX` once there).
    pub fn record_stats(&mut self, stats: &MemoryStats) -> MemorySample {
        // A sample recorded by hand may carry any step; the next one stays at the maximum.
        let step = self.samples.last().map_or(0, |s| s.step.saturating_add(1));
        let sample = MemorySample {
            step,
            allocated: stats.allocated_bytes,
            reserved: stats.reserved_bytes,
            activations: 0,
        };
        self.samples.push(sample);
        sample
    }

    /// Record a sample as it is.
    pub fn record_sample(&mut self, sample: MemorySample) {
        self.samples.push(sample);
    }

    /// Every sample so far.
    pub fn samples(&self) -> &[MemorySample] {
        &self.samples
    }

    /// Forget every sample.
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// The leak check over the last window; `None` until a full window has been recorded.
    pub fn leak_check(&self) -> Option<LeakCheck> {
        if self.samples.len() < self.window {
            return None;
        }
        let recent = &self.samples[self.samples.len() - self.window..];
        let (slope, r_squared) = least_squares(recent);
        Some(LeakCheck {
            window: self.window,
            bytes_per_step: slope,
            r_squared,
            threshold: self.threshold,
            first_allocated: recent[0].allocated,
            last_allocated: recent[recent.len() - 1].allocated,
            first_activations: recent[0].activations,
            last_activations: recent[recent.len() - 1].activations,
        })
    }

    /// True when the last window shows a leak.
    pub fn is_leaking(&self) -> bool {
        self.leak_check().is_some_and(|c| c.is_leak())
    }

    /// Draw allocated and reserved memory against the step as an SVG file (with the leak fit
    /// over the last window when there is one). Needs the `svg` feature (on by default).
    #[cfg(feature = "svg")]
    #[cfg_attr(docsrs, doc(cfg(feature = "svg")))]
    pub fn write_svg(&self, path: impl AsRef<Path>) -> Result<()> {
        let title = match self.device {
            Some(d) => format!("cartage memory on {d}"),
            None => "cartage memory".to_string(),
        };
        super::plot::write_memory_svg(path.as_ref(), &title, &self.samples, self.leak_check().as_ref())
    }
}

/// Slope (bytes per step) and R² of allocated bytes against the step.
fn least_squares(samples: &[MemorySample]) -> (f64, f64) {
    let n = samples.len() as f64;
    let mean_x = samples.iter().map(|s| s.step as f64).sum::<f64>() / n;
    let mean_y = samples.iter().map(|s| s.allocated as f64).sum::<f64>() / n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for s in samples {
        let (dx, dy) = (s.step as f64 - mean_x, s.allocated as f64 - mean_y);
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    if sxx == 0.0 {
        return (0.0, 1.0);
    }
    let slope = sxy / sxx;
    let r_squared = if syy == 0.0 { 1.0 } else { (sxy * sxy) / (sxx * syy) };
    (slope, r_squared)
}

/// The fitted line's value at `step`, for drawing: `(intercept, slope)` over `samples`.
#[cfg(feature = "svg")]
pub(super) fn fit_line(samples: &[MemorySample]) -> (f64, f64) {
    let (slope, _) = least_squares(samples);
    let n = samples.len() as f64;
    let mean_x = samples.iter().map(|s| s.step as f64).sum::<f64>() / n;
    let mean_y = samples.iter().map(|s| s.allocated as f64).sum::<f64>() / n;
    (mean_y - slope * mean_x, slope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker_with(allocated: impl IntoIterator<Item = usize>) -> MemoryTracker {
        let mut t = MemoryTracker::detached().with_window(10);
        for a in allocated {
            t.record_stats(&MemoryStats {
                allocated_bytes: a,
                reserved_bytes: 20 << 20,
                ..Default::default()
            });
        }
        t
    }

    #[test]
    fn steady_growth_is_a_leak() {
        let t = tracker_with((0..30).map(|i| (1 << 20) + 512 * i));
        let check = t.leak_check().unwrap();
        assert!((check.bytes_per_step - 512.0).abs() < 1e-6, "{check}");
        assert!(check.r_squared > 0.999);
        assert!(t.is_leaking(), "{check}");
        assert!(check.to_string().contains("LEAK"), "{check}");
    }

    #[test]
    fn flat_and_noisy_memory_is_not() {
        assert!(!tracker_with(std::iter::repeat_n(4096, 30)).is_leaking());
        let sawtooth = (0..30).map(|i| if i % 2 == 0 { 4096 } else { 8192 });
        assert!(!tracker_with(sawtooth).is_leaking());
        let shrinking = (0..30).map(|i| 1_000_000 - 512 * i);
        assert!(!tracker_with(shrinking).is_leaking());
    }

    #[test]
    fn a_one_off_jump_is_not_steady_growth() {
        let jump = (0..30).map(|i| if i < 25 { 4096 } else { 4096 + (64 << 20) });
        let t = tracker_with(jump);
        let check = t.leak_check().unwrap();
        assert!(check.bytes_per_step > 0.0);
        assert!(!check.is_leak(), "{check}");
    }

    #[test]
    fn threshold_is_the_users() {
        let slow = || tracker_with((0..30).map(|i| 512 * i));
        assert!(slow().is_leaking());
        assert!(!slow().with_leak_threshold(1024.0).is_leaking());
    }

    #[test]
    fn extreme_steps_and_windows_do_not_panic() {
        let mut t = MemoryTracker::detached().with_window(usize::MAX);
        t.record_sample(MemorySample {
            step: u64::MAX,
            allocated: usize::MAX,
            reserved: usize::MAX,
            activations: 0,
        });
        let next = t.record_stats(&MemoryStats::default());
        assert_eq!(next.step, u64::MAX);
        assert!(t.leak_check().is_none());
        let mut t = MemoryTracker::detached().with_window(0).with_leak_threshold(f64::NAN);
        for step in [u64::MAX - 2, u64::MAX - 1, u64::MAX] {
            t.record_sample(MemorySample {
                step,
                allocated: usize::MAX,
                reserved: 0,
                activations: 0,
            });
        }
        let check = t.leak_check().unwrap();
        assert_eq!(check.window, 3);
        assert!(!check.is_leak(), "{check}");
        let _ = check.to_string();
    }

    #[test]
    #[cfg(feature = "svg")]
    fn svg_write_failures_keep_the_io_kind() {
        let t = tracker_with((0..12).map(|i| 512 * i));
        let err = t.write_svg("/nonexistent-cartage-directory/memory.svg").unwrap_err();
        assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound), "{err}");
        assert!(
            err.to_string().contains("/nonexistent-cartage-directory/memory.svg"),
            "{err}"
        );
    }

    #[test]
    fn no_verdict_before_a_full_window() {
        let t = tracker_with((0..9).map(|i| 512 * i));
        assert!(t.leak_check().is_none());
        assert!(!t.is_leaking());
        assert!(MemoryTracker::detached().record().is_err());
    }
}
