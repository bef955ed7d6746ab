//! Opt-in per-op device timing: while a profile is open
//! ([`WgpuBackend::start_op_profile`](crate::WgpuBackend::start_op_profile)), every launched
//! kernel is bracketed by two timestamp queries and labelled with its op, dtype and operand
//! shapes; [`finish_op_profile`](crate::WgpuBackend::finish_op_profile) reads the timestamps back
//! and sums them per label.
//!
//! Profiling changes what it measures a little: each timestamp ends the open compute pass, so the
//! kernels run one pass each and the host records more commands. It is a tool for finding where
//! a step's device time goes (there is no Vulkan kernel profiler to ask), not a benchmark.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use cartage_core::{Event, Kernel};

/// Device time spent by every launch with one label while a profile was open.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// The op's name, dtype and operand shapes (`*` marks a strided operand), for example
    /// `matmul f32 16384x384 · 384x1536* → 16384x1536`.
    pub label: String,
    /// Launches with this label.
    pub calls: u64,
    /// Their summed device time.
    pub total: Duration,
}

/// One bracketed launch, waiting to be read back.
pub(crate) struct PendingLaunch {
    /// See [`OpTiming::label`].
    pub label: String,
    /// Timestamp before the launch.
    pub start: Event,
    /// Timestamp after it.
    pub end: Event,
}

/// The label of `kernel`: op, dtype and each operand's shape, `*` after a strided one.
pub(crate) fn label(kernel: &Kernel) -> String {
    let mut label = format!("{} {}", kernel.op().name(), kernel.dtype());
    for (i, operand) in kernel.operands().iter().enumerate() {
        let shape = operand.layout.shape();
        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
        let separator = if i == 0 { " " } else { ", " };
        let strided = if operand.layout.is_contiguous() { "" } else { "*" };
        let _ = write!(label, "{separator}[{}]{strided}", dims.join("x"));
    }
    label
}

/// Sum `times` per label, largest total first.
pub(crate) fn aggregate(times: impl IntoIterator<Item = (String, Duration)>) -> Vec<OpTiming> {
    let mut by_label: BTreeMap<String, (u64, Duration)> = BTreeMap::new();
    for (label, time) in times {
        let entry = by_label.entry(label).or_default();
        entry.0 += 1;
        entry.1 += time;
    }
    let mut rows: Vec<OpTiming> = by_label
        .into_iter()
        .map(|(label, (calls, total))| OpTiming { label, calls, total })
        .collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.label.cmp(&b.label)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregate_sums_per_label_largest_first() {
        let ms = Duration::from_millis;
        let rows = aggregate([
            ("add f32 [4]".to_string(), ms(1)),
            ("matmul f32 [4x4]".to_string(), ms(5)),
            ("add f32 [4]".to_string(), ms(2)),
        ]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].label, "matmul f32 [4x4]");
        assert_eq!((rows[1].calls, rows[1].total), (2, ms(3)));
    }
}
