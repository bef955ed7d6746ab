//! [`GradScaler`]: dynamic loss scaling for half-precision training (LESSONS R25).
//!
//! f16 gradients below 6·10⁻⁸ flush to zero. The scaler multiplies the loss by a large factor
//! before backward, so the half-precision gradients stay representable, then divides the f32
//! gradients back before the optimizer (and before clipping, which must see true gradients). If
//! any gradient overflowed to inf or NaN, the step is skipped and the scale halves; after
//! `growth_interval` clean steps it doubles. The inf/NaN check runs on the device; deciding
//! whether to step reads one flag back, the one host sync per step (counted in
//! `cartage::stats()`).

//!
//! The scaler keeps PyTorch's per-optimizer state machine (`OptState` in
//! `torch/amp/grad_scaler.py`), one per [`ParamStore`] (an optimizer updates one store):
//! `Ready` → [`GradScaler::unscale`] → `Unscaled` → [`GradScaler::step`] → `Stepped`, and
//! [`GradScaler::update`] starts over. Unscaling twice, stepping twice and stepping with no
//! gradient at all are refused with [`Error::InvalidState`], as PyTorch raises; `unscale` checks
//! every gradient (devices, dtypes) before it divides any.

use std::collections::HashMap;

use cartage::{DType, Device, Error, Result, Tensor};

use crate::optim::Optimizer;
use crate::{ParamStore, StoreId};

/// Where a store's optimizer stands since the last [`GradScaler::update`] (PyTorch's `OptState`).
#[derive(Clone, Debug)]
enum Stage {
    /// Gradients divided; one inf/NaN flag per device (empty: no gradient at all).
    Unscaled(Vec<(Device, Tensor)>),
    /// Stepped (or skipped), with whether a gradient overflowed.
    Stepped { found_inf: bool },
}

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
/// let mut opt = Sgd::new(&store, 0.1)?;
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
    stages: HashMap<StoreId, Stage>,
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
            stages: HashMap::new(),
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

    /// Divide every gradient of `store` by the scale, and check them for inf/NaN on the device
    /// (one flag per device). [`GradScaler::step`] calls it when it was not called before (call
    /// it yourself to clip the true gradients first).
    ///
    /// Refused ([`Error::InvalidState`]) when called twice for `store` since the last
    /// [`GradScaler::update`], or after [`GradScaler::step`]; refused ([`Error::InvalidArgument`])
    /// for an f16 gradient (keep f32 master weights, as PyTorch requires) or a non-float one.
    /// Every gradient is checked before any is divided: a refused call changes nothing.
    pub fn unscale(&mut self, store: &ParamStore) -> Result<()> {
        const OP: &str = "GradScaler::unscale";
        match self.stages.get(&store.id()) {
            Some(Stage::Unscaled(_)) => {
                return Err(Error::InvalidState {
                    op: OP,
                    reason: "unscale() has already been called on this optimizer since the last update(); \
                             the gradients are already divided (call update() after step())"
                        .into(),
                });
            }
            Some(Stage::Stepped { .. }) => {
                return Err(Error::InvalidState {
                    op: OP,
                    reason: "unscale() is being called after step(); call update() first, then unscale() \
                             the next step's gradients"
                        .into(),
                });
            }
            None => {}
        }
        if !self.state.scale.is_finite() || self.state.scale <= 0.0 {
            return Err(Error::InvalidState {
                op: OP,
                reason: format!(
                    "the loss scale is {}; it must be finite and > 0 (a corrupt scaler state was loaded?)",
                    self.state.scale
                ),
            });
        }
        let _plain = cartage::no_grad();
        // Check every gradient before dividing any.
        let mut grads = Vec::new();
        for (name, var) in store.named_vars() {
            let Some(g) = var.grad() else { continue };
            let dtype = g.dtype();
            if dtype == DType::F16 || !dtype.is_float() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "Attempting to unscale {dtype} gradients (of `{name}`): keep the parameters in \
                         f32 (master weights) and run the forward under autocast; nothing was unscaled"
                    ),
                });
            }
            grads.push((var, g));
        }
        let inverse = 1.0 / self.state.scale;
        let mut flags: Vec<(Device, Tensor)> = Vec::new();
        let mut divided = Vec::with_capacity(grads.len());
        for (var, g) in grads {
            let g = g.mul_scalar(inverse)?;
            let finite = g.isfinite()?.flatten()?.all(&[0], false)?;
            let device = g.device();
            match flags.iter_mut().find(|(d, _)| *d == device) {
                Some((_, all)) => *all = all.logical_and(&finite)?,
                None => flags.push((device, finite)),
            }
            divided.push((var, g));
        }
        for (var, g) in divided {
            var.set_grad(Some(g))?;
        }
        self.stages.insert(store.id(), Stage::Unscaled(flags));
        Ok(())
    }

    /// Unscale (if not done), then run `optimizer.step` unless a gradient overflowed. Returns
    /// whether it stepped. Reads one flag back per device (one host sync on one device).
    ///
    /// Refused ([`Error::InvalidState`]) when called twice for `store` since the last
    /// [`GradScaler::update`], and when no parameter of `store` has a gradient ("No inf checks
    /// were recorded for this optimizer", as PyTorch): the backward pass did not reach it.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer, store: &ParamStore) -> Result<bool> {
        const OP: &str = "GradScaler::step";
        if let Some(Stage::Stepped { .. }) = self.stages.get(&store.id()) {
            return Err(Error::InvalidState {
                op: OP,
                reason: "step() has already been called since the last update(); call update() after each \
                         step()"
                    .into(),
            });
        }
        if !self.stages.contains_key(&store.id()) {
            self.unscale(store)?;
        }
        let Some(Stage::Unscaled(flags)) = self.stages.get(&store.id()) else {
            return Err(Error::InvalidState {
                op: OP,
                reason: "the gradients were not unscaled (an internal error of the scaler)".into(),
            });
        };
        if flags.is_empty() {
            return Err(Error::InvalidState {
                op: OP,
                reason: "No inf checks were recorded for this optimizer: no parameter of the store has a \
                         gradient (call scale(loss).backward() before step(), and check that the loss \
                         depends on the parameters)"
                    .into(),
            });
        }
        let mut found = false;
        for (_, all_finite) in flags {
            found |= !all_finite.item::<bool>()?;
        }
        if found {
            tracing::debug!(scale = self.state.scale, "gradient overflow: step skipped");
        } else {
            optimizer.step(store)?;
        }
        self.stages.insert(store.id(), Stage::Stepped { found_inf: found });
        Ok(!found)
    }

    /// Adjust the scale after the steps since the last update: back off if any step found an
    /// overflow, grow after `growth_interval` clean steps; then every store is ready for the
    /// next `unscale`/`step`. With no step since the last update nothing changes (PyTorch
    /// raises "No inf checks were recorded prior to update"; here a warning is logged).
    pub fn update(&mut self) {
        let mut any = false;
        let mut overflowed = false;
        for stage in self.stages.values() {
            match stage {
                Stage::Stepped { found_inf } => {
                    any = true;
                    overflowed |= *found_inf;
                }
                Stage::Unscaled(_) => {}
            }
        }
        self.stages.clear();
        if !any {
            tracing::warn!("GradScaler::update without a step since the last update: the scale is unchanged");
            return;
        }
        if overflowed {
            self.state.scale *= self.backoff_factor;
            self.state.growth_tracker = 0;
        } else {
            self.state.growth_tracker += 1;
            if self.state.growth_tracker >= self.growth_interval {
                self.state.scale *= self.growth_factor;
                self.state.growth_tracker = 0;
            }
        }
    }
}
