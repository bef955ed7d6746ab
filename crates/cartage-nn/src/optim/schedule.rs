//! Learning-rate schedules: the rate for each step, set on the optimizer before it.

use std::f64::consts::PI;

/// A learning rate as a function of the step (0-based).
pub trait LrSchedule {
    /// The rate for `step`.
    fn lr(&self, step: usize) -> f64;
}

/// Linear warm-up from 0 to `base` over `warmup` steps, then a cosine decay to `min` at
/// `total` steps (constant `min` after).
///
/// ```
/// use cartage_nn::optim::{LrSchedule, WarmupCosine};
/// let s = WarmupCosine { base: 1.0, min: 0.0, warmup: 10, total: 110 };
/// assert_eq!(s.lr(0), 0.1);
/// assert_eq!(s.lr(9), 1.0);
/// assert!((s.lr(60) - 0.5).abs() < 1e-12);
/// assert_eq!(s.lr(500), 0.0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct WarmupCosine {
    /// Peak rate.
    pub base: f64,
    /// Final rate.
    pub min: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Steps until the decay ends.
    pub total: usize,
}

impl LrSchedule for WarmupCosine {
    fn lr(&self, step: usize) -> f64 {
        if step < self.warmup {
            // In f64: `step + 1` overflows at usize::MAX.
            return self.base * (step as f64 + 1.0) / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        self.min + 0.5 * (self.base - self.min) * (1.0 + (PI * progress).cos())
    }
}

/// `base · gamma^(step / step_size)` (`torch.optim.lr_scheduler.StepLR`).
///
/// ```
/// use cartage_nn::optim::{LrSchedule, StepLr};
/// let s = StepLr { base: 1.0, step_size: 10, gamma: 0.5 };
/// assert_eq!((s.lr(0), s.lr(10), s.lr(25)), (1.0, 0.5, 0.25));
/// assert_eq!(s.lr(usize::MAX), 0.0); // decays to zero, never inf
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StepLr {
    /// Initial rate.
    pub base: f64,
    /// Steps between decays.
    pub step_size: usize,
    /// Factor per decay.
    pub gamma: f64,
}

impl LrSchedule for StepLr {
    fn lr(&self, step: usize) -> f64 {
        // PyTorch's `base_lr * gamma ** (last_epoch // step_size)`: a float power of the whole
        // number of decays (an i32 exponent would wrap past 2^31 decays).
        self.base * self.gamma.powf((step / self.step_size.max(1)) as f64)
    }
}
