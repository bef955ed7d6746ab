//! `Kernel::NormBackward`: the gradients of layer norm and RMS norm in one pass over the rows,
//! in f32 (f64 for f64).
//!
//! Each row of the forward's input and the incoming gradient is loaded once, side by side
//! ([`crate::rows`]); its statistics are recomputed as the forward computes them, its input
//! gradient is stored once, and, when the weight or bias gradient is wanted, the row's terms
//! `g·x̂` and `g` are added into per-chunk partial sums ([`zip_rows_chunked`]). The chunks are
//! fixed by the shape (at most [`MAX_CHUNKS`], each at least [`CHUNK_MIN_ELEMENTS`] elements),
//! run in parallel, and their partials are summed in chunk order at the end: the gradients are
//! the same whatever the thread count or timing.

use cartage_core::{Device, Error, NormBackwardArgs, NormKind, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::lane_sum;
use crate::map::base;
use crate::rows::{zip_rows, zip_rows_chunked};
use crate::strided::CHUNK_MIN_ELEMENTS;

/// The most chunks of rows whose partial sums are kept: the partials take at most
/// `MAX_CHUNKS × 2 × D` compute values.
const MAX_CHUNKS: usize = 64;

/// `Kernel::NormBackward`.
pub fn norm_backward(args: &NormBackwardArgs) -> Result<()> {
    with_float!(args.input.dtype, T => {
        // SAFETY: launch checked the kernel (shapes, dtypes, bounds, every output apart).
        unsafe { norm_backward_typed::<T>(args) };
        Ok(())
    }, else Err(Error::unsupported(
        format!("{}_backward", args.kind.name()),
        args.input.dtype,
        Device::cpu(),
        "defined for floats",
    )))
}

/// The 1-D view `arg` widened to the compute type.
///
/// # Safety
/// `arg` is a checked 1-D view of `T` elements.
unsafe fn load_line<T: Real>(arg: &TensorArg) -> Vec<T::C> {
    let (n, stride) = (arg.layout.shape()[0], arg.layout.strides()[0]);
    let p = base::<T>(arg);
    // SAFETY: positions `k < n` of the checked 1-D view lie inside its buffer.
    (0..n).map(|k| unsafe { *p.add(k * stride) }.load()).collect()
}

/// Store `values` into the 1-D view `arg`, each rounded once.
///
/// # Safety
/// `arg` is a checked, writable 1-D view of `T` elements of `values.len()`, apart from every
/// other operand.
unsafe fn store_line<T: Real>(values: &[T::C], arg: &TensorArg) {
    let stride = arg.layout.strides()[0];
    let p = base::<T>(arg);
    for (k, &v) in values.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { *p.add(k * stride) = T::store(v) };
    }
}

/// # Safety
/// `launch` checked the kernel; `T` is the storage type of every operand.
unsafe fn norm_backward_typed<T: Real>(a: &NormBackwardArgs) {
    // SAFETY: forwarded.
    unsafe {
        match a.kind {
            // Function items: statically dispatched, and `#[inline(always)]` into the row pass.
            NormKind::Layer => run::<T>(a, layer_stats),
            NormKind::Rms => run::<T>(a, rms_stats),
        }
    }
}

/// The pass over the rows with `stats` as the row statistics of the kind.
///
/// # Safety
/// As [`norm_backward_typed`].
unsafe fn run<T: Real>(
    a: &NormBackwardArgs,
    stats: impl Fn(&[T::C], &[T::C], Option<&[T::C]>, T::C) -> RowStats<T::C> + Sync,
) {
    // SAFETY: `validate` checked the weight as a 1-D view of the rows' length.
    let weight: Option<Vec<T::C>> = a.weight.as_ref().map(|w| unsafe { load_line::<T>(w) });
    let (w, eps) = (weight.as_deref(), T::C::from_f64(a.eps));
    let dim = a.input.layout.rank() - 1;
    let (input, grad, out) = (&a.input, &a.grad, &a.grad_input);
    if a.grad_weight.is_none() && a.grad_bias.is_none() {
        // SAFETY: forwarded; `validate` made the weight as long as the rows.
        unsafe {
            zip_rows::<T>(
                input,
                grad,
                dim,
                out,
                #[inline(always)]
                |x, g| {
                    let s = stats(x, g, w, eps);
                    write_row(x, g, w, &s);
                },
            )
        };
        return;
    }
    let n = input.layout.shape()[dim];
    let rows = input.layout.numel().checked_div(n).unwrap_or(0);
    let chunk_rows = rows
        .div_ceil(MAX_CHUNKS)
        .max(CHUNK_MIN_ELEMENTS.div_ceil(n.max(1)))
        .max(1);
    let (want_w, want_b) = (a.grad_weight.is_some(), a.grad_bias.is_some());
    let init = || Partials {
        w: vec![T::C::ZERO; if want_w { n } else { 0 }],
        b: vec![T::C::ZERO; if want_b { n } else { 0 }],
    };
    // SAFETY: forwarded; `validate` made the weight as long as the rows.
    let chunks = unsafe {
        zip_rows_chunked::<T, Partials<T::C>>(
            input,
            grad,
            dim,
            out,
            chunk_rows,
            init,
            #[inline(always)]
            |acc, x, g| {
                let s = stats(x, g, w, eps);
                acc.add_row(x, g, &s);
                write_row(x, g, w, &s);
            },
        )
    };
    let total = chunks.into_iter().fold(init(), |mut total, c| {
        total.add(&c);
        total
    });
    // SAFETY: `validate` checked each gradient as a writable 1-D view of the rows' length,
    // apart from every other operand.
    unsafe {
        if let Some(gw) = &a.grad_weight {
            store_line::<T>(&total.w, gw);
        }
        if let Some(gb) = &a.grad_bias {
            store_line::<T>(&total.b, gb);
        }
    }
}

/// Per-column sums of `g·x̂` (`w`) and `g` (`b`) over some rows; empty when not wanted.
struct Partials<F> {
    w: Vec<F>,
    b: Vec<F>,
}

impl<F: Float> Partials<F> {
    /// Add one row's terms (before its buffer `x` is overwritten by the input gradient).
    #[inline(always)]
    fn add_row(&mut self, x: &[F], g: &[F], s: &RowStats<F>) {
        for ((acc, &xk), &gk) in self.w.iter_mut().zip(x).zip(g) {
            *acc = *acc + gk * ((xk - s.mean) * s.rstd);
        }
        for (acc, &gk) in self.b.iter_mut().zip(g) {
            *acc = *acc + gk;
        }
    }

    /// Add another chunk's sums.
    fn add(&mut self, other: &Partials<F>) {
        for (acc, &v) in self.w.iter_mut().zip(&other.w) {
            *acc = *acc + v;
        }
        for (acc, &v) in self.b.iter_mut().zip(&other.b) {
            *acc = *acc + v;
        }
    }
}

/// A row's statistics: `x̂ = (x − mean)·rstd`; `mean_g = mean(ĝ)` (0 for RMS norm) and
/// `mean_gx = mean(ĝ·x̂)`.
struct RowStats<F> {
    mean: F,
    rstd: F,
    mean_g: F,
    mean_gx: F,
}

/// `ĝ = g·w` at position `k`.
#[inline(always)]
fn scaled<F: Float>(g: &[F], w: Option<&[F]>, k: usize) -> F {
    match w {
        Some(w) => g[k] * w[k],
        None => g[k],
    }
}

/// Layer norm's statistics: the mean, then the centred variance, as the forward computes them.
#[inline(always)]
fn layer_stats<F: Float>(x: &[F], g: &[F], w: Option<&[F]>, eps: F) -> RowStats<F> {
    let n = F::from_usize(x.len());
    let mean = lane_sum(x, F::ZERO, |v| v) / n;
    let var = lane_sum(x, F::ZERO, |v| (v - mean) * (v - mean)) / n;
    let rstd = F::ONE / (var + eps).sqrt();
    let (mut sum_g, mut sum_gx) = (F::ZERO, F::ZERO);
    for (k, &xk) in x.iter().enumerate() {
        let gh = scaled(g, w, k);
        sum_g = sum_g + gh;
        sum_gx = sum_gx + gh * (xk - mean) * rstd;
    }
    RowStats {
        mean,
        rstd,
        mean_g: sum_g / n,
        mean_gx: sum_gx / n,
    }
}

/// RMS norm's statistics: the mean square; no centring.
#[inline(always)]
fn rms_stats<F: Float>(x: &[F], g: &[F], w: Option<&[F]>, eps: F) -> RowStats<F> {
    let n = F::from_usize(x.len());
    let rstd = F::ONE / (lane_sum(x, F::ZERO, |v| v * v) / n + eps).sqrt();
    let mut sum_gx = F::ZERO;
    for (k, &xk) in x.iter().enumerate() {
        sum_gx = sum_gx + scaled(g, w, k) * xk * rstd;
    }
    RowStats {
        mean: F::ZERO,
        rstd,
        mean_g: F::ZERO,
        mean_gx: sum_gx / n,
    }
}

/// The input gradient `r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))` (RMS norm: mean 0, mean(ĝ) 0), into `x`.
#[inline(always)]
fn write_row<F: Float>(x: &mut [F], g: &[F], w: Option<&[F]>, s: &RowStats<F>) {
    for (k, xk) in x.iter_mut().enumerate() {
        let xhat = (*xk - s.mean) * s.rstd;
        *xk = s.rstd * (scaled(g, w, k) - s.mean_g - xhat * s.mean_gx);
    }
}
