//! `cartage::bench`: measuring device work honestly (LESSONS R29).
//!
//! A GPU runs asynchronously: a call that launches a kernel returns long before the kernel ends,
//! so a host timer around the call measures the dispatch, not the work. [`Bench`] therefore
//! - warms up first (compilation, pipeline creation and allocator growth are not steady state),
//! - times each region on the device's clock (CUDA events, wgpu timestamp queries, `Instant` on
//!   the CPU) and reads it only after synchronising, or on the host clock with the
//!   synchronisation inside the region where the device has no clock of its own,
//! - repeats to a time budget and reports the median with p10/p90 ([`Measurement`]).
//!
//! ```
//! use std::time::Duration;
//! use cartage::bench::{Bench, Measurement, Timing};
//! // The harness runs `work` on a backend: `Bench::new().run(backend.as_ref(), || work())`.
//! // A measurement is plain data:
//! let ms = Duration::from_millis;
//! let m = Measurement::from_samples(vec![ms(3), ms(1), ms(2)], 10, 2, Timing::DeviceEvents).unwrap();
//! assert_eq!(m.median(), ms(2));
//! # let _ = Bench::quick();
//! ```

mod harness;
mod measurement;
mod naming;
#[cfg(test)]
mod tests;

pub use harness::{Bench, TimingMode, plan_samples, time_region};
pub use measurement::{Measurement, Timing};
pub use naming::{bench_name, device_segment, name_segment};
