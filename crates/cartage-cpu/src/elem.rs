//! Element types as stored in host memory, and the arithmetic each dtype follows.
//!
//! The semantics are those documented in `cartage_core::kernel`: f16/bf16 compute in f32 and
//! round once on store; integer add/sub/mul/neg/abs/pow wrap (`pow` by square and multiply over
//! the whole exponent); integer division truncates and `x / 0` is 0; integer `pow` with a
//! negative exponent is 0 unless the base is ±1; float maximum/minimum propagate NaN. Bool is stored as one byte ([`Bool8`]) and read as `byte != 0`, so no byte value
//! in memory is ever an invalid value.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// A bool element: one byte, true when non-zero. Written as 0 or 1.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Bool8(pub u8);

impl Bool8 {
    /// The element for `b`.
    #[inline(always)]
    pub fn new(b: bool) -> Self {
        Bool8(b as u8)
    }

    /// Its truth value.
    #[inline(always)]
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

impl PartialEq for Bool8 {
    #[inline(always)]
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl PartialOrd for Bool8 {
    #[inline(always)]
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.get().partial_cmp(&other.get())
    }
}

/// Every storage type: plain old data, any bit pattern valid.
pub trait Pod: Copy + Send + Sync + PartialOrd + 'static {}

impl Pod for f32 {}
impl Pod for f64 {}
impl Pod for f16 {}
impl Pod for bf16 {}
impl Pod for i32 {}
impl Pod for i64 {}
impl Pod for u8 {}
impl Pod for Bool8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for u64 {}

/// Element-wise arithmetic of one numeric dtype (everything but bool).
pub trait Arith: Pod {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a - b`.
    fn sub(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn mul(a: Self, b: Self) -> Self;
    /// `a / b`.
    fn div(a: Self, b: Self) -> Self;
    /// `a ^ b`.
    fn pow(a: Self, b: Self) -> Self;
    /// The larger (NaN if either is NaN).
    fn maximum(a: Self, b: Self) -> Self;
    /// The smaller (NaN if either is NaN).
    fn minimum(a: Self, b: Self) -> Self;
    /// `-x`.
    fn neg(x: Self) -> Self;
    /// `|x|`.
    fn abs(x: Self) -> Self;
    /// `max(x, 0)`.
    fn relu(x: Self) -> Self;
}

/// A float compute type (f32 or f64).
pub trait Float:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// Infinity.
    const INFINITY: Self;
    /// NaN test.
    fn is_nan(self) -> bool;
    /// `e^x`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// `self ^ e`.
    fn powf(self, e: Self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Round down.
    fn floor(self) -> Self;
    /// Round up.
    fn ceil(self) -> Self;
    /// Round half to even.
    fn round_even(self) -> Self;
    /// Round toward zero.
    fn trunc(self) -> Self;
    /// `ln(1 + x)`.
    fn ln_1p(self) -> Self;
    /// `e^x - 1`.
    fn exp_m1(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// From a count (for means).
    fn from_usize(n: usize) -> Self;
    /// From an f64 (rounded).
    fn from_f64(v: f64) -> Self;
    /// To f64 (exact).
    fn to_f64(self) -> f64;
}

macro_rules! float_impl {
    ($t:ty, $erf:path, $exp:path, $tanh:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const INFINITY: Self = <$t>::INFINITY;
            #[inline(always)]
            fn is_nan(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                self.ln()
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                self.sqrt()
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                self.powf(e)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                self.sin()
            }
            #[inline(always)]
            fn cos(self) -> Self {
                self.cos()
            }
            #[inline(always)]
            fn floor(self) -> Self {
                self.floor()
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                self.ceil()
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                self.round_ties_even()
            }
            #[inline(always)]
            fn trunc(self) -> Self {
                self.trunc()
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                self.ln_1p()
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                self.exp_m1()
            }
            #[inline(always)]
            fn abs(self) -> Self {
                self.abs()
            }
            #[inline(always)]
            fn from_usize(n: usize) -> Self {
                n as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}

float_impl!(f32, libm::erff, crate::fast_math::exp_f32, crate::fast_math::tanh_f32);
float_impl!(f64, libm::erf, f64::exp, f64::tanh);

/// A float storage type and the compute type it runs in (f16/bf16 run in f32).
pub trait Real: Pod {
    /// The compute type.
    type C: Float;
    /// Widen to the compute type (exact).
    fn load(self) -> Self::C;
    /// Round the compute type to storage (once).
    fn store(v: Self::C) -> Self;
    /// True when converting blocks of elements ([`Real::widen`], [`Real::narrow`]) is much
    /// cheaper than converting one at a time (f16, whose conversion instruction is chosen at run
    /// time per call): dense kernels then work in blocks of the compute type. bf16 converts with
    /// a shift, which vectorises element by element.
    const BLOCKED: bool = false;
    /// `dst[i] = src[i].load()` for the shorter of the two.
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [Self::C]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.load();
        }
    }
    /// `dst[i] = store(src[i])` for the shorter of the two.
    #[inline(always)]
    fn narrow(src: &[Self::C], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::store(s);
        }
    }
}

impl Real for f32 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        v
    }
}

impl Real for f64 {
    type C = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(v: f64) -> Self {
        v
    }
}

impl Real for f16 {
    type C = f32;
    const BLOCKED: bool = true;
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        src[..n].convert_to_f32_slice(&mut dst[..n]);
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
    }
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Real for bf16 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// NaN-propagating maximum.
#[inline(always)]
pub fn fmax<F: Float>(a: F, b: F) -> F {
    if a > b || a.is_nan() { a } else { b }
}

/// NaN-propagating minimum.
#[inline(always)]
pub fn fmin<F: Float>(a: F, b: F) -> F {
    if a < b || a.is_nan() { a } else { b }
}

/// Float unary functions, in the compute type.
pub mod float_fn {
    use super::Float;

    /// `1 / (1 + e^-x)`.
    #[inline(always)]
    pub fn sigmoid<F: Float>(x: F) -> F {
        F::ONE / (F::ONE + (-x).exp())
    }

    /// The exact (erf) GELU: `x · ½ · (1 + erf(x / √2))`.
    #[inline(always)]
    pub fn gelu<F: Float>(x: F) -> F {
        let half = F::from_f64(0.5);
        let inv_sqrt2 = F::from_f64(std::f64::consts::FRAC_1_SQRT_2);
        x * half * (F::ONE + (x * inv_sqrt2).erf())
    }

    /// `max(x, 0)`, NaN kept.
    #[inline(always)]
    pub fn relu<F: Float>(x: F) -> F {
        if x < F::ZERO { F::ZERO } else { x }
    }

    /// -1, 0 or 1; ±0 and NaN are returned as they are.
    #[inline(always)]
    pub fn sign<F: Float>(x: F) -> F {
        if x > F::ZERO {
            F::ONE
        } else if x < F::ZERO {
            -F::ONE
        } else {
            x
        }
    }

    /// `x · sigmoid(x)`.
    #[inline(always)]
    pub fn silu<F: Float>(x: F) -> F {
        x / (F::ONE + (-x).exp())
    }

    /// `log1p(e^x)`, and `x` itself above 20 (PyTorch's threshold).
    #[inline(always)]
    pub fn softplus<F: Float>(x: F) -> F {
        if x > F::from_f64(20.0) { x } else { x.exp().ln_1p() }
    }
}

impl<T: Real> Arith for T {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        T::store(a.load() + b.load())
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        T::store(a.load() - b.load())
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        T::store(a.load() * b.load())
    }
    #[inline(always)]
    fn div(a: Self, b: Self) -> Self {
        T::store(a.load() / b.load())
    }
    #[inline(always)]
    fn pow(a: Self, b: Self) -> Self {
        T::store(a.load().powf(b.load()))
    }
    #[inline(always)]
    fn maximum(a: Self, b: Self) -> Self {
        T::store(fmax(a.load(), b.load()))
    }
    #[inline(always)]
    fn minimum(a: Self, b: Self) -> Self {
        T::store(fmin(a.load(), b.load()))
    }
    #[inline(always)]
    fn neg(x: Self) -> Self {
        T::store(-x.load())
    }
    #[inline(always)]
    fn abs(x: Self) -> Self {
        T::store(x.load().abs())
    }
    #[inline(always)]
    fn relu(x: Self) -> Self {
        T::store(float_fn::relu(x.load()))
    }
}

/// `base ^ exp` for integers, wrapping, with a 64-bit exponent (square and multiply).
#[inline]
fn wrapping_pow_u64<I: Copy>(mut base: I, mut exp: u64, one: I, mul: impl Fn(I, I) -> I) -> I {
    let mut acc = one;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = mul(acc, base);
        }
        exp >>= 1;
        if exp > 0 {
            base = mul(base, base);
        }
    }
    acc
}

macro_rules! signed_impl {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn sub(a: Self, b: Self) -> Self {
                a.wrapping_sub(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn div(a: Self, b: Self) -> Self {
                if b == 0 { 0 } else { a.wrapping_div(b) }
            }
            #[inline(always)]
            fn pow(a: Self, b: Self) -> Self {
                if b < 0 {
                    match a {
                        1 => 1,
                        -1 => {
                            if b % 2 == 0 {
                                1
                            } else {
                                -1
                            }
                        }
                        _ => 0,
                    }
                } else {
                    wrapping_pow_u64(a, b as u64, 1, <$t>::wrapping_mul)
                }
            }
            #[inline(always)]
            fn maximum(a: Self, b: Self) -> Self {
                a.max(b)
            }
            #[inline(always)]
            fn minimum(a: Self, b: Self) -> Self {
                a.min(b)
            }
            #[inline(always)]
            fn neg(x: Self) -> Self {
                x.wrapping_neg()
            }
            #[inline(always)]
            fn abs(x: Self) -> Self {
                x.wrapping_abs()
            }
            #[inline(always)]
            fn relu(x: Self) -> Self {
                x.max(0)
            }
        }
    };
}

signed_impl!(i32);
signed_impl!(i64);

impl Arith for u8 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        a.wrapping_sub(b)
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a.wrapping_mul(b)
    }
    #[inline(always)]
    fn div(a: Self, b: Self) -> Self {
        a.checked_div(b).unwrap_or(0)
    }
    #[inline(always)]
    fn pow(a: Self, b: Self) -> Self {
        a.wrapping_pow(b as u32)
    }
    #[inline(always)]
    fn maximum(a: Self, b: Self) -> Self {
        a.max(b)
    }
    #[inline(always)]
    fn minimum(a: Self, b: Self) -> Self {
        a.min(b)
    }
    #[inline(always)]
    fn neg(x: Self) -> Self {
        x.wrapping_neg()
    }
    #[inline(always)]
    fn abs(x: Self) -> Self {
        x
    }
    #[inline(always)]
    fn relu(x: Self) -> Self {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics() {
        assert_eq!(<i32 as Arith>::add(i32::MAX, 1), i32::MIN);
        assert_eq!(<i32 as Arith>::div(7, 0), 0);
        assert_eq!(<i32 as Arith>::div(-7, 2), -3);
        assert_eq!(<i32 as Arith>::div(i32::MIN, -1), i32::MIN);
        assert_eq!(<i64 as Arith>::neg(i64::MIN), i64::MIN);
        assert_eq!(<i64 as Arith>::abs(i64::MIN), i64::MIN);
        assert_eq!(<i64 as Arith>::pow(3, 4), 81);
        assert_eq!(<i64 as Arith>::pow(2, 64), 0);
        assert_eq!(<i64 as Arith>::pow(0, 0), 1);
        assert_eq!(<i32 as Arith>::pow(2, -1), 0);
        assert_eq!(<i32 as Arith>::pow(1, -5), 1);
        assert_eq!(<i32 as Arith>::pow(-1, -3), -1);
        assert_eq!(<i32 as Arith>::pow(-1, -4), 1);
        assert_eq!(<i32 as Arith>::pow(3, 21), 3i32.wrapping_pow(21));
        assert_eq!(<u8 as Arith>::sub(1, 2), 255);
        assert_eq!(<u8 as Arith>::div(9, 0), 0);
        assert_eq!(<u8 as Arith>::pow(2, 9), 0);
        assert_eq!(<u8 as Arith>::neg(1), 255);
        assert_eq!(<i32 as Arith>::relu(-4), 0);
    }

    #[test]
    fn float_semantics() {
        assert!(<f32 as Arith>::maximum(f32::NAN, 1.0).is_nan());
        assert!(<f32 as Arith>::maximum(1.0, f32::NAN).is_nan());
        assert!(<f64 as Arith>::minimum(f64::NAN, 1.0).is_nan());
        assert!(<f64 as Arith>::minimum(1.0, f64::NAN).is_nan());
        assert_eq!(<f32 as Arith>::maximum(-1.0, 2.0), 2.0);
        assert!(<f32 as Arith>::relu(f32::NAN).is_nan());
        // f16 rounds once: 1 + 2^-11 is a tie that rounds to even (1.0) in f16.
        let tiny = f16::from_f32(2f32.powi(-11));
        assert_eq!(<f16 as Arith>::add(f16::ONE, tiny), f16::ONE);
        assert!((float_fn::gelu(1.0f64) - 0.8413447460685429).abs() < 1e-12);
        assert!((float_fn::sigmoid(0.0f32) - 0.5).abs() < 1e-7);
    }

    #[test]
    fn bool8_reads_any_byte() {
        assert!(Bool8(7).get());
        assert_eq!(Bool8(7), Bool8(1));
        assert!(Bool8(0) < Bool8(2));
    }
}
