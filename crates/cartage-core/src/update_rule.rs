//! The optimizer updates a backend can run as one fused in-place kernel ([`crate::Kernel::Update`]):
//! SGD (momentum, Nesterov, L2 weight decay) and Adam/AdamW, with PyTorch's formulas.
//!
//! The host-side scalars (bias corrections, decay factors) are computed once here, in f64, by
//! [`AdamUpdate::coefficients`] and [`SgdUpdate::coefficients`], so that every backend applies
//! the same constants and only the per-element arithmetic is written per backend.

use crate::error::{Error, Result};

/// One Adam or AdamW step (`torch.optim.Adam`/`AdamW`, no amsgrad), per element:
///
/// ```text
/// g  = grad + l2·p                      (Adam's L2 decay; l2 = 0 for AdamW)
/// p  = p · decay                        (AdamW's decoupled decay 1 − lr·wd; 1 for Adam)
/// m  = m + (1 − β₁)·(g − m)
/// v  = v + (1 − β₂)·(g² − v)
/// p  = p − step_size · m / (√v · inv_sqrt_bc2 + eps)
/// ```
/// with `step_size = lr / (1 − β₁ᵗ)` and `inv_sqrt_bc2 = 1 / √(1 − β₂ᵗ)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamUpdate {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f64,
    /// Decay of the second moment, in `[0, 1)`.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: L2 added to the gradient (Adam) or decoupled (AdamW).
    pub weight_decay: f64,
    /// AdamW's decoupled decay when true.
    pub decoupled: bool,
    /// The step number `t` of this update, from 1.
    pub step: u64,
}

/// The per-element constants of one [`AdamUpdate`], in f64 (backends round them to their
/// compute type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamCoefficients {
    /// Multiplies `p` before the update (`1 − lr·wd` for AdamW, else 1).
    pub decay: f64,
    /// Multiplies `p` into the gradient (`wd` for Adam, else 0).
    pub l2: f64,
    /// `1 − β₁`.
    pub one_minus_beta1: f64,
    /// `1 − β₂`.
    pub one_minus_beta2: f64,
    /// `1 / √(1 − β₂ᵗ)`.
    pub inv_sqrt_bc2: f64,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f64,
    /// Added to the denominator.
    pub eps: f64,
}

impl AdamUpdate {
    /// The constants every backend applies per element.
    ///
    /// ```
    /// use cartage_core::AdamUpdate;
    /// let c = AdamUpdate { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01,
    ///                      decoupled: true, step: 1 }.coefficients();
    /// assert!((c.step_size - 1e-2).abs() < 1e-12); // lr / (1 − 0.9)
    /// assert_eq!(c.l2, 0.0);
    /// ```
    pub fn coefficients(&self) -> AdamCoefficients {
        let t = self.step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        let (decay, l2) = match (self.decoupled, self.weight_decay) {
            (_, 0.0) => (1.0, 0.0),
            (true, wd) => (1.0 - self.lr * wd, 0.0),
            (false, wd) => (1.0, wd),
        };
        AdamCoefficients {
            decay,
            l2,
            one_minus_beta1: 1.0 - self.beta1,
            one_minus_beta2: 1.0 - self.beta2,
            inv_sqrt_bc2: 1.0 / bc2.sqrt(),
            step_size: self.lr / bc1,
            eps: self.eps,
        }
    }

    fn check(&self) -> Result<()> {
        finite("adam_update", "lr", self.lr)?;
        finite("adam_update", "weight_decay", self.weight_decay)?;
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::invalid(
                    "adam_update",
                    format!("{name} must lie in [0, 1), got {beta}"),
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(Error::invalid(
                "adam_update",
                format!("eps must be finite and ≥ 0, got {}", self.eps),
            ));
        }
        if self.step == 0 {
            return Err(Error::invalid(
                "adam_update",
                "the step number counts from 1 (bias correction divides by 1 − β^t)",
            ));
        }
        Ok(())
    }
}

/// One SGD step (`torch.optim.SGD`), per element:
///
/// ```text
/// g   = grad + wd·p
/// buf = g                                  (first step)
/// buf = momentum·buf + (1 − dampening)·g   (later steps)
/// g   = g + momentum·buf  (Nesterov)  or  buf
/// p   = p − lr·g
/// ```
/// Without momentum there is no buffer and `p = p − lr·g`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdUpdate {
    /// Learning rate.
    pub lr: f64,
    /// Momentum μ; 0 for none (then no state tensor).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// True on the step that creates the momentum buffer (it is then overwritten with `g`).
    pub first_step: bool,
}

/// The per-element constants of one [`SgdUpdate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdCoefficients {
    /// Learning rate.
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Momentum μ (0: no buffer).
    pub momentum: f64,
    /// Multiplies `g` into the buffer after the first step: `1 − dampening`.
    pub grad_scale: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// The buffer is written as `g` (first step).
    pub first_step: bool,
}

impl SgdUpdate {
    /// The constants every backend applies per element.
    pub fn coefficients(&self) -> SgdCoefficients {
        SgdCoefficients {
            lr: self.lr,
            weight_decay: self.weight_decay,
            momentum: self.momentum,
            grad_scale: 1.0 - self.dampening,
            nesterov: self.nesterov,
            first_step: self.first_step,
        }
    }

    /// True when the update keeps a momentum buffer.
    pub fn has_momentum(&self) -> bool {
        self.momentum != 0.0
    }

    fn check(&self) -> Result<()> {
        for (name, value) in [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
        ] {
            finite("sgd_update", name, value)?;
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::invalid(
                "sgd_update",
                "Nesterov momentum needs a momentum > 0 and zero dampening",
            ));
        }
        Ok(())
    }
}

/// Which update a [`crate::Kernel::Update`] (or [`crate::Kernel::UpdateMany`]) applies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// SGD; state `[momentum buffer]` when it has momentum, else none.
    Sgd(SgdUpdate),
    /// Adam or AdamW; state `[exp_avg, exp_avg_sq]`.
    Adam(AdamUpdate),
}

impl UpdateRule {
    /// The number of state tensors the rule reads and writes.
    pub fn state_count(&self) -> usize {
        match self {
            UpdateRule::Sgd(sgd) => usize::from(sgd.has_momentum()),
            UpdateRule::Adam(_) => 2,
        }
    }

    /// The kind, for capabilities.
    pub fn kind(&self) -> UpdateKind {
        match self {
            UpdateRule::Sgd(_) => UpdateKind::Sgd,
            UpdateRule::Adam(_) => UpdateKind::Adam,
        }
    }

    /// Check the hyperparameters (finite, betas in range, a step number from 1).
    pub fn check(&self) -> Result<()> {
        match self {
            UpdateRule::Sgd(sgd) => sgd.check(),
            UpdateRule::Adam(adam) => adam.check(),
        }
    }
}

/// The kinds of [`UpdateRule`], for [`crate::Op::Update`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpdateKind {
    /// [`SgdUpdate`].
    Sgd,
    /// [`AdamUpdate`].
    Adam,
}

impl UpdateKind {
    /// Every kind.
    pub const ALL: [UpdateKind; 2] = [UpdateKind::Sgd, UpdateKind::Adam];

    /// The op name.
    pub const fn name(self) -> &'static str {
        match self {
            UpdateKind::Sgd => "sgd_update",
            UpdateKind::Adam => "adam_update",
        }
    }

    /// The name of the multi-tensor op ([`crate::Kernel::UpdateMany`]).
    pub const fn many_name(self) -> &'static str {
        match self {
            UpdateKind::Sgd => "sgd_update_many",
            UpdateKind::Adam => "adam_update_many",
        }
    }
}

fn finite(op: &'static str, name: &str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("{name} must be finite, got {value}")))
    }
}
