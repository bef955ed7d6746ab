//! [`Sgd`]: stochastic gradient descent with momentum, Nesterov and weight decay.

use std::collections::HashMap;

use cartage::{Result, SgdUpdate, Tensor, VarId};

use super::{Optimizer, OptimizerState, export, follow, import, same_store};
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
        }
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
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let p = var.value();
            if !rule.has_momentum() {
                p.sgd_step_(&g, None, rule)?;
                continue;
            }
            let (buf, first_step) = match self.buffers.remove(&var.id()) {
                Some(b) => (follow(b, &p)?, false),
                None => (p.zeros_like()?, true),
            };
            p.sgd_step_(&g, Some(&buf), SgdUpdate { first_step, ..rule })?;
            self.buffers.insert(var.id(), buf);
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
