//! [`Linear`]: `y = x·Wᵀ + b`.

use cartage::{DType, Epilogue, Generator, Result, Tensor, Var};

use super::{check_last, uniform};
use crate::{Module, Scope};

/// A fully connected layer: weight `[out, in]`, optional bias `[out]`, both drawn uniformly
/// from `±1/√in` (PyTorch's `nn.Linear`). Takes `[.., in]`, gives `[.., out]`.
pub struct Linear {
    weight: Var,
    bias: Option<Var>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// A layer whose parameters are `scope.weight` and `scope.bias`, in f32.
    pub fn new(
        scope: &Scope,
        in_features: usize,
        out_features: usize,
        bias: bool,
        rng: &mut Generator,
    ) -> Result<Linear> {
        let device = scope.device();
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = scope.var(
            "weight",
            uniform(&[out_features, in_features], bound, DType::F32, rng, &device)?,
        )?;
        let bias = if bias {
            Some(scope.var("bias", uniform(&[out_features], bound, DType::F32, rng, &device)?)?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            in_features,
            out_features,
        })
    }

    /// The weight `[out, in]`.
    pub fn weight(&self) -> &Var {
        &self.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Var> {
        self.bias.as_ref()
    }

    /// (in, out) features.
    pub fn features(&self) -> (usize, usize) {
        (self.in_features, self.out_features)
    }
}

impl Linear {
    /// `activation(x·Wᵀ + b)` in one fused call where the backend has it
    /// ([`Tensor::linear`]).
    pub fn forward_with(&self, x: &Tensor, activation: Epilogue) -> Result<Tensor> {
        check_last("Linear", x, 1, self.in_features)?;
        let b = self.bias.as_ref().map(Var::tensor);
        x.linear(&self.weight.tensor(), b.as_ref(), activation)
    }
}

impl Linear {
    /// The weight and bias, after checking that `x`'s last dim is the input features.
    pub(crate) fn parameters_for(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        check_last("Linear", x, 1, self.in_features)?;
        Ok((self.weight.tensor(), self.bias.as_ref().map(Var::tensor)))
    }

    /// `activation(x)·Wᵀ + b`, recorded as one node that keeps `x` and recomputes the
    /// activation in backward ([`Tensor::activation_linear`]): the activation's output is never
    /// saved for the weight's gradient.
    pub fn forward_activated(&self, x: &Tensor, activation: Epilogue) -> Result<Tensor> {
        check_last("Linear", x, 1, self.in_features)?;
        let b = self.bias.as_ref().map(Var::tensor);
        x.activation_linear(&self.weight.tensor(), b.as_ref(), activation)
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Epilogue::Identity)
    }
}
