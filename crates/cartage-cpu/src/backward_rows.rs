//! `Kernel::SoftmaxBackward`: one pass per row over the forward's values and the incoming
//! gradient side by side ([`crate::rows::zip_rows`]), in f32 (f64 for f64), each row's input
//! gradient stored once. (`Kernel::NormBackward` is [`crate::norm_backward`].)

use cartage_core::{Device, Error, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::Float;
use crate::fast_math::lane_sum;
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
