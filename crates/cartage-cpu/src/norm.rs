//! `Kernel::Norm`: layer norm and RMS norm over the last dimension, in f32 (f64 for f64).
//!
//! Each row is loaded once into a compute-type buffer ([`crate::rows`]); the statistics
//! (mean, then the centred variance, or the mean square) are interleaved sums over that cached
//! buffer, and the normalised row is stored once. The optional weight and bias (1-D, the last
//! dimension's size, any stride) are widened to the compute type once per launch.

use cartage_core::{Device, Error, NormKind, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::lane_sum;
use crate::map::base;
use crate::rows::map_rows;

/// `Kernel::Norm`.
pub fn norm(
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    bias: Option<&TensorArg>,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    with_float!(input.dtype, T => {
        // SAFETY: launch checked the kernel (shapes, dtypes, bounds).
        unsafe { norm_typed::<T>(kind, input, weight, bias, eps, out) };
        Ok(())
    }, else Err(Error::unsupported(kind.name(), input.dtype, Device::cpu(), "norms are defined for floats")))
}

/// The elements of a 1-D operand in the compute type.
///
/// # Safety
/// `arg` is a checked 1-D operand of storage type `T`.
unsafe fn widen_1d<T: Real>(arg: &TensorArg) -> Vec<T::C> {
    let (n, stride) = (arg.layout.shape()[0], arg.layout.strides()[0]);
    let p = base::<T>(arg);
    // SAFETY: positions `k < n` of the view lie inside its buffer.
    (0..n).map(|k| unsafe { *p.add(k * stride) }.load()).collect()
}

/// # Safety
/// `launch` checked the kernel; `T` is the storage type of every operand.
unsafe fn norm_typed<T: Real>(
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    bias: Option<&TensorArg>,
    eps: f64,
    out: &TensorArg,
) {
    // SAFETY: forwarded.
    let (w, b) = unsafe { (weight.map(|a| widen_1d::<T>(a)), bias.map(|a| widen_1d::<T>(a))) };
    let dim = input.layout.rank() - 1;
    let eps = T::C::from_f64(eps);
    let (w, b) = (w.as_deref(), b.as_deref());
    // SAFETY: forwarded; `validate` made weight and bias as long as the rows.
    unsafe {
        match kind {
            NormKind::Layer => map_rows::<T>(
                input,
                dim,
                out,
                #[inline(always)]
                |_, row| layer_row(row, eps, w, b),
            ),
            NormKind::Rms => map_rows::<T>(
                input,
                dim,
                out,
                #[inline(always)]
                |_, row| rms_row(row, eps, w, b),
            ),
        }
    }
}

/// Scale by `rstd` (after subtracting `mean`), then the optional weight and bias, in place.
#[inline(always)]
fn finish<F: Float>(row: &mut [F], mean: F, rstd: F, w: Option<&[F]>, b: Option<&[F]>) {
    match (w, b) {
        (Some(w), Some(b)) => {
            for ((v, &w), &b) in row.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * rstd * w + b;
            }
        }
        (Some(w), None) => {
            for (v, &w) in row.iter_mut().zip(w) {
                *v = (*v - mean) * rstd * w;
            }
        }
        (None, Some(b)) => {
            for (v, &b) in row.iter_mut().zip(b) {
                *v = (*v - mean) * rstd + b;
            }
        }
        (None, None) => {
            for v in row.iter_mut() {
                *v = (*v - mean) * rstd;
            }
        }
    }
}

/// Layer norm of one row, in place (biased variance of the centred values).
#[inline(always)]
fn layer_row<F: Float>(row: &mut [F], eps: F, w: Option<&[F]>, b: Option<&[F]>) {
    let n = F::from_usize(row.len());
    let mean = lane_sum(row, F::ZERO, |v| v) / n;
    let var = lane_sum(row, F::ZERO, |v| (v - mean) * (v - mean)) / n;
    let rstd = F::ONE / (var + eps).sqrt();
    finish(row, mean, rstd, w, b);
}

/// RMS norm of one row, in place.
#[inline(always)]
fn rms_row<F: Float>(row: &mut [F], eps: F, w: Option<&[F]>, b: Option<&[F]>) {
    let n = F::from_usize(row.len());
    let mean_square = lane_sum(row, F::ZERO, |v| v * v) / n;
    let rstd = F::ONE / (mean_square + eps).sqrt();
    finish(row, F::ZERO, rstd, w, b);
}
