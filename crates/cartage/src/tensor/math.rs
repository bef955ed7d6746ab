//! Element-wise math beyond the basic ops: rounding, trigonometry, activations, clamps, tests
//! for NaN and infinity, logical ops and `lerp`.
//!
//! The functions of one operand are single [`UnaryOp`] kernels; everything else is composed on
//! the device from existing kernels (unary, binary, comparison, where), never through the host.
//! Operands share device and dtype, as for the basic ops: scalars are converted to the
//! tensor's dtype (so `clamp(0.5, 2.5)` of an integer tensor clamps to `0..=2`).

use cartage_core::{BinaryOp, CompareOp, DType, Error, Kernel, Result, Scalar, Site, UnaryOp};

use super::{Tensor, caller, check};

/// Generates one method per [`UnaryOp`], each with a doc example on the CPU.
macro_rules! unary_math {
    ($($(#[$doc:meta])* $name:ident => $op:expr, [$($input:expr),*] => [$($expect:expr),*];)*) => {$(
        $(#[$doc])*
        ///
        /// ```
        /// use cartage::prelude::*;
        /// # fn main() -> cartage::Result<()> {
        #[doc = concat!("let data = [", $(stringify!($input), "f32, ",)* "];")]
        /// let x = Tensor::from_slice(&data, &[data.len()], &Device::cpu())?;
        #[doc = concat!("let y = x.", stringify!($name), "()?.to_vec::<f32>()?;")]
        #[doc = concat!("let expected = [", $(stringify!($expect), "f32, ",)* "];")]
        /// assert!(y.iter().zip(expected).all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs())), "{y:?}");
        /// # Ok(())
        /// # }
        /// ```
        #[track_caller]
        pub fn $name(&self) -> Result<Tensor> {
            self.unary($op, caller())
        }
    )*};
}

/// The weight of [`Tensor::lerp`]: one number for every element, or a tensor broadcast with
/// the operands (of their dtype).
#[derive(Clone, Copy, Debug)]
pub enum LerpWeight<'a> {
    /// The same weight everywhere.
    Scalar(f64),
    /// A weight per element (broadcast).
    Tensor(&'a Tensor),
}

impl From<f64> for LerpWeight<'_> {
    fn from(value: f64) -> Self {
        LerpWeight::Scalar(value)
    }
}

impl From<f32> for LerpWeight<'_> {
    fn from(value: f32) -> Self {
        LerpWeight::Scalar(value as f64)
    }
}

impl<'a> From<&'a Tensor> for LerpWeight<'a> {
    fn from(value: &'a Tensor) -> Self {
        LerpWeight::Tensor(value)
    }
}

impl Tensor {
    unary_math! {
        /// Sine, element-wise (float dtypes).
        sin => UnaryOp::Sin, [0.0, 1.5707964] => [0.0, 1.0];
        /// Cosine, element-wise (float dtypes).
        cos => UnaryOp::Cos, [0.0, 3.1415927] => [1.0, -1.0];
        /// Largest integer not above each element. On integer dtypes it is the identity and
        /// returns a fresh copy (never a view of `self`).
        floor => UnaryOp::Floor, [-1.5, 0.5, 2.0] => [-2.0, 0.0, 2.0];
        /// Smallest integer not below each element. On integer dtypes it is the identity and
        /// returns a fresh copy (never a view of `self`).
        ceil => UnaryOp::Ceil, [-1.5, 0.5, 2.0] => [-1.0, 1.0, 2.0];
        /// Nearest integer, halves to even (as PyTorch and numpy). On integer dtypes it is the
        /// identity and returns a fresh copy (never a view of `self`).
        round => UnaryOp::Round, [0.5, 1.5, 2.5, -0.5, -1.7] => [0.0, 2.0, 2.0, 0.0, -2.0];
        /// The integer part (rounds toward zero). On integer dtypes it is the identity and
        /// returns a fresh copy (never a view of `self`).
        trunc => UnaryOp::Trunc, [-1.7, 1.7] => [-1.0, 1.0];
        /// -1, 0 or 1 by the sign of each element (NaN stays NaN, ±0 stays ±0); integers too.
        sign => UnaryOp::Sign, [-3.0, 0.0, 2.5] => [-1.0, 0.0, 1.0];
        /// `1 / sqrt(x)` (float dtypes; `rsqrt(0)` is +inf).
        rsqrt => UnaryOp::Rsqrt, [4.0, 0.25] => [0.5, 2.0];
        /// `1 / x` (float dtypes; `recip(0)` is +inf).
        recip => UnaryOp::Recip, [2.0, -4.0] => [0.5, -0.25];
        /// `x * x`; integers too (wrapping).
        square => UnaryOp::Square, [3.0, -2.0] => [9.0, 4.0];
        /// The error function (float dtypes).
        erf => UnaryOp::Erf, [0.0, 1.0] => [0.0, 0.84270079];
        /// `ln(1 + x)`, accurate near 0 (float dtypes).
        log1p => UnaryOp::Log1p, [0.0, 1.7182817] => [0.0, 1.0];
        /// `e^x - 1`, accurate near 0 (float dtypes).
        expm1 => UnaryOp::Expm1, [0.0, 1.0] => [0.0, 1.7182817];
        /// SiLU (swish): `x * sigmoid(x)` (float dtypes).
        silu => UnaryOp::Silu, [0.0, 1.0] => [0.0, 0.7310586];
        /// Softplus: `ln(1 + e^x)`, and `x` itself above 20 as in PyTorch (float dtypes).
        softplus => UnaryOp::Softplus, [0.0, 30.0] => [0.6931472, 30.0];
    }

    /// Element-wise maximum with a scalar (converted to this tensor's dtype); NaN propagates.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-1i64, 3], &[2], &Device::cpu())?;
    /// assert_eq!(x.maximum_scalar(0)?.to_vec::<i64>()?, vec![0, 3]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn maximum_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        self.with_scalar(BinaryOp::Maximum, value.into(), caller())
    }

    /// Element-wise minimum with a scalar (converted to this tensor's dtype); NaN propagates.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-1.0f32, 3.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.minimum_scalar(1.0)?.to_vec::<f32>()?, vec![-1.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn minimum_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        self.with_scalar(BinaryOp::Minimum, value.into(), caller())
    }

    /// `min(max(x, lo), hi)` with scalar bounds (converted to this tensor's dtype). As in
    /// PyTorch, `lo > hi` gives `hi` everywhere, and NaN elements stay NaN.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-2.0f32, 0.5, 7.0], &[3], &Device::cpu())?;
    /// assert_eq!(x.clamp(0.0, 1.0)?.to_vec::<f32>()?, vec![0.0, 0.5, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn clamp(&self, lo: impl Into<Scalar>, hi: impl Into<Scalar>) -> Result<Tensor> {
        let site = caller();
        self.with_scalar(BinaryOp::Maximum, lo.into(), site)?
            .with_scalar(BinaryOp::Minimum, hi.into(), site)
    }

    /// `max(x, lo)`: clamps from below only (same as [`Tensor::maximum_scalar`]).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-2.0f32, 3.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.clamp_min(0.0)?.to_vec::<f32>()?, vec![0.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn clamp_min(&self, lo: impl Into<Scalar>) -> Result<Tensor> {
        self.with_scalar(BinaryOp::Maximum, lo.into(), caller())
    }

    /// `min(x, hi)`: clamps from above only (same as [`Tensor::minimum_scalar`]).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-2.0f32, 3.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.clamp_max(1.0)?.to_vec::<f32>()?, vec![-2.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn clamp_max(&self, hi: impl Into<Scalar>) -> Result<Tensor> {
        self.with_scalar(BinaryOp::Minimum, hi.into(), caller())
    }

    /// `min(max(x, lo), hi)` with tensor bounds of this dtype; all three broadcast together.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[5.0f32, 5.0, -5.0, -5.0], &[2, 2], &cpu)?;
    /// let lo = Tensor::from_slice(&[-1.0f32, -2.0], &[2], &cpu)?;
    /// let hi = Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?;
    /// assert_eq!(x.clamp_tensor(&lo, &hi)?.to_vec::<f32>()?, vec![1.0, 2.0, -1.0, -2.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn clamp_tensor(&self, lo: &Tensor, hi: &Tensor) -> Result<Tensor> {
        let site = caller();
        self.binary(BinaryOp::Maximum, lo, site)?
            .binary(BinaryOp::Minimum, hi, site)
    }

    /// Leaky ReLU: `x` where `x > 0`, else `slope * x` (float dtypes).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-2.0f32, 3.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.leaky_relu(0.5)?.to_vec::<f32>()?, vec![-1.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn leaky_relu(&self, slope: f64) -> Result<Tensor> {
        let site = caller();
        check::float("leaky_relu", self.dtype)?;
        let positive = self.compare_scalar(CompareOp::Gt, Scalar::Float(0.0), site)?;
        let scaled = self.with_scalar(BinaryOp::Mul, Scalar::Float(slope), site)?;
        Tensor::where_at(&positive, self, &scaled, site)
    }

    /// ELU: `x` where `x > 0`, else `alpha * (e^x - 1)` (float dtypes).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[0.0f32, 3.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.elu(1.0)?.to_vec::<f32>()?, vec![0.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        let site = caller();
        check::float("elu", self.dtype)?;
        let positive = self.compare_scalar(CompareOp::Gt, Scalar::Float(0.0), site)?;
        let negative = self
            .unary(UnaryOp::Expm1, site)?
            .with_scalar(BinaryOp::Mul, Scalar::Float(alpha), site)?;
        Tensor::where_at(&positive, self, &negative, site)
    }

    /// Hard tanh: `x` clamped to `[lo, hi]`. Unlike [`Tensor::clamp`], `lo > hi` (or a NaN
    /// bound) is [`Error::InvalidArgument`], as `torch.nn.Hardtanh` refuses it.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[-2.0f32, 0.5, 3.0], &[3], &Device::cpu())?;
    /// assert_eq!(x.hardtanh(-1.0, 1.0)?.to_vec::<f32>()?, vec![-1.0, 0.5, 1.0]);
    /// assert!(x.hardtanh(1.0, -1.0).is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn hardtanh(&self, lo: impl Into<Scalar>, hi: impl Into<Scalar>) -> Result<Tensor> {
        let site = caller();
        let (lo, hi) = (lo.into(), hi.into());
        let ordered = matches!(
            lo.as_f64().partial_cmp(&hi.as_f64()),
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
        );
        if !ordered {
            return Err(Error::invalid(
                "hardtanh",
                format!(
                    "the lower bound {} is above the upper bound {}; pass lo <= hi",
                    lo.as_f64(),
                    hi.as_f64()
                ),
            ));
        }
        self.with_scalar(BinaryOp::Maximum, lo, site)?
            .with_scalar(BinaryOp::Minimum, hi, site)
    }

    /// True (bool) where an element is NaN, computed as `x != x`; all false (a fill) for
    /// integer and bool dtypes.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, f32::NAN, f32::INFINITY], &[3], &Device::cpu())?;
    /// assert_eq!(x.isnan()?.to_vec::<bool>()?, vec![false, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn isnan(&self) -> Result<Tensor> {
        let site = caller();
        if !self.dtype.is_float() {
            return self.bool_like(false, site);
        }
        self.compare(CompareOp::Ne, self, site)
    }

    /// True (bool) where an element is +inf or -inf, computed as `|x| == inf`; all false (a
    /// fill) for integer and bool dtypes.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, f32::NAN, f32::NEG_INFINITY], &[3], &Device::cpu())?;
    /// assert_eq!(x.isinf()?.to_vec::<bool>()?, vec![false, false, true]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn isinf(&self) -> Result<Tensor> {
        let site = caller();
        if !self.dtype.is_float() {
            return self.bool_like(false, site);
        }
        self.unary(UnaryOp::Abs, site)?
            .compare_scalar(CompareOp::Eq, Scalar::Float(f64::INFINITY), site)
    }

    /// True (bool) where an element is neither NaN nor infinite, computed as `|x| < inf`; all
    /// true (a fill) for integer and bool dtypes.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, f32::NAN, f32::INFINITY], &[3], &Device::cpu())?;
    /// assert_eq!(x.isfinite()?.to_vec::<bool>()?, vec![true, false, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn isfinite(&self) -> Result<Tensor> {
        let site = caller();
        if !self.dtype.is_float() {
            return self.bool_like(true, site);
        }
        self.unary(UnaryOp::Abs, site)?
            .compare_scalar(CompareOp::Lt, Scalar::Float(f64::INFINITY), site)
    }

    /// Logical and (bool), broadcasting. A non-bool operand counts as `x != 0` first, as in
    /// PyTorch (NaN is true); the two operands may have different dtypes.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let a = Tensor::from_slice(&[true, true, false], &[3], &cpu)?;
    /// let b = Tensor::from_slice(&[2.0f32, 0.0, 1.0], &[3], &cpu)?;
    /// assert_eq!(a.logical_and(&b)?.to_vec::<bool>()?, vec![true, false, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn logical_and(&self, other: &Tensor) -> Result<Tensor> {
        self.logical("logical_and", other, BinaryOp::Minimum, caller())
    }

    /// Logical or (bool), broadcasting; non-bool operands count as `x != 0`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let a = Tensor::from_slice(&[true, false, false], &[3], &cpu)?;
    /// let b = Tensor::from_slice(&[0i64, 5, 0], &[3], &cpu)?;
    /// assert_eq!(a.logical_or(&b)?.to_vec::<bool>()?, vec![true, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn logical_or(&self, other: &Tensor) -> Result<Tensor> {
        self.logical("logical_or", other, BinaryOp::Maximum, caller())
    }

    /// Logical exclusive or (bool), broadcasting; non-bool operands count as `x != 0`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let a = Tensor::from_slice(&[true, true, false, false], &[4], &cpu)?;
    /// let b = Tensor::from_slice(&[true, false, true, false], &[4], &cpu)?;
    /// assert_eq!(a.logical_xor(&b)?.to_vec::<bool>()?, vec![false, true, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        let site = caller();
        check::same_device("logical_xor", self, other)?;
        let (a, b) = (self.truthy(site)?, other.truthy(site)?);
        a.compare(CompareOp::Ne, &b, site)
    }

    /// Logical not (bool); a non-bool tensor gives `x == 0`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[0.0f32, 2.0, f32::NAN], &[3], &Device::cpu())?;
    /// assert_eq!(x.logical_not()?.to_vec::<bool>()?, vec![true, false, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn logical_not(&self) -> Result<Tensor> {
        let site = caller();
        let zero = if self.dtype == DType::Bool {
            Scalar::Bool(false)
        } else {
            Scalar::Int(0)
        };
        self.compare_scalar(CompareOp::Eq, zero, site)
    }

    /// Linear interpolation `self + weight * (end - self)` (float dtypes), broadcasting; the
    /// weight is a number or a tensor of the operands' dtype ([`LerpWeight`]).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let start = Tensor::from_slice(&[0.0f32, 10.0], &[2], &cpu)?;
    /// let end = Tensor::from_slice(&[4.0f32, 20.0], &[2], &cpu)?;
    /// assert_eq!(start.lerp(&end, 0.25)?.to_vec::<f32>()?, vec![1.0, 12.5]);
    /// let w = Tensor::from_slice(&[0.5f32, 1.0], &[2], &cpu)?;
    /// assert_eq!(start.lerp(&end, &w)?.to_vec::<f32>()?, vec![2.0, 20.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn lerp<'a>(&self, end: &Tensor, weight: impl Into<LerpWeight<'a>>) -> Result<Tensor> {
        let site = caller();
        check::float("lerp", self.dtype)?;
        let step = end.binary(BinaryOp::Sub, self, site).map_err(|e| rename(e, "lerp"))?;
        let scaled = match weight.into() {
            LerpWeight::Scalar(w) => step.with_scalar(BinaryOp::Mul, Scalar::Float(w), site)?,
            LerpWeight::Tensor(w) => {
                check::same_device("lerp", self, w)?;
                step.binary(BinaryOp::Mul, w, site).map_err(|e| rename(e, "lerp"))?
            }
        };
        self.binary(BinaryOp::Add, &scaled, site).map_err(|e| rename(e, "lerp"))
    }

    /// `self op value` with the value filled on the device as a 0-d tensor of this dtype.
    pub(super) fn with_scalar(&self, op: BinaryOp, value: Scalar, site: Site) -> Result<Tensor> {
        let scalar = self.scalar_like(value, site)?;
        self.binary(op, &scalar, site)
    }

    /// `self op value` (bool out) with the value filled on the device as a 0-d tensor.
    pub(crate) fn compare_scalar(&self, op: CompareOp, value: Scalar, site: Site) -> Result<Tensor> {
        let scalar = self.scalar_like(value, site)?;
        self.compare(op, &scalar, site)
    }

    /// A bool tensor of this shape holding `value` everywhere.
    fn bool_like(&self, value: bool, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(self.shape(), DType::Bool, site)?;
        let kernel = Kernel::Fill {
            out: out.as_arg(),
            value: Scalar::Bool(value),
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }

    /// This tensor as bool: itself when bool, else `x != 0`.
    pub(super) fn truthy(&self, site: Site) -> Result<Tensor> {
        if self.dtype == DType::Bool {
            return Ok(self.clone());
        }
        self.compare_scalar(CompareOp::Ne, Scalar::Int(0), site)
    }

    fn logical(&self, name: &'static str, other: &Tensor, op: BinaryOp, site: Site) -> Result<Tensor> {
        check::same_device(name, self, other)?;
        let (a, b) = (self.truthy(site)?, other.truthy(site)?);
        a.binary(op, &b, site).map_err(|e| rename(e, name))
    }
}

/// Put the composite op's name on an error raised by one of its steps.
fn rename(error: Error, name: &'static str) -> Error {
    match error {
        Error::DTypeMismatch {
            lhs,
            lhs_site,
            rhs,
            rhs_site,
            ..
        } => Error::DTypeMismatch {
            op: name,
            lhs,
            lhs_site,
            rhs,
            rhs_site,
        },
        Error::DeviceMismatch {
            lhs_device,
            lhs_site,
            rhs_device,
            rhs_site,
            ..
        } => Error::DeviceMismatch {
            op: name,
            lhs_device,
            lhs_site,
            rhs_device,
            rhs_site,
        },
        other => check::rename(other, name),
    }
}
