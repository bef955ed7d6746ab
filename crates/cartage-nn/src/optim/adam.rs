//! [`Adam`] and [`AdamW`].

use std::collections::HashMap;

use cartage::optim::{AdamSlot, StepReport, adam_step_many};
use cartage::{AdamUpdate, Result, Tensor, VarId};

use super::{Optimizer, OptimizerState, export, follow, group_by, import, same_store};
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

    fn load_state(&mut self, op: &'static str, store: &ParamStore, state: &OptimizerState) -> Result<()> {
        same_store(op, self.store, store)?;
        let m = import(store, state, "m")?;
        let mut v: std::collections::HashMap<VarId, Tensor> = import(store, state, "v")?.into_iter().collect();
        self.moments = m
            .into_iter()
            .filter_map(|(id, m)| v.remove(&id).map(|v| (id, Moments { m, v })))
            .collect();
        self.step = state.scalar("step").unwrap_or(0.0) as u64;
        if let Some(lr) = state.scalar("lr") {
            self.lr = lr;
        }
        Ok(())
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
        let _plain = cartage::no_grad();
        self.step += 1;
        let rule = AdamUpdate {
            lr: self.lr,
            beta1: self.betas.0,
            beta2: self.betas.1,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled: self.decoupled,
            step: self.step,
        };
        let mut entries = Vec::new();
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let p = var.value();
            let moments = match self.moments.remove(&var.id()) {
                Some(s) => Moments {
                    m: follow(s.m, &p)?,
                    v: follow(s.v, &p)?,
                },
                None => Moments {
                    m: p.zeros_like()?,
                    v: p.zeros_like()?,
                },
            };
            entries.push((var.id(), p, g, moments));
        }
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
        }

        impl Optimizer for $name {
            fn step(&mut self, store: &ParamStore) -> Result<()> {
                self.core.step(concat!(stringify!($name), "::step"), store)
            }

            fn state(&self, store: &ParamStore) -> Result<OptimizerState> {
                self.core.state(store)
            }

            fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()> {
                self.core
                    .load_state(concat!(stringify!($name), "::load_state"), store, state)
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

/// Adam (`torch.optim.Adam`): betas (0.9, 0.999), eps 1e-8, L2 weight decay added to the
/// gradient.
pub struct Adam {
    core: Core,
}

impl Adam {
    /// Adam at learning rate `lr`, no weight decay.
    pub fn new(store: &ParamStore, lr: f64) -> Result<Adam> {
        Ok(Adam {
            core: Core::new(store, lr, 0.0, false),
        })
    }

    /// With betas, eps and L2 weight decay.
    pub fn with(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Adam {
        (self.core.betas, self.core.eps, self.core.weight_decay) = (betas, eps, weight_decay);
        self
    }
}

delegate_to_core!(Adam);

/// AdamW (`torch.optim.AdamW`): Adam with decoupled weight decay, 0.01 by default.
pub struct AdamW {
    core: Core,
}

impl AdamW {
    /// AdamW at learning rate `lr`, weight decay 0.01.
    pub fn new(store: &ParamStore, lr: f64) -> Result<AdamW> {
        Ok(AdamW {
            core: Core::new(store, lr, 0.01, true),
        })
    }

    /// With betas, eps and weight decay.
    pub fn with(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> AdamW {
        (self.core.betas, self.core.eps, self.core.weight_decay) = (betas, eps, weight_decay);
        self
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.core.step
    }
}

delegate_to_core!(AdamW);
