//! Device timing for [`Backend::record_event`](cartage_core::Backend::record_event).
//!
//! With `TIMESTAMP_QUERY` (and `TIMESTAMP_QUERY_INSIDE_ENCODERS`, else a timestamped empty
//! pass), an event is a GPU timestamp written after all work recorded before it, on the device's
//! own clock; `elapsed` resolves both queries, reads them back and scales by the queue's
//! timestamp period. Without the feature an event is the host's `Instant` taken after a full
//! synchronisation: end-to-end time including submission, documented as such in
//! `Capabilities::device_timing = false`.

use std::time::{Duration, Instant};

/// A recorded point on the device's timeline.
pub(crate) enum WgpuEvent {
    /// A timestamp query (one query set of one entry per event).
    Timestamp {
        /// The query set holding the timestamp.
        query_set: wgpu::QuerySet,
        /// Identity of the device that recorded it.
        device: cartage_core::Device,
    },
    /// Host time after a synchronisation (adapters without timestamp queries).
    Host(Instant),
}

/// Nanoseconds between two raw timestamps, as a `Duration` (negative spans are clamped to 0).
pub(crate) fn span(start: u64, end: u64, period_ns: f32) -> Duration {
    let ticks = end.saturating_sub(start);
    Duration::from_nanos((ticks as f64 * f64::from(period_ns)).round() as u64)
}
