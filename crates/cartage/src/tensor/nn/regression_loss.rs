//! Element-wise losses between a prediction and a target of the same shape: `mse_loss`,
//! `l1_loss`, `smooth_l1_loss` and `binary_cross_entropy_with_logits`, with PyTorch's formulas
//! and reductions (the mean over every element by default). Each is composed from recorded
//! element-wise ops, so autograd differentiates it on every backend.

use cartage_core::{Error, Result};

use super::Reduction;
use crate::tensor::{Tensor, check};

impl Tensor {
    /// Mean squared error `(self − target)²`, reduced as `reduction` says (PyTorch's
    /// `F.mse_loss`).
    ///
    /// ```
    /// use cartage::tensor::nn::Reduction;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 4.0], &[3], &cpu)?;
    /// let y = Tensor::from_slice(&[1.0f32, 0.0, 1.0], &[3], &cpu)?;
    /// assert_eq!(x.mse_loss(&y, Reduction::Mean)?.item::<f32>()?, 13.0 / 3.0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn mse_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let d = self.pair("mse_loss", target)?;
        reduce(d.square()?, reduction)
    }

    /// Mean absolute error `|self − target|`, reduced as `reduction` says (`F.l1_loss`).
    #[track_caller]
    pub fn l1_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let d = self.pair("l1_loss", target)?;
        reduce(d.abs()?, reduction)
    }

    /// Huber-style loss (`F.smooth_l1_loss`): `0.5 d² / beta` where `|d| < beta`, else
    /// `|d| − 0.5 beta`, with `d = self − target`; `beta = 0` is the L1 loss. PyTorch's default
    /// `beta` is 1.0.
    ///
    /// ```
    /// use cartage::tensor::nn::Reduction;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[0.5f32, 3.0], &[2], &cpu)?;
    /// let zero = Tensor::zeros(&[2], cartage::DType::F32, &cpu)?;
    /// assert_eq!(x.smooth_l1_loss(&zero, 1.0, Reduction::None)?.to_vec::<f32>()?, vec![0.125, 2.5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn smooth_l1_loss(&self, target: &Tensor, beta: f64, reduction: Reduction) -> Result<Tensor> {
        const NAME: &str = "smooth_l1_loss";
        if !(beta.is_finite() && beta >= 0.0) {
            return Err(Error::invalid(NAME, format!("beta must be finite and ≥ 0, got {beta}")));
        }
        let a = self.pair(NAME, target)?.abs()?;
        if beta == 0.0 {
            return reduce(a, reduction);
        }
        // m = min(|d|, beta): m·(|d| − m/2)/beta is 0.5 d²/beta below beta and |d| − beta/2 above.
        let m = a.clamp_max(beta)?;
        let loss = m.mul(&a.sub(&m.mul_scalar(0.5)?)?)?.mul_scalar(1.0 / beta)?;
        reduce(loss, reduction)
    }

    /// Binary cross-entropy of logits (`F.binary_cross_entropy_with_logits`): with `x` this
    /// tensor and `t` the target (probabilities in [0, 1], same shape),
    /// `(1 − t)·x + (1 + (p − 1)·t)·(log(1 + e^{−|x|}) + max(−x, 0))`, computed without
    /// overflow for any `x`; `pos_weight` `p` (broadcast against the last dims, e.g. one
    /// weight per class) weighs the positive term, and is 1 when `None`.
    ///
    /// ```
    /// use cartage::tensor::nn::Reduction;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[0.0f32, 100.0, -100.0], &[3], &cpu)?;
    /// let t = Tensor::from_slice(&[1.0f32, 1.0, 1.0], &[3], &cpu)?;
    /// let l = x.binary_cross_entropy_with_logits(&t, None, Reduction::None)?.to_vec::<f32>()?;
    /// assert!((l[0] - std::f32::consts::LN_2).abs() < 1e-6 && l[1] == 0.0 && l[2] == 100.0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn binary_cross_entropy_with_logits(
        &self,
        target: &Tensor,
        pos_weight: Option<&Tensor>,
        reduction: Reduction,
    ) -> Result<Tensor> {
        const NAME: &str = "binary_cross_entropy_with_logits";
        self.check_pair(NAME, target)?;
        // softplus(−x) = log(1 + e^{−|x|}) + max(−x, 0), exact for large |x|.
        let softplus_neg = self
            .abs()?
            .neg()?
            .exp()?
            .add_scalar(1.0)?
            .log()?
            .add(&self.neg()?.relu()?)?;
        let one_minus_t = target.neg()?.add_scalar(1.0)?;
        let positive = match pos_weight {
            None => softplus_neg,
            Some(p) => {
                check::same_device_and_dtype(NAME, self, p)?;
                let weight = p.add_scalar(-1.0)?.mul(target)?.add_scalar(1.0)?;
                weight.mul(&softplus_neg)?
            }
        };
        reduce(one_minus_t.mul(self)?.add(&positive)?, reduction)
    }

    /// `self − target` after [`Tensor::check_pair`].
    fn pair(&self, name: &'static str, target: &Tensor) -> Result<Tensor> {
        self.check_pair(name, target)?;
        self.sub(target)
    }

    /// Check that the prediction and the target are floats of one dtype, shape and device.
    fn check_pair(&self, name: &'static str, target: &Tensor) -> Result<()> {
        check::same_device_and_dtype(name, self, target)?;
        check::float(name, self.dtype())?;
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
                reason: "the input and the target must have the same shape (broadcast the target \
                         explicitly with `expand` if that is what you mean)"
                    .into(),
            });
        }
        Ok(())
    }
}

/// The mean or sum of every element, or the elements themselves.
fn reduce(loss: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::Mean => loss.mean_all(),
        Reduction::Sum => loss.sum_all(),
        Reduction::None => Ok(loss),
    }
}
