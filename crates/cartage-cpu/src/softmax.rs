//! `Kernel::Softmax`: softmax or log-softmax along one dimension, max-subtracted, computed in
//! the compute type (f32 for f16/bf16) with the normaliser accumulated in f64. Each row is
//! loaded once ([`crate::rows`]): max, then `e^(x - max)` kept in the row buffer while its sum
//! accumulates, then one scale (or, for log-softmax, one subtraction) on the way out.

use cartage_core::{Device, Error, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::Float;
use crate::fast_math::{lane_max, lane_sum};
use crate::rows::map_rows;

/// `Kernel::Softmax`.
#[allow(
    clippy::redundant_closure,
    reason = "an inline(always) closure is inlined into the row pass; a function item's shim may not be"
)]
pub fn softmax(input: &TensorArg, dim: usize, log: bool, out: &TensorArg) -> Result<()> {
    with_float!(input.dtype, T => {
        // SAFETY: launch checked the kernel (same shape and float dtype, `dim` in range).
        unsafe {
            // Closures marked `inline(always)`, not the bare functions: a function item's
            // `Fn::call` shim may stay out of line, compiled without the wide instructions.
            if log {
                map_rows::<T>(input, dim, out, #[inline(always)] |row| log_softmax_row(row))
            } else {
                map_rows::<T>(input, dim, out, #[inline(always)] |row| softmax_row(row))
            }
        };
        Ok(())
    }, else Err(Error::unsupported("softmax", input.dtype, Device::cpu(), "softmax is defined for floats")))
}

/// Softmax of one row, in place.
#[inline(always)]
fn softmax_row<F: Float>(row: &mut [F]) {
    let max = lane_max(row);
    for v in row.iter_mut() {
        *v = (*v - max).exp();
    }
    let total = lane_sum(row, 0f64, |v| v.to_f64());
    let scale = F::from_f64(1.0 / total);
    for v in row.iter_mut() {
        *v = *v * scale;
    }
}

/// Log-softmax of one row, in place.
#[inline(always)]
fn log_softmax_row<F: Float>(row: &mut [F]) {
    let max = lane_max(row);
    let total = lane_sum(row, 0f64, |v| (v - max).exp().to_f64());
    let log_total = F::from_f64(total.ln());
    for v in row.iter_mut() {
        *v = (*v - max) - log_total;
    }
}
