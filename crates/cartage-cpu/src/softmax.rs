//! `Kernel::Softmax`: softmax or log-softmax along one dimension, max-subtracted, computed in
//! the compute type (f32 for f16/bf16) with the normaliser accumulated in f64. Each row is
//! loaded once ([`crate::rows`]) into a buffer that stays in cache: max, then `e^(x - max)`
//! kept in the buffer, their sum, then one scale (or, for log-softmax, one subtraction) on the
//! way out. Every pass is a loop compiled for the widest vector instructions, f32's `exp` is
//! [`crate::fast_math::vmath::exp`] (within 2 ulp), and sums run in 16 interleaved f64 lanes.
//! A causal softmax normalises each row's leading part and fills the masked rest.

use cartage_core::{Device, Error, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::Float;
use crate::rows::map_rows;

/// `Kernel::Softmax`.
#[allow(
    clippy::redundant_closure,
    reason = "an inline(always) closure is inlined into the row pass; a function item's shim may not be"
)]
pub fn softmax(input: &TensorArg, dim: usize, log: bool, causal: bool, out: &TensorArg) -> Result<()> {
    // Causal: row `index` is row `index % L` of its [L, S] matrix and keeps its first
    // `index % L + 1` elements (validate made `dim` the last of at least two).
    let shape = input.layout.shape();
    let period = if causal { shape[shape.len() - 2].max(1) } else { 1 };
    with_float!(input.dtype, T => {
        // SAFETY: launch checked the kernel (same shape and float dtype, `dim` in range).
        unsafe {
            // Closures marked `inline(always)`, not the bare functions: a function item's
            // `Fn::call` shim may stay out of line, compiled without the wide instructions.
            match (log, causal) {
                (true, false) => map_rows::<T>(input, dim, out, #[inline(always)] |_, row| log_softmax_row(row)),
                (false, false) => map_rows::<T>(input, dim, out, #[inline(always)] |_, row| softmax_row(row)),
                (log, true) => map_rows::<T>(input, dim, out, #[inline(always)] |index, row| {
                    causal_row(row, index % period + 1, log)
                }),
            }
        };
        Ok(())
    }, else Err(Error::unsupported("softmax", input.dtype, Device::cpu(), "softmax is defined for floats")))
}

/// Independent accumulators of the row passes (a multiple of every vector width): a loop over
/// chunks of this many elements vectorises, one accumulator would be a serial chain.
const LANES: usize = 16;

/// The largest element of a row (`-inf` when empty), NaN skipped: a plain vector maximum. A NaN
/// still makes the whole row NaN, through its `e^(NaN - max)` in the normaliser, as a
/// NaN-propagating maximum would (and `+inf` gives `inf - inf = NaN` either way).
#[inline(always)]
fn row_max<F: Float>(row: &[F]) -> F {
    let mut acc = [F::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = if v > *a { v } else { *a };
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = if v > *a { v } else { *a };
    }
    acc.iter().fold(F::NEG_INFINITY, |m, &a| if a > m { a } else { m })
}

/// Elements per block of [`exp_sum`]: 1 KiB of f32 on the stack.
const BLOCK: usize = 256;

/// Add `xs` into the f64 lanes `acc`, element `j` of each chunk into lane `j`.
#[inline(always)]
fn accumulate<F: Float>(acc: &mut [f64; LANES], xs: &[F]) {
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += v.to_f64();
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += v.to_f64();
    }
}

/// `Σ e^(x - max)` over a row, the row left as it is: the exponentials of a block go to a
/// buffer on the stack, then into the f64 lanes. Two loops, each vectorised at its own width
/// (computing and accumulating in one loop would run the f32 exponentials at the f64 width).
#[inline(always)]
fn exp_sum<F: Float>(row: &[F], max: F) -> f64 {
    let mut acc = [0f64; LANES];
    let mut block = [F::ZERO; BLOCK];
    for piece in row.chunks(BLOCK) {
        let e = &mut block[..piece.len()];
        for (e, &v) in e.iter_mut().zip(piece) {
            *e = (v - max).exp();
        }
        accumulate(&mut acc, e);
    }
    pairwise(acc)
}

/// The sum of the lanes, combined pairwise.
#[inline(always)]
fn pairwise(mut acc: [f64; LANES]) -> f64 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// Softmax of one row, in place: the maximum, the exponentials (kept in the row), their sum in
/// f64 lanes, one scale.
#[inline(always)]
fn softmax_row<F: Float>(row: &mut [F]) {
    let max = row_max(row);
    for v in row.iter_mut() {
        *v = (*v - max).exp();
    }
    let mut acc = [0f64; LANES];
    accumulate(&mut acc, row);
    let scale = F::from_f64(1.0 / pairwise(acc));
    for v in row.iter_mut() {
        *v = *v * scale;
    }
}

/// Causal (log-)softmax of one row, in place: the first `keep` elements normalised among
/// themselves, the rest 0 (−inf for log-softmax).
#[inline(always)]
fn causal_row<F: Float>(row: &mut [F], keep: usize, log: bool) {
    let (kept, masked) = row.split_at_mut(keep.min(row.len()));
    if log {
        log_softmax_row(kept);
        masked.fill(F::NEG_INFINITY);
    } else {
        softmax_row(kept);
        masked.fill(F::ZERO);
    }
}

/// Log-softmax of one row, in place.
#[inline(always)]
fn log_softmax_row<F: Float>(row: &mut [F]) {
    let max = row_max(row);
    let log_total = F::from_f64(exp_sum(row, max).ln());
    for v in row.iter_mut() {
        *v = (*v - max) - log_total;
    }
}
