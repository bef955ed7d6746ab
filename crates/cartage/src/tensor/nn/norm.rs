//! Layer norm and RMS norm over the last dimension: one `Kernel::Norm` each, one pass over the
//! input, which is read in place whatever its strides.

use cartage_core::{Error, Kernel, NormKind, Result, Site};

use crate::autograd::{formulas, graph};
use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// Layer normalisation over the last dimension:
    /// `(x - mean) / sqrt(var + eps) * weight + bias`, with the biased variance, computed in f32
    /// (f64 for f64) in one kernel. `weight` and `bias` are optional, 1-D of the last
    /// dimension's size, of this tensor's dtype and device. Float dtypes; `eps` finite and ≥ 0.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::cpu())?;
    /// let y = x.layer_norm(None, None, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, 1.0, -1.0, 1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.normalize_last(NormKind::Layer, weight, bias, eps, caller())
    }

    /// RMS normalisation over the last dimension: `x / sqrt(mean(x²) + eps) * weight`, computed
    /// in f32 (f64 for f64) in one kernel. `weight` is optional, 1-D of the last dimension's
    /// size, of this tensor's dtype and device. Float dtypes; `eps` finite and ≥ 0, or `None`
    /// for PyTorch's default `F.rms_norm(eps=None)`: the machine epsilon of this tensor's dtype
    /// ([`DType::eps`](crate::DType::eps)).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[3.0f32, -3.0], &[1, 2], &Device::cpu())?;
    /// let w = Tensor::from_slice(&[1.0f32, 2.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.rms_norm(Some(&w), 0.0)?.to_vec::<f32>()?, vec![1.0, -2.0]);
    /// // eps = f32::EPSILON, as torch.finfo(torch.float32).eps
    /// let y = x.rms_norm(Some(&w), None)?.to_vec::<f32>()?;
    /// assert!((y[0] - 1.0).abs() < 1e-6);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: impl Into<Option<f64>>) -> Result<Tensor> {
        // An integer input has no epsilon; its dtype is refused by the float check.
        let eps = eps.into().unwrap_or_else(|| self.dtype.eps().unwrap_or(0.0));
        self.normalize_last(NormKind::Rms, weight, None, eps, caller())
    }

    fn normalize_last(
        &self,
        kind: NormKind,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        site: Site,
    ) -> Result<Tensor> {
        if crate::autocast::autocast_dtype().is_some()
            && [Some(self), weight, bias]
                .into_iter()
                .flatten()
                .any(|t| t.dtype.size_in_bytes() == 2 && t.dtype.is_float())
        {
            let x = crate::autocast::widen(self)?;
            let w = weight.map(crate::autocast::widen).transpose()?;
            let b = bias.map(crate::autocast::widen).transpose()?;
            return x.normalize_last(kind, w.as_ref(), b.as_ref(), eps, site);
        }
        let name = kind.name();
        check::float(name, self.dtype)?;
        let Some(&last) = self.shape().last() else {
            return Err(Error::invalid(
                name,
                "the input is a scalar (shape []); it needs at least one dimension to normalise over",
            ));
        };
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(name, format!("eps must be finite and ≥ 0, got {eps}")));
        }
        for (role, param) in [("weight", weight), ("bias", bias)] {
            let Some(param) = param else { continue };
            check::same_device_and_dtype(name, self, param)?;
            if param.shape() != [last] {
                return Err(Error::ShapeMismatch {
                    op: name,
                    lhs: self.shape().to_vec(),
                    rhs: param.shape().to_vec(),
                    reason: format!(
                        "the {role} has shape {:?} but must be 1-D of the input's last dimension, size {last}",
                        param.shape()
                    ),
                });
            }
        }
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Norm {
            kind,
            input: self.as_arg(),
            weight: weight.map(Tensor::as_arg),
            bias: bias.map(Tensor::as_arg),
            eps,
            out: out.as_arg(),
        };
        let inputs: Vec<&Tensor> = std::iter::once(self).chain(weight).chain(bias).collect();
        out.launch(&kernel, &inputs, out.numel())?;
        Ok(graph::record(out, name, &inputs, |_| {
            formulas::nn::norm(kind, self, weight, bias.is_some(), eps)
        }))
    }
}
