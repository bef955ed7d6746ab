//! [`Sgd`]: stochastic gradient descent with momentum, Nesterov and weight decay.

use std::collections::HashMap;

use cartage::optim::{SgdSlot, StepReport, sgd_step_many};
use cartage::{Error, Result, SgdUpdate, Tensor, VarId};

use super::{
    Optimizer, OptimizerState, StateDiff, check_grad, check_lr, check_non_negative, export, follow, group_by, import,
    non_empty, same_store, saved_lr,
};
use crate::{ParamStore, StoreId};

/// SGD as PyTorch's `torch.optim.SGD`: `g += wd·p`; with momentum `buf = μ·buf + (1-dampening)·g`
/// (the first step takes `buf = g`) and `g = buf`, or `g += μ·buf` with Nesterov; `p -= lr·g`.
///
/// The public hyperparameters are checked by each [`Optimizer::step`] before anything changes
/// (as PyTorch's constructor checks them): momentum and weight decay are finite and ≥ 0,
/// Nesterov needs a momentum and zero dampening.
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
    /// Plain SGD at learning rate `lr` on `store`'s parameters. Refuses a store without
    /// parameters and a negative, NaN or infinite `lr`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{ParamStore, optim::Sgd};
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// assert!(Sgd::new(&store, 0.1).is_err()); // "optimizer got an empty parameter list"
    /// store.root().var("w", Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// assert!(Sgd::new(&store, -0.1).is_err()); // "Invalid learning rate"
    /// let _sgd = Sgd::new(&store, 0.1)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(store: &ParamStore, lr: f64) -> Result<Sgd> {
        non_empty("Sgd::new", store)?;
        check_lr("Sgd::new", lr)?;
        Ok(Sgd {
            store: store.id(),
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: HashMap::new(),
            last_step: StepReport::default(),
        })
    }

    /// The same optimizer with learning rate `lr` (checked now, as PyTorch's constructor
    /// checks it).
    pub fn lr(mut self, lr: f64) -> Result<Sgd> {
        self.lr = lr;
        self.check("Sgd::lr")?;
        Ok(self)
    }

    /// The same optimizer with momentum `momentum` (finite, ≥ 0; 0 for none).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{ParamStore, optim::Sgd};
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// store.root().var("w", Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// let sgd = Sgd::new(&store, 0.1)?.momentum(0.9)?.nesterov(true)?.weight_decay(5e-4)?;
    /// assert!(sgd.nesterov && sgd.momentum == 0.9);
    /// assert!(Sgd::new(&store, 0.1)?.nesterov(true).is_err()); // Nesterov needs a momentum
    /// # Ok(())
    /// # }
    /// ```
    pub fn momentum(mut self, momentum: f64) -> Result<Sgd> {
        self.momentum = momentum;
        self.check("Sgd::momentum")?;
        Ok(self)
    }

    /// The same optimizer with dampening `dampening` of the momentum.
    pub fn dampening(mut self, dampening: f64) -> Result<Sgd> {
        self.dampening = dampening;
        self.check("Sgd::dampening")?;
        Ok(self)
    }

    /// The same optimizer with L2 weight decay `weight_decay` (finite, ≥ 0).
    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Sgd> {
        self.weight_decay = weight_decay;
        self.check("Sgd::weight_decay")?;
        Ok(self)
    }

    /// The same optimizer with Nesterov momentum on or off (on needs a momentum and zero
    /// dampening).
    pub fn nesterov(mut self, nesterov: bool) -> Result<Sgd> {
        self.nesterov = nesterov;
        self.check("Sgd::nesterov")?;
        Ok(self)
    }

    /// Refuse hyperparameters PyTorch's `SGD` refuses.
    fn check(&self, op: &'static str) -> Result<()> {
        check_lr(op, self.lr)?;
        check_non_negative(op, "momentum", self.momentum)?;
        check_non_negative(op, "weight_decay", self.weight_decay)?;
        if !self.dampening.is_finite() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("Invalid dampening value: {}; it must be finite", self.dampening),
            });
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::InvalidArgument {
                op,
                reason: "Nesterov momentum requires a momentum and zero dampening".into(),
            });
        }
        Ok(())
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
        self.check("Sgd::step")?;
        let _plain = cartage::no_grad();
        let rule = SgdUpdate {
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
            first_step: false,
        };
        // (id, parameter, gradient, buffer, first step) of every parameter with a gradient. The
        // buffers stay in the map until every check passed (a refused step keeps them).
        let mut entries = Vec::new();
        for var in store.vars() {
            let Some(g) = var.grad() else { continue };
            let p = var.value();
            check_grad("Sgd::step", store, var.id(), &p, &g)?;
            let (buf, first_step) = match self.buffers.get(&var.id()).cloned() {
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

    fn check_state(&self, store: &ParamStore, state: &OptimizerState) -> Result<StateDiff> {
        same_store("Sgd::load_state", self.store, store)?;
        Ok(import(store, state, &["momentum"], &["lr"]).diff)
    }

    fn load_state_with(&mut self, store: &ParamStore, state: &OptimizerState, strict: bool) -> Result<StateDiff> {
        const OP: &str = "Sgd::load_state";
        same_store(OP, self.store, store)?;
        let imported = import(store, state, &["momentum"], &["lr"]);
        if strict && !imported.diff.is_empty() {
            return Err(imported.diff.into_error(OP));
        }
        let lr = saved_lr(OP, state)?;
        let mut buffers = HashMap::new();
        for (var, mut slots) in imported.per_var {
            if let Some(t) = slots[0].take() {
                buffers.insert(var.id(), follow(t, &var.value())?);
            }
        }
        self.buffers = buffers;
        if let Some(lr) = lr {
            self.lr = lr;
        }
        Ok(imported.diff)
    }
}
