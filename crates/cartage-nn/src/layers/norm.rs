//! [`LayerNorm`] and [`RmsNorm`] over the last dimension.

use cartage::{DType, Result, Tensor, Var};

use super::check_last;
use crate::{Module, Scope};

/// Layer normalisation over the last dimension, with a weight (ones) and a bias (zeros).
pub struct LayerNorm {
    weight: Var,
    bias: Var,
    eps: f64,
}

impl LayerNorm {
    /// Over the last `dim` elements, with `eps` (PyTorch's default is 1e-5).
    pub fn new(scope: &Scope, dim: usize, eps: f64) -> Result<LayerNorm> {
        let device = scope.device();
        Ok(LayerNorm {
            weight: scope.var("weight", Tensor::ones(&[dim], DType::F32, &device)?)?,
            bias: scope.var("bias", Tensor::zeros(&[dim], DType::F32, &device)?)?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.weight.tensor(), self.bias.tensor());
        check_last("LayerNorm", x, 1, w.numel())?;
        x.layer_norm(Some(&w), Some(&b), self.eps)
    }
}

/// RMS normalisation over the last dimension, with a weight (ones).
pub struct RmsNorm {
    weight: Var,
    eps: f64,
}

impl RmsNorm {
    /// Over the last `dim` elements, with `eps`.
    pub fn new(scope: &Scope, dim: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: scope.var("weight", Tensor::ones(&[dim], DType::F32, &scope.device())?)?,
            eps,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.tensor();
        check_last("RmsNorm", x, 1, w.numel())?;
        x.rms_norm(Some(&w), self.eps)
    }
}
