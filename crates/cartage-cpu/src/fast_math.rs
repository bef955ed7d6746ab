//! Branch-free f32 math that LLVM vectorises, and running loops with the widest vector
//! instructions the processor has.
//!
//! [`exp_f32`] is Cody–Waite range reduction (`x = n·ln2 + r`, `|r| ≤ ln2/2`, `n` rounded with
//! the 1.5·2²³ trick), a degree-7 polynomial for `e^r`, and a scale by `2^n` applied as two
//! factors, so results in the subnormal range round once and overflow gives +inf. Every step is
//! a select, a multiply-add or an integer shift: a loop of it vectorises. Its error is within
//! 2 ulp (the unit tests sweep it against f64). NaN propagates, `exp(+inf) = +inf`,
//! `exp(-inf) = 0`.
//!
//! [`simd`] runs a closure compiled for AVX-512 or AVX2+FMA when the processor has them (a
//! function with `#[target_feature]` into which the closure inlines), else for the baseline.

/// Above this, `e^x` is +inf in f32 (ln(f32::MAX) ≈ 88.7228).
const EXP_HI: f32 = 88.8;
/// Below this, `e^x` rounds to 0 in f32 (ln(2^-150) ≈ -103.97).
const EXP_LO: f32 = -104.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two: `n · LN2_HI` is exact for |n| < 2^12.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds an f32 of magnitude below 2^22 to an integer (ties to even).
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x` in f32, within 2 ulp; branch-free (see the module docs).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // Comparisons with NaN are false: NaN passes both selects and propagates.
    let x = if x > EXP_HI { EXP_HI } else { x };
    let x = if x < EXP_LO { EXP_LO } else { x };
    let t = x * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    // e^r - 1 - r ≈ r² · p(r) on [-ln2/2, ln2/2] (Taylor-minimax, Cephes' expf coefficients).
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    // n as an integer: the low mantissa bits of t (n ∈ [-150, 129] after the clamp).
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let half = ni >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - half + 127) as u32) << 23);
    e * s1 * s2
}

/// `tanh x` with [`exp_f32`]: `sign(x) · (1 - 2 / (e^{2|x|} + 1))`, and an odd polynomial
/// below 0.625 where that form cancels.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let e = exp_f32(2.0 * a);
    let big = 1.0 - 2.0 / (e + 1.0);
    // Minimax of tanh on [0, 0.625] (Cephes tanhf): x + x³·q(x²).
    let z = x * x;
    let mut q = -5.704_988_7e-3_f32;
    q = q * z + 2.063_908_4e-2;
    q = q * z - 5.373_971_5e-2;
    q = q * z + 1.333_144_2e-1;
    q = q * z - 3.333_328_4e-1;
    let small = a + a * z * q;
    // tanh is odd: the value for |x| takes x's sign (so tanh(-0) = -0).
    (if a < 0.625 { small } else { big }).copysign(x)
}

/// The instruction sets [`simd`] picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Avx512,
    Avx2,
    Baseline,
}

#[inline]
fn level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static LEVEL: OnceLock<Level> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                Level::Avx512
            } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                Level::Avx2
            } else {
                Level::Baseline
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Level::Baseline
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
unsafe fn on_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Run `f` compiled for the widest vector instructions this processor has: `f` (and what it
/// inlines: write loops over slices with `#[inline(always)]` helpers) is inlined into a
/// function with those target features, so its loops vectorise at that width.
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw the processor report every feature `on_avx512` enables.
        Level::Avx512 => unsafe { on_avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw the processor report avx2 and fma.
        Level::Avx2 => unsafe { on_avx2(f) },
        _ => f(),
    }
}

/// Independent accumulators of [`lane_sum`] (a multiple of every vector width).
const SUM_LANES: usize = 16;

/// `Σ f(x)` over `xs` in `SUM_LANES` interleaved accumulators combined pairwise: a loop the
/// compiler vectorises (a single accumulator would be one serial dependency chain).
#[inline(always)]
pub fn lane_sum<X: Copy, A: Copy + std::ops::Add<Output = A>>(xs: &[X], zero: A, f: impl Fn(X) -> A) -> A {
    let mut acc = [zero; SUM_LANES];
    let mut chunks = xs.chunks_exact(SUM_LANES);
    for chunk in &mut chunks {
        for j in 0..SUM_LANES {
            acc[j] = acc[j] + f(chunk[j]);
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] = acc[j] + f(x);
    }
    let mut width = SUM_LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] = acc[j] + acc[j + width];
        }
    }
    acc[0]
}

/// The NaN-propagating maximum of `xs` (`-inf` when empty), in interleaved accumulators.
#[inline(always)]
pub fn lane_max<F: crate::elem::Float>(xs: &[F]) -> F {
    let mut acc = [F::NEG_INFINITY; SUM_LANES];
    let mut chunks = xs.chunks_exact(SUM_LANES);
    for chunk in &mut chunks {
        for j in 0..SUM_LANES {
            acc[j] = crate::elem::fmax(acc[j], chunk[j]);
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] = crate::elem::fmax(acc[j], x);
    }
    acc.iter().fold(F::NEG_INFINITY, |m, &a| crate::elem::fmax(m, a))
}
