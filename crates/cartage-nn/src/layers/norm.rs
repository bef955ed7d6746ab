//! [`LayerNorm`] and [`RmsNorm`] over the last dimension.

use cartage::{DType, Result, Tensor, Var};

use super::{Linear, check_last};
use crate::{Module, Scope};

/// Layer normalisation over the last dimension, with a weight (ones) and, unless built
/// without, a bias (zeros).
pub struct LayerNorm {
    weight: Var,
    bias: Option<Var>,
    eps: f64,
    /// PyTorch's `normalized_shape`: the trailing dims normalised together.
    shape: Vec<usize>,
}

impl LayerNorm {
    /// Over the last `dim` elements, with `eps` (PyTorch's default is 1e-5) and a bias.
    pub fn new(scope: &Scope, dim: usize, eps: f64) -> Result<LayerNorm> {
        LayerNorm::with_bias(scope, dim, eps, true)
    }

    /// Over the last `dim` elements, with `eps`, and a bias only when `bias` is set
    /// (PyTorch's `nn.LayerNorm(dim, eps, bias=bias)`).
    pub fn with_bias(scope: &Scope, dim: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        LayerNorm::over(scope, &[dim], eps, bias)
    }

    /// PyTorch's `nn.LayerNorm(normalized_shape, eps, bias=bias)`: normalises over the trailing
    /// dims `normalized_shape` together, with a weight (and a bias) of that shape.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{Module, ParamStore, layers::LayerNorm};
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// let norm = LayerNorm::over(&store.root().sub("ln"), &[2, 3], 1e-5, true)?;
    /// assert_eq!(store.get("ln.weight").unwrap().shape().as_slice(), &[2, 3]);
    /// let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &Device::cpu())?.reshape(&[2, 2, 3])?;
    /// let y = norm.forward(&x)?; // each [2, 3] block has mean 0 and variance 1
    /// let first: f32 = y.narrow(0, 0, 1)?.sum_all()?.item()?;
    /// assert!(first.abs() < 1e-5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn over(scope: &Scope, normalized_shape: &[usize], eps: f64, bias: bool) -> Result<LayerNorm> {
        if normalized_shape.is_empty() || normalized_shape.contains(&0) {
            return Err(cartage::Error::InvalidArgument {
                op: "LayerNorm",
                reason: format!("normalized_shape {normalized_shape:?} must name at least one dim, none of size 0"),
            });
        }
        let device = scope.device();
        let bias = match bias {
            true => Some(scope.var("bias", Tensor::zeros(normalized_shape, DType::F32, &device)?)?),
            false => None,
        };
        Ok(LayerNorm {
            weight: scope.var("weight", Tensor::ones(normalized_shape, DType::F32, &device)?)?,
            bias,
            eps,
            shape: normalized_shape.to_vec(),
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.tensor();
        let b = self.bias.as_ref().map(Var::tensor);
        if let [dim] = self.shape[..] {
            check_last("LayerNorm", x, 1, dim)?;
            return x.layer_norm(Some(&w), b.as_ref(), self.eps);
        }
        // Several trailing dims: normalise them as one flattened last dim.
        let k = self.shape.len();
        if x.rank() < k || x.shape()[x.rank() - k..] != self.shape[..] {
            return Err(super::wrong_input(
                "LayerNorm",
                x,
                format!("its last dims must be the normalized_shape {:?}", self.shape),
            ));
        }
        let n: usize = self.shape.iter().product();
        let mut flat: Vec<usize> = x.shape()[..x.rank() - k].to_vec();
        flat.push(n);
        let w = w.reshape(&[n])?;
        let b = b.map(|b| b.reshape(&[n])).transpose()?;
        x.reshape(&flat)?
            .layer_norm(Some(&w), b.as_ref(), self.eps)?
            .reshape(x.shape())
    }
}

impl LayerNorm {
    /// `linear.forward(self.forward(x))`, the same values, recorded as one node that keeps
    /// `x` and recomputes the normalised tensor in backward ([`Tensor::layer_norm_linear`]):
    /// the norm's output is never saved for the linear layer's weight gradient. A norm over
    /// several trailing dims is composed.
    pub fn forward_linear(&self, x: &Tensor, linear: &Linear) -> Result<Tensor> {
        let [dim] = self.shape[..] else {
            return linear.forward(&self.forward(x)?);
        };
        check_last("LayerNorm", x, 1, dim)?;
        let (w, b) = linear.parameters_for(x)?;
        let (gamma, beta) = (self.weight.tensor(), self.bias.as_ref().map(Var::tensor));
        x.layer_norm_linear(Some(&gamma), beta.as_ref(), self.eps, &w, b.as_ref())
    }
}

/// RMS normalisation over the last dimension, with a weight (ones).
pub struct RmsNorm {
    weight: Var,
    eps: Option<f64>,
}

impl RmsNorm {
    /// Over the last `dim` elements, with `eps`; `None` is PyTorch's `nn.RMSNorm(eps=None)`: the
    /// machine epsilon of the input's dtype (`DType::eps`).
    pub fn new(scope: &Scope, dim: usize, eps: impl Into<Option<f64>>) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: scope.var("weight", Tensor::ones(&[dim], DType::F32, &scope.device())?)?,
            eps: eps.into(),
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
