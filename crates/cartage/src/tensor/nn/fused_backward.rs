//! Launchers of the fused backward kernels (`SoftmaxBackward`, `GeluBackward`, `NormBackward`,
//! `CrossEntropyBackward`) for the autograd formulas. Each returns `None` where the backend lists
//! no such kernel for the dtype, and the formula then composes the same gradient from other ops.

use cartage_core::{Kernel, NormBackwardArgs, NormKind, Op, Result};

use crate::tensor::{Tensor, caller};

/// The gradients of one fused norm backward ([`Tensor::norm_backward_fused`]).
pub(crate) struct NormGrads {
    /// The input's, shaped like the input.
    pub input: Tensor,
    /// The weight's `[D]`, when asked for.
    pub weight: Option<Tensor>,
    /// The bias's `[D]`, when asked for.
    pub bias: Option<Tensor>,
}

/// True when the tensor's backend runs `op` fused for the tensor's dtype.
fn fused(t: &Tensor, op: Op) -> bool {
    t.backend().capabilities().supports(op, t.dtype())
}

/// `g` in `like`'s dtype (gradients normally arrive in it already).
fn in_dtype_of(g: &Tensor, like: &Tensor) -> Result<Tensor> {
    g.to_dtype(like.dtype())
}

impl Tensor {
    /// The input gradient of softmax (`log` false) or log-softmax along `dim`, from the forward's
    /// output `self` and the incoming `grad`, in one kernel.
    pub(crate) fn softmax_backward_fused(&self, grad: &Tensor, dim: usize, log: bool) -> Result<Option<Tensor>> {
        let op = if log {
            Op::LogSoftmaxBackward
        } else {
            Op::SoftmaxBackward
        };
        if !fused(self, op) || grad.shape() != self.shape() {
            return Ok(None);
        }
        let grad = in_dtype_of(grad, self)?;
        let out = self.alloc_like(self.shape(), self.dtype, caller())?;
        let kernel = Kernel::SoftmaxBackward {
            output: self.as_arg(),
            grad: grad.as_arg(),
            dim,
            log,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self, &grad], out.numel())?;
        Ok(Some(out))
    }

    /// The input gradient of the exact GELU, from the forward's input `self` and the incoming
    /// `grad`, in one element-wise kernel.
    pub(crate) fn gelu_backward_fused(&self, grad: &Tensor) -> Result<Option<Tensor>> {
        if !fused(self, Op::GeluBackward) || grad.shape() != self.shape() {
            return Ok(None);
        }
        let grad = in_dtype_of(grad, self)?;
        let out = self.alloc_like(self.shape(), self.dtype, caller())?;
        let kernel = Kernel::GeluBackward {
            input: self.as_arg(),
            grad: grad.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self, &grad], out.numel())?;
        Ok(Some(out))
    }

    /// The gradients of layer or RMS norm over the last dim, from the forward's input `self`,
    /// its weight and the incoming `grad`, in one kernel: the input's always, the weight's
    /// (`Σ g·x̂` over the rows) when `want_weight`, the bias's (`Σ g`) when `want_bias`.
    pub(crate) fn norm_backward_fused(
        &self,
        kind: NormKind,
        weight: Option<&Tensor>,
        grad: &Tensor,
        eps: f64,
        want_weight: bool,
        want_bias: bool,
    ) -> Result<Option<NormGrads>> {
        if !fused(self, Op::NormBackward(kind)) || grad.shape() != self.shape() {
            return Ok(None);
        }
        let Some(&last) = self.shape().last() else {
            return Ok(None);
        };
        let grad = in_dtype_of(grad, self)?;
        let input = self.alloc_like(self.shape(), self.dtype, caller())?;
        let column = |wanted: bool| {
            wanted
                .then(|| self.alloc_like(&[last], self.dtype, caller()))
                .transpose()
        };
        let (grad_weight, grad_bias) = (column(want_weight)?, column(want_bias)?);
        let kernel = Kernel::NormBackward(Box::new(NormBackwardArgs {
            kind,
            input: self.as_arg(),
            weight: weight.map(Tensor::as_arg),
            grad: grad.as_arg(),
            eps,
            grad_input: input.as_arg(),
            grad_weight: grad_weight.as_ref().map(Tensor::as_arg),
            grad_bias: grad_bias.as_ref().map(Tensor::as_arg),
        }));
        let operands: Vec<&Tensor> = [self, &grad, &input]
            .into_iter()
            .chain(weight)
            .chain(grad_weight.as_ref())
            .chain(grad_bias.as_ref())
            .collect();
        crate::graph::hold(operands.iter().copied());
        let buffers: Vec<_> = operands.iter().map(|t| t.storage.device_buffer()).collect();
        kernel.run(&buffers)?;
        Ok(Some(NormGrads {
            input,
            weight: grad_weight,
            bias: grad_bias,
        }))
    }

    /// The logits gradient of the per-row cross-entropy, from the forward's logits `self`
    /// `[N, C]`, its `target` `[N]` and the incoming per-row `grad` `[N]`, in one kernel.
    pub(crate) fn cross_entropy_backward_fused(
        &self,
        target: &Tensor,
        grad: &Tensor,
        ignore_index: i64,
        label_smoothing: f64,
    ) -> Result<Option<Tensor>> {
        if !fused(self, Op::CrossEntropyBackward) || grad.shape() != [self.shape()[0]] {
            return Ok(None);
        }
        let grad = in_dtype_of(grad, self)?;
        let out = self.alloc_like(self.shape(), self.dtype, caller())?;
        let kernel = Kernel::CrossEntropyBackward {
            logits: self.as_arg(),
            target: target.as_arg(),
            grad: grad.as_arg(),
            ignore_index,
            label_smoothing,
            out: out.as_arg(),
        };
        out.launch_indexed(&kernel, &[self, target, &grad], target, out.numel())?;
        Ok(Some(out))
    }
}
