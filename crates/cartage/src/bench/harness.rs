//! [`Bench`]: warm-up, then timed regions on the device's clock, repeated to a time budget.
//!
//! One run of [`Bench::run`]:
//! 1. **Warm-up** (not measured): call the work, synchronising after each call, until the warm-up
//!    time has passed and at least `min_warmup_iters` calls ran. First calls pay for kernel
//!    compilation, pipeline creation and the allocator filling its cache; none of that is steady
//!    state. The last warm-up call's time estimates one call.
//! 2. **Plan** ([`plan_samples`]): enough iterations per timed region that one region lasts at least
//!    `min_sample_time` (the timer's resolution stays negligible), and as many regions as fit in
//!    the budget, between `min_samples` and `max_samples`.
//! 3. **Samples**: each region starts from an idle device (`synchronize`), runs the iterations,
//!    and is read only after the device finished them: with [`Timing::DeviceEvents`] an event
//!    pair is read after a synchronisation; with [`Timing::HostSynchronized`] the host clock stops
//!    after a synchronisation inside the region. A timer that stopped when the host had merely
//!    *queued* the work would measure the dispatch, not the device (the tests show the gap).

use std::time::{Duration, Instant};

use cartage_core::{Backend, Device, Result};

use super::measurement::{Measurement, Timing};

/// Which clock a [`Bench`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimingMode {
    /// Device events where the device can time itself (`Capabilities::device_timing`), else the
    /// host clock with synchronisation.
    #[default]
    Auto,
    /// Always the device's events.
    DeviceEvents,
    /// Always the host clock, synchronising before the start and before the stop.
    HostSynchronized,
}

/// A benchmark configuration; [`Bench::run`] measures one piece of work with it.
///
/// ```
/// use std::time::Duration;
/// use cartage::bench::Bench;
/// let bench = Bench::new().budget(Duration::from_millis(200)).samples(5, 50);
/// assert_eq!(bench.budget_time(), Duration::from_millis(200));
/// ```
#[derive(Clone, Debug)]
pub struct Bench {
    warmup: Duration,
    min_warmup_iters: u64,
    budget: Duration,
    min_samples: usize,
    max_samples: usize,
    min_sample_time: Duration,
    timing: TimingMode,
}

impl Default for Bench {
    fn default() -> Self {
        Bench::new()
    }
}

impl Bench {
    /// Defaults for a careful measurement: 200 ms warm-up, 1 s of samples, 5 to 200 samples of at
    /// least 1 ms each.
    pub fn new() -> Self {
        Bench {
            warmup: Duration::from_millis(200),
            min_warmup_iters: 2,
            budget: Duration::from_secs(1),
            min_samples: 5,
            max_samples: 200,
            min_sample_time: Duration::from_millis(1),
            timing: TimingMode::Auto,
        }
    }

    /// Defaults for a smoke run: 20 ms warm-up, 100 ms of samples, 3 to 30 samples.
    pub fn quick() -> Self {
        Bench {
            warmup: Duration::from_millis(20),
            min_warmup_iters: 2,
            budget: Duration::from_millis(100),
            min_samples: 3,
            max_samples: 30,
            min_sample_time: Duration::from_micros(500),
            timing: TimingMode::Auto,
        }
    }

    /// Time spent warming up before the first sample.
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.warmup = warmup;
        self
    }

    /// At least this many warm-up calls, however long they take (0 allowed).
    pub fn min_warmup_iters(mut self, iters: u64) -> Self {
        self.min_warmup_iters = iters;
        self
    }

    /// Time spent taking samples (a target: `min_samples` are always taken).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The number of samples, at least `min` (≥ 1) and at most `max`.
    pub fn samples(mut self, min: usize, max: usize) -> Self {
        self.min_samples = min.max(1);
        self.max_samples = max.max(self.min_samples);
        self
    }

    /// Each timed region runs enough iterations to last at least this long.
    pub fn min_sample_time(mut self, time: Duration) -> Self {
        self.min_sample_time = time;
        self
    }

    /// Which clock to read.
    pub fn timing(mut self, timing: TimingMode) -> Self {
        self.timing = timing;
        self
    }

    /// The sampling budget.
    pub fn budget_time(&self) -> Duration {
        self.budget
    }

    /// The timing this configuration uses on `backend`.
    pub fn timing_for(&self, backend: &dyn Backend) -> Timing {
        match self.timing {
            TimingMode::DeviceEvents => Timing::DeviceEvents,
            TimingMode::HostSynchronized => Timing::HostSynchronized,
            TimingMode::Auto if backend.capabilities().device_timing => Timing::DeviceEvents,
            TimingMode::Auto => Timing::HostSynchronized,
        }
    }

    /// Measure `work` (one iteration per call) on `backend`: warm-up, then timed samples.
    ///
    /// `work` enqueues its operations on `backend`'s device; the harness synchronises, so `work`
    /// need not. The first error from `work` or the device ends the run.
    pub fn run(&self, backend: &dyn Backend, mut work: impl FnMut() -> Result<()>) -> Result<Measurement> {
        let timing = self.timing_for(backend);
        let (warmup_iters, per_call) = self.warm_up(backend, &mut work)?;
        let (iters, count) = plan_samples(
            per_call,
            self.min_sample_time,
            self.budget,
            self.min_samples,
            self.max_samples,
        );
        // Reserved up to a bound: `samples(usize::MAX, ..)` asks for more than any memory holds.
        let mut samples = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let region = match timing {
                Timing::DeviceEvents => time_with_events(backend, iters, &mut work)?,
                Timing::HostSynchronized => time_with_host_clock(backend, iters, &mut work)?,
            };
            samples.push(Duration::from_nanos((region.as_nanos() / u128::from(iters)) as u64));
        }
        tracing::debug!(device = %backend.device(), %timing, iters, samples = count, "benchmark measured");
        Measurement::from_samples(samples, iters, warmup_iters, timing)
            .ok_or_else(|| cartage_core::Error::invalid("bench", "no samples were taken"))
    }

    /// Measure `work` on `device` (its backend from [`crate::runtime::backend`]).
    ///
    /// ```
    /// # fn main() -> cartage::Result<()> {
    /// use cartage::prelude::*;
    /// use cartage::bench::Bench;
    /// let device = Device::cpu();
    /// let a = Tensor::rand(&[64, 64], DType::F32, 7, &device)?;
    /// let m = Bench::quick().run_on(&device, || a.matmul(&a).map(drop))?;
    /// assert!(m.median() > std::time::Duration::ZERO);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run_on(&self, device: &Device, work: impl FnMut() -> Result<()>) -> Result<Measurement> {
        let backend = crate::runtime::backend(device)?;
        self.run(backend.as_ref(), work)
    }

    /// Warm up; returns the number of calls and the estimated time of one call: the quickest
    /// synchronised call after the first (the first pays one-time costs), or the first alone.
    fn warm_up(&self, backend: &dyn Backend, work: &mut impl FnMut() -> Result<()>) -> Result<(u64, Duration)> {
        backend.synchronize()?;
        let started = Instant::now();
        let mut calls = 0u64;
        let mut first = None;
        let mut quickest: Option<Duration> = None;
        while calls < self.min_warmup_iters || started.elapsed() < self.warmup {
            let call = Instant::now();
            work()?;
            backend.synchronize()?;
            let time = call.elapsed();
            if first.is_none() {
                first = Some(time);
            } else {
                quickest = Some(quickest.map_or(time, |q| q.min(time)));
            }
            calls += 1;
        }
        let per_call = match quickest.or(first) {
            Some(time) => time,
            None => time_with_host_clock(backend, 1, work)?,
        };
        Ok((calls, per_call))
    }
}

/// Iterations per timed region and number of regions for work that takes `per_call`:
/// each region lasts at least `min_sample_time`, and the regions fill `budget`, within
/// `[min_samples, max_samples]`.
pub fn plan_samples(
    per_call: Duration,
    min_sample_time: Duration,
    budget: Duration,
    min_samples: usize,
    max_samples: usize,
) -> (u64, usize) {
    let per_call = per_call.as_nanos().max(1);
    let iters = min_sample_time.as_nanos().div_ceil(per_call).clamp(1, 1_000_000_000);
    let fits = budget.as_nanos() / (per_call * iters);
    let count = fits.min(max_samples as u128) as usize;
    let count = count.clamp(min_samples.max(1), max_samples.max(1));
    let iters = iters as u64;
    (iters, count)
}

/// The time of `iters` calls of `work` as one region read with `timing` (synchronised as
/// [`Bench::run`] does), for harnesses that choose their own iteration counts (criterion's
/// `iter_custom`).
pub fn time_region(
    backend: &dyn Backend,
    timing: Timing,
    iters: u64,
    mut work: impl FnMut() -> Result<()>,
) -> Result<Duration> {
    match timing {
        Timing::DeviceEvents => time_with_events(backend, iters, &mut work),
        Timing::HostSynchronized => time_with_host_clock(backend, iters, &mut work),
    }
}

/// One region on the device's clock: events around the work, read after a synchronisation.
fn time_with_events(backend: &dyn Backend, iters: u64, work: &mut impl FnMut() -> Result<()>) -> Result<Duration> {
    backend.synchronize()?;
    let start = backend.record_event()?;
    for _ in 0..iters {
        work()?;
    }
    let end = backend.record_event()?;
    backend.synchronize()?;
    backend.elapsed(&start, &end)
}

/// One region on the host's clock, with the synchronisation inside it.
fn time_with_host_clock(backend: &dyn Backend, iters: u64, work: &mut impl FnMut() -> Result<()>) -> Result<Duration> {
    backend.synchronize()?;
    let start = Instant::now();
    for _ in 0..iters {
        work()?;
    }
    backend.synchronize()?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_fills_the_budget_with_regions_above_the_timer_resolution() {
        let ms = Duration::from_millis;
        // 10 µs calls, 1 ms regions: 100 iterations; 100 ms budget → 100 regions, capped at 50.
        assert_eq!(
            plan_samples(Duration::from_micros(10), ms(1), ms(100), 5, 50),
            (100, 50)
        );
        // 2 ms calls already exceed the region: 1 iteration; 100 ms → 50 regions, within [5, 200].
        assert_eq!(plan_samples(ms(2), ms(1), ms(100), 5, 200), (1, 50));
        // 3 s calls: the budget allows none, the minimum still applies.
        assert_eq!(plan_samples(Duration::from_secs(3), ms(1), ms(100), 5, 200), (1, 5));
        // A zero estimate never divides by zero.
        let (iters, count) = plan_samples(Duration::ZERO, ms(1), ms(10), 3, 10);
        assert!(iters >= 1 && (3..=10).contains(&count));
    }
}
