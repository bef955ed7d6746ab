//! `Kernel::SoftmaxBackward` and `Kernel::NormBackward`: one pass per row over the forward's
//! values and the incoming gradient side by side ([`crate::rows::zip_rows`]), in f32 (f64 for
//! f64), each row's input gradient stored once.

use cartage_core::{Device, Error, NormKind, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::lane_sum;
use crate::map::base;
use crate::rows::zip_rows;

/// `Kernel::SoftmaxBackward`.
#[allow(
    clippy::redundant_closure,
    reason = "an inline(always) closure is inlined into the row pass; a function item's shim may not be"
)]
pub fn softmax_backward(output: &TensorArg, grad: &TensorArg, dim: usize, log: bool, out: &TensorArg) -> Result<()> {
    with_float!(output.dtype, T => {
        // SAFETY: launch checked the kernel (one shape and float dtype, `dim` in range, `out`
        // apart from both inputs).
        unsafe {
            if log {
                zip_rows::<T>(output, grad, dim, out, #[inline(always)] |y, g| log_softmax_row(y, g))
            } else {
                zip_rows::<T>(output, grad, dim, out, #[inline(always)] |y, g| softmax_row(y, g))
            }
        };
        Ok(())
    }, else Err(Error::unsupported("softmax_backward", output.dtype, Device::cpu(), "defined for floats")))
}

/// `Σ a·b` over two rows, in lanes.
#[inline(always)]
fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    const LANES: usize = 8;
    let mut acc = [F::ZERO; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..LANES {
            acc[k] = acc[k] + x[k] * y[k];
        }
    }
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .fold(F::ZERO, |s, (&x, &y)| s + x * y);
    acc.iter().fold(tail, |s, &v| s + v)
}

/// `y·(g − Σ g·y)`, into `y`.
#[inline(always)]
fn softmax_row<F: Float>(y: &mut [F], g: &[F]) {
    let inner = dot(y, g);
    for (y, &g) in y.iter_mut().zip(g) {
        *y = *y * (g - inner);
    }
}

/// `g − exp(y)·Σ g`, into `y` (the log-softmax values).
#[inline(always)]
fn log_softmax_row<F: Float>(y: &mut [F], g: &[F]) {
    let total = lane_sum(g, F::ZERO, |v| v);
    for (y, &g) in y.iter_mut().zip(g) {
        *y = g - y.exp() * total;
    }
}

/// `Kernel::NormBackward`.
pub fn norm_backward(
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    grad: &TensorArg,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    with_float!(input.dtype, T => {
        // SAFETY: launch checked the kernel (shapes, dtypes, bounds, `out` apart).
        unsafe { norm_backward_typed::<T>(kind, input, weight, grad, eps, out) };
        Ok(())
    }, else Err(Error::unsupported("norm_backward", input.dtype, Device::cpu(), "defined for floats")))
}

/// # Safety
/// `launch` checked the kernel; `T` is the storage type of every operand.
unsafe fn norm_backward_typed<T: Real>(
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    grad: &TensorArg,
    eps: f64,
    out: &TensorArg,
) {
    let weight: Option<Vec<T::C>> = weight.map(|w| {
        let (n, stride) = (w.layout.shape()[0], w.layout.strides()[0]);
        let p = base::<T>(w);
        // SAFETY: positions `k < n` of the checked 1-D view lie inside its buffer.
        (0..n).map(|k| unsafe { *p.add(k * stride) }.load()).collect()
    });
    let (w, eps) = (weight.as_deref(), T::C::from_f64(eps));
    let dim = input.layout.rank() - 1;
    // SAFETY: forwarded; `validate` made the weight as long as the rows.
    unsafe {
        match kind {
            NormKind::Layer => zip_rows::<T>(
                input,
                grad,
                dim,
                out,
                #[inline(always)]
                |x, g| layer_row(x, g, w, eps),
            ),
            NormKind::Rms => zip_rows::<T>(
                input,
                grad,
                dim,
                out,
                #[inline(always)]
                |x, g| rms_row(x, g, w, eps),
            ),
        }
    }
}

/// `ĝ = g·w` at position `k`.
#[inline(always)]
fn scaled<F: Float>(g: &[F], w: Option<&[F]>, k: usize) -> F {
    match w {
        Some(w) => g[k] * w[k],
        None => g[k],
    }
}

/// Layer norm's input gradient `r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))`, into `x`.
#[inline(always)]
fn layer_row<F: Float>(x: &mut [F], g: &[F], w: Option<&[F]>, eps: F) {
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
    let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
    for (k, xk) in x.iter_mut().enumerate() {
        let xhat = (*xk - mean) * rstd;
        *xk = rstd * (scaled(g, w, k) - mean_g - xhat * mean_gx);
    }
}

/// RMS norm's input gradient `r·(ĝ − x̂·mean(ĝ·x̂))`, into `x`.
#[inline(always)]
fn rms_row<F: Float>(x: &mut [F], g: &[F], w: Option<&[F]>, eps: F) {
    let n = F::from_usize(x.len());
    let rstd = F::ONE / (lane_sum(x, F::ZERO, |v| v * v) / n + eps).sqrt();
    let mut sum_gx = F::ZERO;
    for (k, &xk) in x.iter().enumerate() {
        sum_gx = sum_gx + scaled(g, w, k) * xk * rstd;
    }
    let mean_gx = sum_gx / n;
    for (k, xk) in x.iter_mut().enumerate() {
        let xhat = *xk * rstd;
        *xk = rstd * (scaled(g, w, k) - xhat * mean_gx);
    }
}
