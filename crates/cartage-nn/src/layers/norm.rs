//! [`LayerNorm`] and [`RmsNorm`] over the last dimension.

use cartage::{DType, Result, Tensor, Var};

use super::check_last;
use crate::{Module, Scope};

/// Layer normalisation over the last dimension, with a weight (ones) and, unless built
/// without, a bias (zeros).
pub struct LayerNorm {
    weight: Var,
    bias: Option<Var>,
    eps: f64,
}

impl LayerNorm {
    /// Over the last `dim` elements, with `eps` (PyTorch's default is 1e-5) and a bias.
    pub fn new(scope: &Scope, dim: usize, eps: f64) -> Result<LayerNorm> {
        LayerNorm::with_bias(scope, dim, eps, true)
    }

    /// Over the last `dim` elements, with `eps`, and a bias only when `bias` is set
    /// (PyTorch's `nn.LayerNorm(dim, eps, bias=bias)`).
    pub fn with_bias(scope: &Scope, dim: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        let device = scope.device();
        let bias = match bias {
            true => Some(scope.var("bias", Tensor::zeros(&[dim], DType::F32, &device)?)?),
            false => None,
        };
        Ok(LayerNorm {
            weight: scope.var("weight", Tensor::ones(&[dim], DType::F32, &device)?)?,
            bias,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.tensor();
        let b = self.bias.as_ref().map(Var::tensor);
        check_last("LayerNorm", x, 1, w.numel())?;
        x.layer_norm(Some(&w), b.as_ref(), self.eps)
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
