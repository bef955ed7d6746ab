//! Branch-free f32 transcendental functions that LLVM vectorises, each within 2 ulp of the
//! correctly rounded result over the whole f32 range (the unit tests sweep them against f64).
//!
//! Every function is straight-line code: range reductions, polynomials evaluated by Horner's
//! rule, integer shifts on the bit patterns and selects in place of branches, so a loop that
//! calls one over a slice compiles to vector instructions at the width the caller runs at
//! ([`crate::fast_math::simd`]). Multiply-adds are written as a multiply and an add: Rust never
//! fuses them, so every instruction set computes the same bits and the strided (scalar) paths
//! agree with the dense (vector) ones.
//!
//! - [`exp`], [`ln`], [`tanh`], [`sigmoid`] and [`silu`] compute in f32, with care where the
//!   plain formula would cancel or lose the subnormal range.
//! - [`erf`], [`gelu`] and [`softplus`] ([`via_f64`]) compute in f64 and round once: their
//!   f32 forms need a product `u²` split in two words and an `erfc` with relative accuracy
//!   deep into the tail, which f64 gives for the price of lanes half as wide.
//!
//! Special values follow `cartage_core::kernel` and the scalar formulas they replace: NaN
//! propagates; `exp(±inf)` is `+inf`/`0`; `ln` of a negative is NaN, of ±0 is `-inf`;
//! `tanh(±inf)` and `erf(±inf)` are ±1; `sigmoid(±inf)` is 1/0; `silu(-inf)` and `gelu(-inf)`
//! are NaN (`-inf · 0`, as the formulas give); `softplus` is `x` above 20. Signed zeros keep
//! their sign through the odd functions.

mod via_f64;

pub use via_f64::{erf, gelu, softplus};

/// [`exp_parts`] clamps its argument to `[-EXP_LIMIT, EXP_LIMIT]`: `e^x` is +inf above 88.73
/// and rounds to 0 below -103.98, and `x · e^x` ([`silu`]) reaches 0 near -109; `2^n` for the
/// `|n| ≤ 174` this gives still splits into two normal factors ([`scale`]).
const EXP_LIMIT: f32 = 120.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two: `n · LN2_HI` is exact for |n| < 2^15 (LN2_HI has 9 significant bits).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds an f32 of magnitude below 2^22 to an integer (ties to even).
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x = m · 2^n` with `m` in `[0.7, 1.42]`: the exponent not yet applied, so a caller can
/// multiply `m` first and round once when it applies `2^n` ([`scale`]). `n` is in
/// `[-174, 174]`; NaN gives a NaN `m`.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, i32) {
    // Comparisons with NaN are false: NaN passes both selects and propagates.
    let x = if x > EXP_LIMIT { EXP_LIMIT } else { x };
    let x = if x < -EXP_LIMIT { -EXP_LIMIT } else { x };
    exp_reduced(x)
}

/// [`exp_parts`] for `|x| ≤ EXP_LIMIT` (or NaN), without the clamps.
#[inline(always)]
fn exp_reduced(x: f32) -> (f32, i32) {
    let t = x * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    // Cody–Waite: `x - n·ln2` in two steps, |r| ≤ ln2/2.
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    // e^r - 1 - r ≈ r² · p(r) on [-ln2/2, ln2/2] (Taylor-minimax, Cephes' expf coefficients).
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let m = p * (r * r) + r + 1.0;
    // n as an integer: the low mantissa bits of t.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    (m, ni)
}

/// `2^n` for `n` in `[-126, 127]`, from its exponent bits.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// `v · 2^n` for `n` in `[-252, 254]`, rounded once: two factors, each a normal power of two,
/// so the first product is exact and only the second can round (into the subnormal range) or
/// overflow.
#[inline(always)]
fn scale(v: f32, n: i32) -> f32 {
    let half = n >> 1;
    v * pow2(half) * pow2(n.wrapping_sub(half))
}

/// `e^x`: Cody–Waite range reduction (`x = n·ln2 + r`, `|r| ≤ ln2/2`, `n` rounded with the
/// 1.5·2²³ trick), a degree-7 polynomial for `e^r`, and the scale by `2^n` applied as two
/// factors, so results in the subnormal range round once and overflow gives +inf.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let (m, n) = exp_parts(x);
    scale(m, n)
}

/// The bits of √½: mantissas are reduced to `[√½, √2)`.
const SQRT_HALF_BITS: i32 = 0x3f35_04f3;

/// The natural logarithm: `x = m · 2^e` with `m` in `[√½, √2)` read from the bits (subnormals
/// scaled by 2^25 first), then `ln(1 + f)` for `f = m - 1` (exact) as `f - f²/2 + f³·p(f)`
/// (Cephes' logf polynomial), and `e · ln 2` added in two parts.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    let subnormal = x < f32::MIN_POSITIVE;
    let xs = if subnormal { x * 33_554_432.0 } else { x };
    // Offsetting the bits by those of √½ puts the exponent step at √½ rather than at 1.
    let ix = (xs.to_bits() as i32).wrapping_sub(SQRT_HALF_BITS);
    let e = (ix >> 23) - if subnormal { 25 } else { 0 };
    let m = f32::from_bits(((ix & 0x007f_ffff) + SQRT_HALF_BITS) as u32);
    let f = m - 1.0;
    let z = f * f;
    let mut p = 7.037_683_6e-2_f32;
    p = p * f - 1.151_461_e-1;
    p = p * f + 1.167_699_9e-1;
    p = p * f - 1.242_014_1e-1;
    p = p * f + 1.424_932_3e-1;
    p = p * f - 1.666_805_8e-1;
    p = p * f + 2.000_071_5e-1;
    p = p * f - 2.499_999_4e-1;
    p = p * f + 3.333_333e-1;
    let ef = e as f32;
    let y = f * z * p + ef * LN2_LO - 0.5 * z;
    let r = f + y + ef * LN2_HI;
    // The edges: ln(+inf) = +inf, ln(±0) = -inf, ln(negative or NaN) = NaN.
    let r = if x == f32::INFINITY { x } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    if x < 0.0 || x.is_nan() { f32::NAN } else { r }
}

/// Below this, [`tanh`] uses its odd polynomial; above, `1 - 2 / (e^{2|x|} + 1)`, whose error
/// shrinks as `tanh` nears 1.
const TANH_POLY_MAX: f32 = 1.0;

/// The hyperbolic tangent: `x + x³·q(x²)` below 1 (a minimax fit for relative error), and
/// `sign(x) · (1 - 2 / (e^{2|x|} + 1))` above; `±inf` gives ±1 and the sign of zero is kept.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    // Above 9.5, tanh rounds to 1 (1 - 2e^-19 is within half an ulp of it): clamped there,
    // e^{2a} ≤ e^19 needs neither [`exp`]'s clamps nor its two-factor scale.
    let (m, n) = exp_reduced(2.0 * if a > 9.5 { 9.5 } else { a });
    let e = m * pow2(n);
    let big = 1.0 - 2.0 / (e + 1.0);
    let z = a * a;
    let mut q = -3.584_521e-4_f32;
    q = q * z + 2.301_365e-3;
    q = q * z - 7.946_108e-3;
    q = q * z + 2.148_665_9e-2;
    q = q * z - 5.387_98e-2;
    q = q * z + 1.333_234_5e-1;
    q = q * z - 3.333_329_6e-1;
    let small = a + a * z * q;
    // NaN fails the comparison and takes `big`, which is NaN.
    (if a < TANH_POLY_MAX { small } else { big }).copysign(x)
}

/// `1 + e^-x = d · 2^k`, without overflow: for `x ≥ 0` it is `1 + z` (`k = 0`) with
/// `z = e^-x ≤ 1`; below zero `e^-x = m · 2^n` and `1 + e^-x = (m + 2^-n) · 2^n`, where `2^-n`
/// is exact (and negligible beyond `n = 126`). The logistic functions divide by `d` and apply
/// `2^-k` last, one rounding fewer than `z / (1 + z)`, and the tail keeps its relative accuracy
/// down through the subnormals.
#[inline(always)]
fn one_plus_exp_neg(x: f32) -> (f32, i32) {
    let (m, n) = exp_parts(-x);
    // Only read for x < 0, where 0 ≤ n ≤ 174.
    let pow = if n <= 126 { pow2(n.wrapping_neg()) } else { 0.0 };
    // For x ≥ 0, `z = m · 2^n` matters to `1 + z` only above 2^-25, so a `2^n` floored at
    // 2^-126 (one factor, no subnormals) gives the same sum.
    let z = m * pow2(if n < -126 { -126 } else { n });
    if x < 0.0 { (m + pow, n) } else { (1.0 + z, 0) }
}

/// The logistic function `1 / (1 + e^-x)` (see [`one_plus_exp_neg`]); `sigmoid(+inf) = 1`,
/// `sigmoid(-inf) = 0`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let (d, k) = one_plus_exp_neg(x);
    scale(1.0 / d, -k)
}

/// `x · sigmoid(x) = x / (1 + e^-x)` (see [`one_plus_exp_neg`]); -0 below `-EXP_LIMIT`, and
/// `silu(-inf)` is NaN, as `-inf / (1 + e^inf)` is.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    let (d, k) = one_plus_exp_neg(x);
    let r = scale(x / d, -k);
    let r = if x < -EXP_LIMIT { -0.0 } else { r };
    if x == f32::NEG_INFINITY { f32::NAN } else { r }
}

#[cfg(test)]
mod tests;
