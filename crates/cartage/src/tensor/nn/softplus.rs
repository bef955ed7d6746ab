//! `softplus_with`: softplus with PyTorch's `beta` and `threshold`, composed from recorded element-wise ops.

use cartage_core::{Error, Result, Scalar};

use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// [`Tensor::softplus`] with a slope and a cut-off: `log(1 + e^{beta·x}) / beta`, and `x` itself where `beta·x > threshold` (PyTorch's
    /// `F.softplus(x, beta=1, threshold=20)`), computed as `relu(beta·x) + log(1 + e^{−|beta·x|})`
    /// so that no exponential overflows. Float dtypes; `beta` must be finite and non-zero.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[0.0f32, 30.0, -30.0], &[3], &Device::cpu())?;
    /// let y = x.softplus_with(1.0, 20.0)?.to_vec::<f32>()?;
    /// assert!((y[0] - std::f32::consts::LN_2).abs() < 1e-6 && y[1] == 30.0 && y[2] < 1e-12);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn softplus_with(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        const NAME: &str = "softplus";
        check::float(NAME, self.dtype())?;
        if !(beta.is_finite() && beta != 0.0) || threshold.is_nan() {
            return Err(Error::invalid(
                NAME,
                format!(
                    "beta must be finite and non-zero and threshold a number (got beta {beta}, threshold {threshold})"
                ),
            ));
        }
        let bx = self.mul_scalar(beta)?;
        let smooth = bx
            .relu()?
            .add(&bx.abs()?.neg()?.exp()?.add_scalar(1.0)?.log()?)?
            .mul_scalar(1.0 / beta)?;
        let limit = bx.scalar_like(Scalar::Float(threshold), caller())?;
        Tensor::where_cond(&bx.gt(&limit)?, self, &smooth)
    }
}
