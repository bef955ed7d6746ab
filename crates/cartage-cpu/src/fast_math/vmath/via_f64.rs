//! f32 functions computed in f64 and rounded once: [`erf`], [`gelu`] and [`softplus`].
//!
//! Their f32 inputs widen exactly and every intermediate has at most a few 1e-9 of relative
//! error (the polynomials are minimax fits for that), so the one rounding to f32 at the end is
//! nearly all that shows: within 0.6 ulp. The pieces, all branch-free:
//! - `exp` in f64 ([`exp_f64`]): Cody–Waite reduction, a degree-6 polynomial, `2^n` from the
//!   bits; 0 below -745 (so `e^-inf = 0`).
//! - `erf(u) = u · p(u²)` for `u < 1`, and `erfc(u) = t · e^{-u² + q(t)}` with `t = 2/(2 + u)`
//!   for `u ≥ 1` (the form of Numerical Recipes' `erfc`, refitted): relative accuracy however
//!   small `erfc` gets, which the negative side of GELU needs (`Φ(x) = erfc(-x/√2)/2`).
//! - `log1p(z) = 2·atanh(s)`, `s = z/(2 + z)`, as an odd polynomial in `s`.

/// 1.5 · 2^52: adding it rounds an f64 of magnitude below 2^51 to an integer.
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
/// ln 2 in two parts (fdlibm's): `n · LN2_HI` is exact for the `n` used here.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// `e^y` in f64 to about 3e-9 relative, for `y ≤ 1` (the callers' range); NaN propagates
/// and `y < -745` gives 0.
#[inline(always)]
fn exp_f64(y: f64) -> f64 {
    let yc = if y < -700.0 { -700.0 } else { y };
    let t = yc * std::f64::consts::LOG2_E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = yc - n * LN2_HI - n * LN2_LO;
    // e^r = 1 + r + r² · p(r) on [-ln2/2, ln2/2], minimax for relative error (3e-9).
    let mut p = 1.381_459_733_487_910_2e-3;
    p = p * r + 8.368_716_998_642_28e-3;
    p = p * r + 4.166_838_807_274_32e-2;
    p = p * r + 1.666_652_063_043_066_5e-1;
    p = p * r + 4.999_999_344_765_964_6e-1;
    let m = p * (r * r) + r + 1.0;
    // n ∈ [-1010, 2]: 2^n is a normal f64 built from its exponent bits.
    let ni = (t.to_bits() as i64).wrapping_sub(ROUND_MAGIC.to_bits() as i64);
    let s = f64::from_bits((ni.wrapping_add(1023) as u64) << 52);
    if y < -745.0 { 0.0 } else { m * s }
}

/// `erf(u) / u` as a polynomial in `u²`, for `0 ≤ u ≤ 1`.
#[inline(always)]
fn erf_over_u(z: f64) -> f64 {
    // Minimax for relative error (1.2e-9).
    let mut p = 7.853_316_286_643_3e-5;
    p = p * z - 8.010_048_048_659_488e-4;
    p = p * z + 5.188_313_487_989_868e-3;
    p = p * z - 2.685_380_585_956_744_6e-2;
    p = p * z + 1.128_358_504_444_014_8e-1;
    p = p * z - 3.761_262_582_066_912e-1;
    p * z + 1.128_379_165_728_995_7
}

/// `erfc(u)` for `u ≥ 1` (and `+inf`, which gives 0): `t · e^{-u² + q(t)}`, `t = 2/(2 + u)`,
/// `q` fitted on `u ∈ [1, 11]` (absolute error 4e-9); beyond 11 `erfc` is below 1e-53, far
/// under f32's range, and `t` is taken at `min(u, 20)`.
#[inline(always)]
fn erfc_tail(u: f64) -> f64 {
    // t = 1 / d: an f32 division (twice the lanes of an f64 one) and one Newton step in f64,
    // which squares its relative error (1e-7 → 1e-14).
    let d = 1.0 + 0.5 * if u > 20.0 { 20.0 } else { u };
    let t0 = (1.0 / d as f32) as f64;
    let t = t0 + t0 * (1.0 - d * t0);
    let mut q = -2.463_683_481_992_99e-1;
    q = q * t + 6.658_678_777_261_392e-1;
    q = q * t - 4.831_063_791_272_007e-1;
    q = q * t - 3.774_583_607_159_183_5e-2;
    q = q * t - 8.741_445_153_773_65e-2;
    q = q * t + 7.632_113_597_866_097e-2;
    q = q * t + 3.769_188_777_595_893e-1;
    q = q * t + 9.997_808_251_839_413e-1;
    q = q * t - 1.265_502_577_690_384_3;
    t * exp_f64(q - u * u)
}

/// The error function: `u · p(u²)` below 1, `1 - erfc(|x|)` above, with x's sign; `erf(±inf)`
/// is ±1 and `erf(±0)` is ±0.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let a = x.abs();
    let small = x * erf_over_u(x * x);
    let big = (1.0 - erfc_tail(a)).copysign(x);
    // NaN fails the comparison and takes `big`, which is NaN.
    (if a < 1.0 { small } else { big }) as f32
}

/// The exact GELU `x · Φ(x)`, `Φ(x) = (1 + erf(x/√2)) / 2`: below zero as `erfc(|x|/√2) / 2`,
/// which keeps its relative accuracy in the tail where `1 + erf` would cancel. `gelu(-inf)`
/// is NaN (`-inf · 0`, as the formula gives), `gelu(+inf)` is +inf.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    let u = x.abs() * std::f64::consts::FRAC_1_SQRT_2;
    let erfc = if u < 1.0 {
        1.0 - u * erf_over_u(u * u)
    } else {
        erfc_tail(u)
    };
    let phi = if x < 0.0 { 0.5 * erfc } else { 1.0 - 0.5 * erfc };
    (x * phi) as f32
}

/// `log1p(z)` for `0 ≤ z ≤ 1`: `2s + s³ · p(s²)` with `s = z / (2 + z) ≤ 1/3`.
#[inline(always)]
fn log1p_unit(z: f64) -> f64 {
    let s = z / (2.0 + z);
    let w = s * s;
    // Minimax for relative error (1.1e-10).
    let mut p = 2.429_395_781_477_996_8e-1;
    p = p * w + 2.142_966_802_689_963_1e-1;
    p = p * w + 2.861_668_578_328_934e-1;
    p = p * w + 3.999_888_548_786_089_7e-1;
    p = p * w + 6.666_667_552_846_441e-1;
    2.0 * s + s * w * p
}

/// Above this, `softplus(x)` is `x` (PyTorch's threshold, `cartage_core::kernel`'s rule).
const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// `log1p(e^x)`, and `x` itself above 20: computed as `max(x, 0) + log1p(e^-|x|)`, which
/// neither overflows nor loses the tail (`softplus(x) ≈ e^x` far below zero).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    let xd = x as f64;
    let r = (if xd > 0.0 { xd } else { 0.0 }) + log1p_unit(exp_f64(-xd.abs()));
    if x > SOFTPLUS_THRESHOLD { x } else { r as f32 }
}
