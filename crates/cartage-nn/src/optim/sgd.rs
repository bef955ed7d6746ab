//! [`Sgd`]: stochastic gradient descent with momentum, Nesterov and weight decay.

use std::collections::HashMap;

use cartage::{Result, Tensor, VarId};

use super::{Optimizer, OptimizerState, export, follow, import, same_store, write};
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
        for var in store.vars() {
            let Some(mut g) = var.grad() else { continue };
            let p = var.value();
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul_scalar(self.weight_decay)?)?;
            }
            if self.momentum != 0.0 {
                let buf = match self.buffers.remove(&var.id()) {
                    None => g.clone(),
                    Some(b) => follow(b, &p)?
                        .mul_scalar(self.momentum)?
                        .add(&g.mul_scalar(1.0 - self.dampening)?)?,
                };
                g = if self.nesterov {
                    g.add(&buf.mul_scalar(self.momentum)?)?
                } else {
                    buf.clone()
                };
                self.buffers.insert(var.id(), buf);
            }
            write(&var, &p.sub(&g.mul_scalar(self.lr)?)?)?;
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
