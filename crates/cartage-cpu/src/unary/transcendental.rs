//! [`Transcendental`]: the transcendental unary functions of each compute type, as the unary
//! kernel calls them.

use crate::elem::{Float, float_fn};
use crate::fast_math::vmath;

/// The transcendental unary functions of a compute type: [`vmath`]'s vectorisable ones for f32,
/// the standard library's and libm's for f64 (through [`Float`] and [`float_fn`]).
pub trait Transcendental: Float {
    /// `e^x`.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The hyperbolic tangent.
    fn tanh(self) -> Self;
    /// `1 / (1 + e^-x)`.
    fn sigmoid(self) -> Self;
    /// The exact (erf) GELU.
    fn gelu(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// `x · sigmoid(x)`.
    fn silu(self) -> Self;
    /// `log1p(e^x)`, `x` above 20.
    fn softplus(self) -> Self;
}

impl Transcendental for f32 {
    #[inline(always)]
    fn exp(self) -> Self {
        vmath::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        vmath::ln(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        vmath::tanh(self)
    }
    #[inline(always)]
    fn sigmoid(self) -> Self {
        vmath::sigmoid(self)
    }
    #[inline(always)]
    fn gelu(self) -> Self {
        vmath::gelu(self)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        vmath::erf(self)
    }
    #[inline(always)]
    fn silu(self) -> Self {
        vmath::silu(self)
    }
    #[inline(always)]
    fn softplus(self) -> Self {
        vmath::softplus(self)
    }
}

impl Transcendental for f64 {
    #[inline(always)]
    fn exp(self) -> Self {
        <f64 as Float>::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        <f64 as Float>::ln(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        <f64 as Float>::tanh(self)
    }
    #[inline(always)]
    fn sigmoid(self) -> Self {
        float_fn::sigmoid(self)
    }
    #[inline(always)]
    fn gelu(self) -> Self {
        float_fn::gelu(self)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        <f64 as Float>::erf(self)
    }
    #[inline(always)]
    fn silu(self) -> Self {
        float_fn::silu(self)
    }
    #[inline(always)]
    fn softplus(self) -> Self {
        float_fn::softplus(self)
    }
}
