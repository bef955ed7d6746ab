//! Running loops with the widest vector instructions the processor has, and the branch-free
//! vectorisable f32 transcendental functions ([`vmath`]).
//!
//! [`simd`] runs a closure compiled for AVX-512 or AVX2+FMA when the processor has them (a
//! function with `#[target_feature]` into which the closure inlines), else for the baseline.
//! The generic float kernels reach `vmath`'s `exp` and `tanh` as [`exp_f32`] and [`tanh_f32`].

pub mod vmath;

pub use vmath::{exp as exp_f32, tanh as tanh_f32};

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
