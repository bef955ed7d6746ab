//! [`Measurement`]: the steady-state samples of one benchmark and their median and spread.
//!
//! Every sample is the time of one iteration, averaged over the iterations of one timed region
//! (see [`crate::bench::Bench`]). The median is the headline figure (robust to the odd slow
//! sample); p10 and p90 give the spread.

use std::fmt;
use std::time::Duration;

/// How the samples of a [`Measurement`] were timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timing {
    /// On the device's own clock: a pair of events recorded around the work (CUDA events, wgpu
    /// timestamp queries, `Instant` on the CPU), read after the device finished.
    DeviceEvents,
    /// On the host's clock, with a device synchronisation before the start and inside the timed
    /// region before the stop (for devices without event timing).
    HostSynchronized,
}

impl Timing {
    /// `device-events` or `host-synchronized`.
    pub const fn name(self) -> &'static str {
        match self {
            Timing::DeviceEvents => "device-events",
            Timing::HostSynchronized => "host-synchronized",
        }
    }
}

impl fmt::Display for Timing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The result of one benchmark: per-iteration times of the steady state, with median and spread.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    samples: Vec<Duration>,
    iters_per_sample: u64,
    warmup_iters: u64,
    timing: Timing,
    median: Duration,
    p10: Duration,
    p90: Duration,
}

impl Measurement {
    /// A measurement from per-iteration sample times; `None` when `samples` is empty.
    pub fn from_samples(
        samples: Vec<Duration>,
        iters_per_sample: u64,
        warmup_iters: u64,
        timing: Timing,
    ) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        Some(Measurement {
            median: percentile(&sorted, 0.5),
            p10: percentile(&sorted, 0.1),
            p90: percentile(&sorted, 0.9),
            samples,
            iters_per_sample,
            warmup_iters,
            timing,
        })
    }

    /// The median time of one iteration.
    pub fn median(&self) -> Duration {
        self.median
    }

    /// The 10th percentile of the per-iteration times.
    pub fn p10(&self) -> Duration {
        self.p10
    }

    /// The 90th percentile of the per-iteration times.
    pub fn p90(&self) -> Duration {
        self.p90
    }

    /// The per-iteration time of each sample, in the order they were taken.
    pub fn samples(&self) -> &[Duration] {
        &self.samples
    }

    /// Iterations inside each timed region.
    pub fn iters_per_sample(&self) -> u64 {
        self.iters_per_sample
    }

    /// Calls made before the first timed region (not part of any sample).
    pub fn warmup_iters(&self) -> u64 {
        self.warmup_iters
    }

    /// How the samples were timed.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// `work` units per second at the median time (bytes → bytes/s, flops → flop/s).
    pub fn per_second(&self, work: f64) -> f64 {
        work / self.median.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// (p90 − p10) / median: the relative spread of the samples.
    pub fn relative_spread(&self) -> f64 {
        let median = self.median.as_secs_f64();
        if median == 0.0 {
            0.0
        } else {
            (self.p90.as_secs_f64() - self.p10.as_secs_f64()) / median
        }
    }
}

impl fmt::Display for Measurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "median {:?} (p10 {:?}, p90 {:?}; {} samples × {} iterations, {})",
            self.median,
            self.p10,
            self.p90,
            self.samples.len(),
            self.iters_per_sample,
            self.timing
        )
    }
}

/// The `q`-quantile of sorted values, interpolating linearly between neighbours.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let last = sorted.len() - 1;
    let position = q.clamp(0.0, 1.0) * last as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    let weight = position - below as f64;
    let low = sorted[below].as_secs_f64();
    let high = sorted[above].as_secs_f64();
    Duration::from_secs_f64(low + (high - low) * weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn median_and_percentiles_follow_the_sorted_samples() {
        let samples: Vec<Duration> = [7, 1, 10, 3, 5, 2, 9, 4, 8, 6].into_iter().map(ms).collect();
        let m = Measurement::from_samples(samples.clone(), 4, 2, Timing::DeviceEvents).unwrap();
        assert_eq!(m.median(), Duration::from_micros(5500));
        assert_eq!(m.p10(), Duration::from_micros(1900));
        assert_eq!(m.p90(), Duration::from_micros(9100));
        assert_eq!(m.samples(), samples.as_slice(), "samples keep their order");
        assert_eq!((m.iters_per_sample(), m.warmup_iters()), (4, 2));
        assert!((m.per_second(11.0) - 2000.0).abs() < 1e-6);
    }

    #[test]
    fn one_slow_sample_does_not_move_the_median() {
        let mut samples = vec![ms(2); 9];
        samples.push(ms(500));
        let m = Measurement::from_samples(samples, 1, 1, Timing::HostSynchronized).unwrap();
        assert_eq!(m.median(), ms(2));
        assert!(m.p90() < ms(60), "{m}");
    }

    #[test]
    fn no_samples_is_no_measurement() {
        assert!(Measurement::from_samples(Vec::new(), 1, 0, Timing::DeviceEvents).is_none());
    }
}
