//! Optimizer steps in place: [`Tensor::adam_step_`] and [`Tensor::sgd_step_`] update a parameter
//! and its state from its gradient in one fused kernel (`Kernel::Update`) where the backend has
//! it and the operands are contiguous, and with the same formulas composed from other ops
//! elsewhere. The parameter's storage stays the same, so a module holding it sees the new values.

use cartage_core::{AdamUpdate, Error, Kernel, Op, Result, SgdUpdate, TensorArg, UpdateKind, UpdateRule};

use crate::autograd::graph;
use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// One Adam or AdamW step ([`AdamUpdate`] has the formulas, PyTorch's), in place on this
    /// parameter and its moments `exp_avg` and `exp_avg_sq`, from `grad`. Every operand has the
    /// parameter's shape, float dtype and device; none may take part in a recorded graph (run
    /// optimizer steps under [`crate::no_grad`] if a variable's value is passed).
    ///
    /// ```
    /// use cartage::{AdamUpdate, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let p = Tensor::new([1.0f32, -1.0], &cpu)?;
    /// let g = Tensor::new([0.5f32, -0.5], &cpu)?;
    /// let (m, v) = (p.zeros_like()?, p.zeros_like()?);
    /// let rule = AdamUpdate { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0,
    ///                         decoupled: true, step: 1 };
    /// p.adam_step_(&g, &m, &v, rule)?;
    /// // The first step moves each weight by lr against the gradient's sign.
    /// let moved = p.to_vec::<f32>()?;
    /// assert!((moved[0] - 0.9).abs() < 1e-6 && (moved[1] + 0.9).abs() < 1e-6);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn adam_step_(&self, grad: &Tensor, exp_avg: &Tensor, exp_avg_sq: &Tensor, rule: AdamUpdate) -> Result<()> {
        let update = UpdateRule::Adam(rule);
        self.check_update(&update, grad, &[exp_avg, exp_avg_sq])?;
        let site = caller();
        self.adam_step_checked(grad, exp_avg, exp_avg_sq, rule)?;
        for t in [self, exp_avg, exp_avg_sq] {
            t.storage.bump_version("adam_step_", site);
        }
        Ok(())
    }

    /// [`Tensor::adam_step_`] after its checks; `true` when it ran as one fused kernel.
    pub(crate) fn adam_step_checked(
        &self,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        rule: AdamUpdate,
    ) -> Result<bool> {
        let update = UpdateRule::Adam(rule);
        if self.update_fused(&update, grad, [Some(exp_avg), Some(exp_avg_sq)])? {
            return Ok(true);
        }
        let c = rule.coefficients();
        let p = self.contiguous()?;
        let mut g = grad.to_dtype(self.dtype)?;
        if c.l2 != 0.0 {
            g = g.add(&p.mul_scalar(c.l2)?)?;
        }
        let p = if c.decay != 1.0 { p.mul_scalar(c.decay)? } else { p };
        let m = exp_avg.lerp(&g, c.one_minus_beta1)?;
        let v = exp_avg_sq.lerp(&g.square()?, c.one_minus_beta2)?;
        let denom = v.sqrt()?.mul_scalar(c.inv_sqrt_bc2)?.add_scalar(c.eps)?;
        let stepped = p.sub(&m.div(&denom)?.mul_scalar(c.step_size)?)?;
        exp_avg.copy_from(&m)?;
        exp_avg_sq.copy_from(&v)?;
        self.copy_from(&stepped)?;
        Ok(false)
    }

    /// One SGD step ([`SgdUpdate`] has the formulas, PyTorch's), in place on this parameter and,
    /// with momentum, on `momentum_buffer` (overwritten with the gradient on `first_step`).
    /// Operands as for [`Tensor::adam_step_`].
    ///
    /// ```
    /// use cartage::{Device, SgdUpdate, Tensor};
    /// let cpu = Device::cpu();
    /// let p = Tensor::new([1.0f32, 2.0], &cpu)?;
    /// let g = Tensor::new([1.0f32, -1.0], &cpu)?;
    /// let rule = SgdUpdate { lr: 0.5, momentum: 0.0, dampening: 0.0, weight_decay: 0.0,
    ///                        nesterov: false, first_step: false };
    /// p.sgd_step_(&g, None, rule)?;
    /// assert_eq!(p.to_vec::<f32>()?, vec![0.5, 2.5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn sgd_step_(&self, grad: &Tensor, momentum_buffer: Option<&Tensor>, rule: SgdUpdate) -> Result<()> {
        self.check_sgd(grad, momentum_buffer, rule)?;
        let site = caller();
        self.sgd_step_checked(grad, momentum_buffer, rule)?;
        for t in std::iter::once(self).chain(momentum_buffer) {
            t.storage.bump_version("sgd_step_", site);
        }
        Ok(())
    }

    /// The checks of [`Tensor::sgd_step_`].
    pub(crate) fn check_sgd(&self, grad: &Tensor, momentum_buffer: Option<&Tensor>, rule: SgdUpdate) -> Result<()> {
        let states: Vec<&Tensor> = momentum_buffer.into_iter().collect();
        if rule.has_momentum() != momentum_buffer.is_some() {
            return Err(Error::invalid(
                "sgd_update",
                "SGD with momentum needs a momentum buffer, and SGD without momentum takes none",
            ));
        }
        self.check_update(&UpdateRule::Sgd(rule), grad, &states)
    }

    /// [`Tensor::sgd_step_`] after its checks; `true` when it ran as one fused kernel.
    pub(crate) fn sgd_step_checked(
        &self,
        grad: &Tensor,
        momentum_buffer: Option<&Tensor>,
        rule: SgdUpdate,
    ) -> Result<bool> {
        let update = UpdateRule::Sgd(rule);
        if self.update_fused(&update, grad, [momentum_buffer, None])? {
            return Ok(true);
        }
        let c = rule.coefficients();
        let p = self.contiguous()?;
        let mut g = grad.to_dtype(self.dtype)?;
        if c.weight_decay != 0.0 {
            g = g.add(&p.mul_scalar(c.weight_decay)?)?;
        }
        if let Some(buf) = momentum_buffer {
            let next = if c.first_step {
                g.clone()
            } else {
                buf.mul_scalar(c.momentum)?.add(&g.mul_scalar(c.grad_scale)?)?
            };
            buf.copy_from(&next)?;
            g = if c.nesterov {
                g.add(&buf.mul_scalar(c.momentum)?)?
            } else {
                buf.clone()
            };
        }
        self.copy_from(&p.sub(&g.mul_scalar(c.lr)?)?)?;
        Ok(false)
    }

    /// The checks every update makes: hyperparameters, devices, dtypes, shapes, no graph.
    pub(crate) fn check_update(&self, rule: &UpdateRule, grad: &Tensor, states: &[&Tensor]) -> Result<()> {
        let name = rule.kind().name();
        rule.check()?;
        check::float(name, self.dtype)?;
        check::same_device(name, self, grad)?;
        for t in std::iter::once(grad).chain(states.iter().copied()) {
            if t.shape() != self.shape() {
                return Err(Error::ShapeMismatch {
                    op: name,
                    lhs: self.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: "the gradient and the optimizer state must have the parameter's shape".into(),
                });
            }
        }
        for state in states {
            check::same_device_and_dtype(name, self, state)?;
        }
        let all: Vec<&Tensor> = std::iter::once(self)
            .chain(std::iter::once(grad))
            .chain(states.iter().copied())
            .collect();
        if graph::tracking(&all) {
            return Err(Error::Autograd {
                op: name,
                reason: "an optimizer step writes in place and cannot be recorded, but a variable (or a value \
                         computed from one) takes part in it; run the step under `cartage::no_grad()`"
                    .into(),
            });
        }
        Ok(())
    }

    /// Launch the fused update when the backend has it for this dtype and every operand is
    /// contiguous and apart; `false` otherwise (the caller composes it).
    fn update_fused(&self, rule: &UpdateRule, grad: &Tensor, state: [Option<&Tensor>; 2]) -> Result<bool> {
        let kind: UpdateKind = rule.kind();
        if !self.backend().capabilities().supports(Op::Update(kind), self.dtype) {
            return Ok(false);
        }
        let Some(grad) = self.fusable_grad(grad, state)? else {
            return Ok(false);
        };
        let states: Vec<&Tensor> = state.iter().flatten().copied().collect();
        let arg = |t: Option<&Tensor>| t.map(Tensor::as_arg);
        let args: [Option<TensorArg>; 2] = [arg(state[0]), arg(state[1])];
        let kernel = Kernel::Update {
            rule: *rule,
            grad: grad.as_arg(),
            state: args,
            param: self.as_arg(),
        };
        let inputs: Vec<&Tensor> = std::iter::once(&grad).chain(states.iter().copied()).collect();
        self.launch(&kernel, &inputs, self.numel())?;
        Ok(true)
    }

    /// The gradient in the parameter's dtype when a fused kernel can update this parameter:
    /// every operand contiguous and none sharing storage with another (a gradient that is the
    /// parameter, one buffer passed as both moments would make the in-place kernel read what it
    /// wrote); `None` when the update must be composed.
    pub(crate) fn fusable_grad(&self, grad: &Tensor, state: [Option<&Tensor>; 2]) -> Result<Option<Tensor>> {
        let grad = grad.to_dtype(self.dtype)?;
        let states: Vec<&Tensor> = state.iter().flatten().copied().collect();
        let given: Vec<&Tensor> = [self, &grad].into_iter().chain(states.iter().copied()).collect();
        if given.iter().any(|t| !t.is_contiguous()) {
            return Ok(None);
        }
        for (i, a) in given.iter().enumerate() {
            if given[i + 1..].iter().any(|b| a.shares_storage(b)) {
                return Ok(None);
            }
        }
        Ok(Some(grad))
    }
}

impl Tensor {
    /// Refuse a tensor of another device or dtype than `self` in one multi-tensor step.
    pub(crate) fn check_same_group(&self, op: &'static str, other: &Tensor) -> Result<()> {
        check::same_device_and_dtype(op, self, other)
    }

    /// The bytes of the storage this view can touch, `[start, end)` (empty for no element), with
    /// the storage's address as its identity: for overlap checks between parameters.
    pub(crate) fn storage_span(&self) -> (usize, usize, usize) {
        let size = self.dtype.size_in_bytes();
        let id = std::sync::Arc::as_ptr(&self.storage) as usize;
        if self.layout.numel() == 0 {
            return (id, 0, 0);
        }
        (id, self.layout.offset() * size, self.layout.extent() * size)
    }

    /// Count an in-place write by `op` at `site` on this tensor's storage (for the callers of
    /// multi-tensor steps, which write through kernels of their own).
    pub(crate) fn bump_version(&self, op: &'static str, site: cartage_core::Site) {
        self.storage.bump_version(op, site);
    }

    /// Launch `kernel` borrowing the storages of `tensors` (which hold every operand).
    pub(crate) fn run_on(kernel: &Kernel, tensors: &[&Tensor]) -> Result<()> {
        crate::graph::hold(tensors.iter().copied());
        let buffers: Vec<&cartage_core::DeviceBuffer> = tensors.iter().map(|t| t.storage.device_buffer()).collect();
        kernel.run(&buffers)
    }
}
