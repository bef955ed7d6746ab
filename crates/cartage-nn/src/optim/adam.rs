//! [`Adam`] and [`AdamW`].

use std::collections::HashMap;

use cartage::optim::{AdamSlot, StepReport, adam_step_many};
use cartage::{AdamUpdate, Error, Result, Tensor, VarId};

use super::{
    Optimizer, OptimizerState, StateDiff, check_grad, check_lr, check_non_negative, export, follow, group_by, import,
    non_empty, same_store, saved_lr,
};
use crate::{ParamStore, StoreId};

/// The moments of one parameter.
struct Moments {
    m: Tensor,
    v: Tensor,
}

/// The shared update: Adam's L2 decay adds `wd·p` to the gradient; AdamW's decoupled decay
/// multiplies `p` by `1 - lr·wd` first.
struct Core {
    store: StoreId,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    step: u64,
    moments: HashMap<VarId, Moments>,
    last_step: StepReport,
}

impl Core {
    fn state(&self, store: &ParamStore) -> Result<OptimizerState> {
        let slots = self
            .moments
            .iter()
            .flat_map(|(id, s)| [(*id, "m", &s.m), (*id, "v", &s.v)]);
        Ok(OptimizerState {
            tensors: export(store, slots)?,
            scalars: vec![("step".into(), self.step as f64), ("lr".into(), self.lr)],
        })
    }

    fn check_state(&self, op: &'static str, store: &ParamStore, state: &OptimizerState) -> Result<StateDiff> {
        same_store(op, self.store, store)?;
        Ok(Self::diff(store, state).0)
    }

    /// What loading `state` would skip, with the import. A saved moment needs the saved step
    /// (bias correction restarts without it).
    fn diff(store: &ParamStore, state: &OptimizerState) -> (StateDiff, super::Imported) {
        let imported = import(store, state, &["m", "v"], &["step", "lr"]);
        let mut diff = imported.diff.clone();
        let has_moments = imported.per_var.iter().any(|(_, s)| s.iter().any(Option::is_some));
        if has_moments && state.scalar("step").is_none() {
            diff.missing.push("step".into());
        }
        (diff, imported)
    }

    fn load_state_with(
        &mut self,
        op: &'static str,
        store: &ParamStore,
        state: &OptimizerState,
        strict: bool,
    ) -> Result<StateDiff> {
        same_store(op, self.store, store)?;
        let (diff, imported) = Self::diff(store, state);
        if strict && !diff.is_empty() {
            return Err(diff.into_error(op));
        }
        let step = match state.scalar("step") {
            None => None,
            // Exactly a whole number in u64's range (2^64 itself is the first f64 past it).
            Some(s) if s >= 0.0 && s.fract() == 0.0 && s < 18_446_744_073_709_551_616.0 => Some(s as u64),
            Some(s) => {
                return Err(Error::InvalidArgument {
                    op,
                    reason: format!(
                        "the saved step is {s}; a step count is a whole number >= 0 (a corrupt or \
                         hand-edited checkpoint?): nothing was loaded"
                    ),
                });
            }
        };
        let lr = saved_lr(op, state)?;
        let mut moments = HashMap::new();
        for (var, mut slots) in imported.per_var {
            if let (Some(m), Some(v)) = (slots[0].take(), slots[1].take()) {
                let p = var.value();
                moments.insert(
                    var.id(),
                    Moments {
                        m: follow(m, &p)?,
                        v: follow(v, &p)?,
                    },
                );
            }
        }
        self.moments = moments;
        self.step = step.unwrap_or(0);
        if let Some(lr) = lr {
            self.lr = lr;
        }
        Ok(diff)
    }

    /// Refuse hyperparameters PyTorch's `Adam`/`AdamW` refuse.
    fn check(op: &'static str, lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<()> {
        check_lr(op, lr)?;
        check_non_negative(op, "epsilon", eps)?;
        for (i, beta) in [betas.0, betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::InvalidArgument {
                    op,
                    reason: format!("Invalid beta parameter at index {i}: {beta}; betas lie in [0, 1)"),
                });
            }
        }
        check_non_negative(op, "weight_decay", weight_decay)
    }

    /// [`Core::check`] of the current hyperparameters.
    fn check_all(&self, op: &'static str) -> Result<()> {
        Self::check(op, self.lr, self.betas, self.eps, self.weight_decay)
    }

    fn new(store: &ParamStore, lr: f64, weight_decay: f64, decoupled: bool) -> Core {
        Core {
            store: store.id(),
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay,
            decoupled,
            step: 0,
            moments: HashMap::new(),
            last_step: StepReport::default(),
        }
    }

    /// One multi-tensor update per group of parameters sharing a device and a dtype
    /// (`cartage::optim::adam_step_many`): the moments and the parameters are written in place,
    /// so the step allocates nothing once the moments exist.
    fn step(&mut self, op: &'static str, store: &ParamStore) -> Result<()> {
        same_store(op, self.store, store)?;
        Self::check(op, self.lr, self.betas, self.eps, self.weight_decay)?;
        let _plain = cartage::no_grad();
        let step = self.step.checked_add(1).ok_or_else(|| Error::InvalidState {
            op,
            reason: format!(
                "the step counter is at {} and cannot count another step; was a corrupt checkpoint \
                 loaded? Build a fresh optimizer",
                self.step
            ),
        })?;
        let rule = AdamUpdate {
            lr: self.lr,
            beta1: self.betas.0,
            beta2: self.betas.1,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled: self.decoupled,
            step,
        };
        // The moments stay in the map until every check passed (a refused step keeps them).
        let mut entries = Vec::new();
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let p = var.value();
            check_grad(op, store, var.id(), &p, &g)?;
            let moments = match self.moments.get(&var.id()) {
                Some(s) => Moments {
                    m: follow(s.m.clone(), &p)?,
                    v: follow(s.v.clone(), &p)?,
                },
                None => Moments {
                    m: p.zeros_like()?,
                    v: p.zeros_like()?,
                },
            };
            entries.push((var.id(), p, g, moments));
        }
        self.step = step;
        self.last_step = StepReport::default();
        for members in group_by(&entries, |(_, p, _, _)| (p.device(), p.dtype())).values() {
            let slots: Vec<AdamSlot<'_>> = members
                .iter()
                .map(|&i| {
                    let (_, p, g, moments) = &entries[i];
                    AdamSlot {
                        param: p,
                        grad: g,
                        exp_avg: &moments.m,
                        exp_avg_sq: &moments.v,
                    }
                })
                .collect();
            self.last_step += adam_step_many(rule, &slots)?;
        }
        for (id, _, _, moments) in entries {
            self.moments.insert(id, moments);
        }
        Ok(())
    }
}

/// `Optimizer` for a type whose update is its `core`: Adam and AdamW differ only in how
/// `Core` is configured.
macro_rules! delegate_to_core {
    ($name:ident) => {
        impl $name {
            /// How the last [`Optimizer::step`] ran: one multi-tensor kernel per group of
            /// parameters sharing a device and a dtype, where the device has one.
            pub fn last_step(&self) -> StepReport {
                self.core.last_step
            }

            /// The same optimizer with learning rate `lr` (checked now, as PyTorch's
            /// constructor checks it).
            pub fn lr(mut self, lr: f64) -> Result<Self> {
                self.core.lr = lr;
                self.core.check_all(concat!(stringify!($name), "::lr"))?;
                Ok(self)
            }

            /// The same optimizer with `betas` (β₁, β₂), each in `[0, 1)`.
            pub fn betas(mut self, betas: (f64, f64)) -> Result<Self> {
                self.core.betas = betas;
                self.core.check_all(concat!(stringify!($name), "::betas"))?;
                Ok(self)
            }

            /// The same optimizer with `eps` (finite, ≥ 0) added to the denominator.
            pub fn eps(mut self, eps: f64) -> Result<Self> {
                self.core.eps = eps;
                self.core.check_all(concat!(stringify!($name), "::eps"))?;
                Ok(self)
            }

            /// The same optimizer with weight decay `weight_decay` (finite, ≥ 0): added to the
            /// gradient for `Adam` (L2), applied to the parameter for `AdamW` (decoupled).
            pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
                self.core.weight_decay = weight_decay;
                self.core
                    .check_all(concat!(stringify!($name), "::weight_decay"))?;
                Ok(self)
            }
        }

        impl Optimizer for $name {
            fn step(&mut self, store: &ParamStore) -> Result<()> {
                self.core.step(concat!(stringify!($name), "::step"), store)
            }

            fn state(&self, store: &ParamStore) -> Result<OptimizerState> {
                self.core.state(store)
            }

            fn check_state(&self, store: &ParamStore, state: &OptimizerState) -> Result<StateDiff> {
                self.core
                    .check_state(concat!(stringify!($name), "::load_state"), store, state)
            }

            fn load_state_with(
                &mut self,
                store: &ParamStore,
                state: &OptimizerState,
                strict: bool,
            ) -> Result<StateDiff> {
                self.core
                    .load_state_with(concat!(stringify!($name), "::load_state"), store, state, strict)
            }

            fn learning_rate(&self) -> f64 {
                self.core.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.core.lr = lr;
            }
        }
    };
}

/// Adam (`torch.optim.Adam`): betas (0.9, 0.999), eps 1e-8, L2 weight decay (0 by default)
/// added to the gradient. Built like every optimizer: `new(&store, lr)` then setters.
///
/// | | `Adam` | `AdamW` |
/// |---|---|---|
/// | weight decay | L2: `g += wd·p` before the moments | decoupled: `p -= lr·wd·p` |
/// | default `weight_decay` | 0 | 0.01 |
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::{ParamStore, optim::{Adam, Optimizer}};
/// # fn main() -> cartage::Result<()> {
/// let store = ParamStore::new(&Device::cpu());
/// store.root().var("w", Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
/// let opt = Adam::new(&store, 1e-3)?.betas((0.9, 0.95))?.weight_decay(1e-4)?;
/// assert_eq!(opt.learning_rate(), 1e-3);
/// assert!(Adam::new(&store, 1e-3)?.eps(-1.0).is_err());
/// # Ok(())
/// # }
/// ```
pub struct Adam {
    core: Core,
}

impl Adam {
    /// Adam at learning rate `lr`, no weight decay. Refuses a store without parameters and a
    /// negative, NaN or infinite `lr`.
    pub fn new(store: &ParamStore, lr: f64) -> Result<Adam> {
        non_empty("Adam::new", store)?;
        check_lr("Adam::new", lr)?;
        Ok(Adam {
            core: Core::new(store, lr, 0.0, false),
        })
    }

    /// With betas, eps and L2 weight decay. Refuses betas outside `[0, 1)` and a negative or
    /// non-finite eps or weight decay, as `torch.optim.Adam` does.
    pub fn with(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<Adam> {
        Core::check("Adam::with", self.core.lr, betas, eps, weight_decay)?;
        (self.core.betas, self.core.eps, self.core.weight_decay) = (betas, eps, weight_decay);
        Ok(self)
    }
}

delegate_to_core!(Adam);

/// AdamW (`torch.optim.AdamW`): Adam with decoupled weight decay, 0.01 by default (see
/// [`Adam`] for the two side by side).
pub struct AdamW {
    core: Core,
}

impl AdamW {
    /// AdamW at learning rate `lr`, weight decay 0.01. Refuses a store without parameters and
    /// a negative, NaN or infinite `lr`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{ParamStore, optim::AdamW};
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// store.root().var("w", Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// assert!(AdamW::new(&store, f64::NAN).is_err());
    /// assert!(AdamW::new(&store, 1e-3)?.with((0.9, 1.0), 1e-8, 0.01).is_err()); // beta2 = 1
    /// let _opt = AdamW::new(&store, 1e-3)?.with((0.9, 0.95), 1e-8, 0.1)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(store: &ParamStore, lr: f64) -> Result<AdamW> {
        non_empty("AdamW::new", store)?;
        check_lr("AdamW::new", lr)?;
        Ok(AdamW {
            core: Core::new(store, lr, 0.01, true),
        })
    }

    /// With betas, eps and weight decay. Refuses betas outside `[0, 1)` and a negative or
    /// non-finite eps or weight decay, as `torch.optim.AdamW` does.
    pub fn with(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<AdamW> {
        Core::check("AdamW::with", self.core.lr, betas, eps, weight_decay)?;
        (self.core.betas, self.core.eps, self.core.weight_decay) = (betas, eps, weight_decay);
        Ok(self)
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.core.step
    }
}

delegate_to_core!(AdamW);
