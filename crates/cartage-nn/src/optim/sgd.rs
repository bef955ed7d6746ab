//! [`Sgd`]: stochastic gradient descent with momentum, Nesterov and weight decay.

use std::collections::HashMap;

use cartage::optim::{SgdSlot, StepReport, sgd_step_many};
use cartage::{Result, SgdUpdate, Tensor, VarId};

use super::{Optimizer, OptimizerState, export, follow, group_by, import, same_store};
use crate::{ParamStore, StoreId};

/// SGD as PyTorch's `torch.optim.SGD`: `g += wd·p`; with momentum `buf = μ·buf + (1-dampening)·g`
/// (the first step takes `buf = g`) and `g = buf`, or `g += μ·buf` with Nesterov; `p -= lr·g`.
pub struct Sgd {
    store: StoreId,
    lr: f64,
    /// Momentum μ (0 for none).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    buffers: HashMap<VarId, Tensor>,
    last_step: StepReport,
}

impl Sgd {
    /// Plain SGD at learning rate `lr` on `store`'s parameters.
    pub fn new(store: &ParamStore, lr: f64) -> Sgd {
        Sgd {
            store: store.id(),
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: HashMap::new(),
            last_step: StepReport::default(),
        }
    }

    /// How the last [`Optimizer::step`] ran: one multi-tensor kernel per group of parameters
    /// sharing a device and a dtype (and, with momentum, whether their buffer is new) where the
    /// device has one.
    pub fn last_step(&self) -> StepReport {
        self.last_step
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, store: &ParamStore) -> Result<()> {
        same_store("Sgd::step", self.store, store)?;
        let _plain = cartage::no_grad();
        let rule = SgdUpdate {
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
            first_step: false,
        };
        // (id, parameter, gradient, buffer, first step) of every parameter with a gradient.
        let mut entries = Vec::new();
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let p = var.value();
            let (buf, first_step) = match self.buffers.remove(&var.id()) {
                Some(b) if rule.has_momentum() => (Some(follow(b, &p)?), false),
                _ if rule.has_momentum() => (Some(p.zeros_like()?), true),
                _ => (None, false),
            };
            entries.push((var.id(), p, g, buf, first_step));
        }
        self.last_step = StepReport::default();
        // A new buffer is written as the gradient: those parameters step apart from the others.
        let groups = group_by(&entries, |(_, p, _, _, first)| (p.device(), p.dtype(), *first));
        for (&(_, _, first_step), members) in &groups {
            let slots: Vec<SgdSlot<'_>> = members
                .iter()
                .map(|&i| {
                    let (_, p, g, buf, _) = &entries[i];
                    SgdSlot {
                        param: p,
                        grad: g,
                        momentum_buffer: buf.as_ref(),
                    }
                })
                .collect();
            self.last_step += sgd_step_many(SgdUpdate { first_step, ..rule }, &slots)?;
        }
        for (id, _, _, buf, _) in entries {
            if let Some(buf) = buf {
                self.buffers.insert(id, buf);
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self, store: &ParamStore) -> Result<OptimizerState> {
        Ok(OptimizerState {
            tensors: export(store, self.buffers.iter().map(|(id, t)| (*id, "momentum", t)))?,
            scalars: vec![("lr".into(), self.lr)],
        })
    }

    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()> {
        same_store("Sgd::load_state", self.store, store)?;
        self.buffers = import(store, state, "momentum")?.into_iter().collect();
        if let Some(lr) = state.scalar("lr") {
            self.lr = lr;
        }
        Ok(())
    }
}
