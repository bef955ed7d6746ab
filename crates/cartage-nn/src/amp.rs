//! [`GradScaler`]: dynamic loss scaling for half-precision training (LESSONS R25).
//!
//! f16 gradients below 6·10⁻⁸ flush to zero. The scaler multiplies the loss by a large factor
//! before backward, so the half-precision gradients stay representable, then divides the f32
//! gradients back before the optimizer (and before clipping, which must see true gradients). If
//! any gradient overflowed to inf or NaN, the step is skipped and the scale halves; after
//! `growth_interval` clean steps it doubles. The inf/NaN check runs on the device; deciding
//! whether to step reads one flag back, the one host sync per step (counted in
//! `cartage::stats()`).

use cartage::{DType, Result, Tensor};

use crate::ParamStore;
use crate::optim::Optimizer;

/// The scaler's numbers, for checkpoints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalerState {
    /// The current loss scale.
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub growth_tracker: u64,
}

/// Dynamic loss scaling: `scale(loss).backward()`, then [`GradScaler::step`], then
/// [`GradScaler::update`].
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::{GradScaler, ParamStore, optim::Sgd};
/// # fn main() -> cartage::Result<()> {
/// let store = ParamStore::new(&Device::cpu());
/// let w = store.root().var("w", Tensor::ones(&[4], DType::F32, &Device::cpu())?)?;
/// let mut opt = Sgd::new(&store, 0.1);
/// let mut scaler = GradScaler::new();
/// let loss = w.tensor().square()?.sum_all()?;
/// scaler.scale(&loss)?.backward()?;
/// assert!(scaler.step(&mut opt, &store)?);              // finite gradients: stepped
/// scaler.update();
/// assert_eq!(w.value().to_vec::<f32>()?, vec![0.8; 4]); // 1 - 0.1 · 2
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct GradScaler {
    state: ScalerState,
    /// Factor applied after `growth_interval` clean steps (2).
    pub growth_factor: f64,
    /// Factor applied after an overflow (0.5).
    pub backoff_factor: f64,
    /// Clean steps between growths (2000).
    pub growth_interval: u64,
    found_inf: Option<Tensor>,
    overflowed: bool,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 2¹⁶, growth ×2 every 2000 clean steps, backoff ×0.5.
    pub fn new() -> GradScaler {
        GradScaler::with_scale(65536.0)
    }

    /// Start from `scale`.
    pub fn with_scale(scale: f64) -> GradScaler {
        GradScaler {
            state: ScalerState {
                scale,
                growth_tracker: 0,
            },
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            found_inf: None,
            overflowed: false,
        }
    }

    /// The current scale.
    pub fn current_scale(&self) -> f64 {
        self.state.scale
    }

    /// The state to save in a checkpoint.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// Resume from a checkpoint's state.
    pub fn load_state(&mut self, state: ScalerState) {
        self.state = state;
    }

    /// `loss × scale` (recorded: backward through it gives scaled gradients).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        loss.mul_scalar(self.state.scale)
    }

    /// Divide every gradient of `store` by the scale, and check them for inf/NaN on the device.
    /// [`GradScaler::step`] calls it when it was not called before (call it yourself to clip
    /// the true gradients first).
    pub fn unscale(&mut self, store: &ParamStore) -> Result<()> {
        let _plain = cartage::no_grad();
        let device = store.device();
        let mut all_finite = Tensor::ones(&[], DType::Bool, &device)?;
        let inverse = 1.0 / self.state.scale;
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let g = g.mul_scalar(inverse)?;
            let finite = g.isfinite()?.flatten()?.all(&[0], false)?;
            all_finite = all_finite.logical_and(&finite)?;
            var.set_grad(Some(g))?;
        }
        self.found_inf = Some(all_finite.logical_not()?);
        Ok(())
    }

    /// Unscale (if not done), then run `optimizer.step` unless a gradient overflowed. Returns
    /// whether it stepped. Reads one flag back from the device.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer, store: &ParamStore) -> Result<bool> {
        if self.found_inf.is_none() {
            self.unscale(store)?;
        }
        let found = self
            .found_inf
            .take()
            .map(|f| f.item::<bool>())
            .transpose()?
            .unwrap_or(false);
        self.overflowed = found;
        if found {
            tracing::debug!(scale = self.state.scale, "gradient overflow: step skipped");
            return Ok(false);
        }
        optimizer.step(store)?;
        Ok(true)
    }

    /// Adjust the scale after a step: back off after an overflow, grow after
    /// `growth_interval` clean steps.
    pub fn update(&mut self) {
        if self.overflowed {
            self.state.scale *= self.backoff_factor;
            self.state.growth_tracker = 0;
        } else {
            self.state.growth_tracker += 1;
            if self.state.growth_tracker >= self.growth_interval {
                self.state.scale *= self.growth_factor;
                self.state.growth_tracker = 0;
            }
        }
        self.overflowed = false;
    }
}
