//! `Kernel::CrossEntropy`: the per-row loss of logits [N, C] against integer targets [N].
//!
//! Each row is loaded once into a compute-type buffer (f32 for f16/bf16, f64 for f64); with
//! `lse = max + ln Σ e^(x - max)`, `logp[c] = x[c] - lse` and the loss is
//! `-(1 - s)·logp[t] - s/C · Σ_c logp[c]`. Rows whose target equals `ignore_index` give 0.
//!
//! Targets are loaded once each (an atomic load) and checked before they address the row, as
//! in [`crate::index`]; the first target outside `[0, C)` (by row) is
//! [`Error::IndexOutOfRange`], and `out` is then partly written.

use cartage_core::{DType, Device, Error, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::{lane_max, lane_sum, simd};
use crate::index::{FirstBad, IndexValue};
use crate::map::base;
use crate::rows::{STACK_ROW, row_buffer};
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, for_ranges_with, is_non_overlapping};

/// `Kernel::CrossEntropy`.
pub fn cross_entropy(
    logits: &TensorArg,
    target: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let classes = logits.layout.shape()[1];
    let first_bad = with_float!(logits.dtype, T => {
        // SAFETY: launch ran `Kernel::validate` (shapes [N, C] / [N] / [N], dtypes, bounds);
        // `rows` checks every target it loads before using it.
        unsafe {
            match target.dtype {
                DType::I32 => rows::<T, i32>(logits, target, ignore_index, label_smoothing, out),
                DType::I64 => rows::<T, i64>(logits, target, ignore_index, label_smoothing, out),
                dtype => return Err(unexpected_targets("cross_entropy", dtype)),
            }
        }
    }, else return Err(Error::unsupported("cross_entropy", logits.dtype, Device::cpu(), "defined for float logits")));
    class_in_range("cross_entropy", first_bad, classes)
}

/// A target dtype `Kernel::validate` should have refused (shared with the backward kernel).
#[cold]
pub(crate) fn unexpected_targets(op: &'static str, dtype: DType) -> Error {
    Error::invalid(
        op,
        format!("{dtype} targets reached the kernel; Kernel::validate admits only i32 and i64"),
    )
}

/// `IndexOutOfRange` naming dim 1 and `classes` for the first bad target a row pass recorded,
/// if any (shared with the backward kernel).
pub(crate) fn class_in_range(op: &'static str, first_bad: Option<i64>, classes: usize) -> Result<()> {
    match first_bad {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op,
            index,
            dim: 1,
            size: classes,
            device: Device::cpu(),
        }),
    }
}

/// The loss of one row (already in the compute type) for a checked target `t`.
#[inline(always)]
fn row_loss<F: Float>(row: &[F], t: usize, smoothing: f64) -> F {
    let max = lane_max(row);
    let total = lane_sum(row, 0f64, |v| (v - max).exp().to_f64());
    let lse = max.to_f64() + total.ln();
    let picked = row[t].to_f64() - lse;
    let mut loss = -(1.0 - smoothing) * picked;
    if smoothing != 0.0 {
        let classes = row.len() as f64;
        let sum_logp = lane_sum(row, 0f64, |v| v.to_f64()) - classes * lse;
        loss -= smoothing / classes * sum_logp;
    }
    F::from_f64(loss)
}

/// # Safety
/// See [`cross_entropy`]: the kernel was validated and `T` is the logits' storage type.
unsafe fn rows<T: Real, I: IndexValue>(
    logits: &TensorArg,
    target: &TensorArg,
    ignore_index: i64,
    smoothing: f64,
    out: &TensorArg,
) -> Option<i64> {
    let (n, classes) = (logits.layout.shape()[0], logits.layout.shape()[1]);
    let (row_stride, col_stride) = (logits.layout.strides()[0], logits.layout.strides()[1]);
    let (st, so) = (target.layout.strides()[0], out.layout.strides()[0]);
    let (x, t, y) = (base::<T>(logits), base::<I>(target), base::<T>(out));
    let first_bad = FirstBad::new();
    let body = |start: usize, end: usize| {
        let (mut stack, mut heap) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let buf = row_buffer(&mut stack, &mut heap, classes);
        simd(
            #[inline(always)]
            || {
                for r in start..end {
                    if first_bad.before(r) {
                        return;
                    }
                    // SAFETY: `r < n`: inside the target view, which is aligned.
                    let v = unsafe { I::load(t.add(r * st)) };
                    let loss = if v == ignore_index {
                        T::C::ZERO
                    } else if v < 0 || v as u64 >= classes as u64 {
                        first_bad.record(r, v);
                        return;
                    } else {
                        let at = r * row_stride;
                        // SAFETY: the row's `classes` positions lie inside the logits view.
                        unsafe {
                            if col_stride == 1 {
                                T::widen(std::slice::from_raw_parts(x.add(at), classes), buf);
                            } else {
                                for (c, b) in buf.iter_mut().enumerate() {
                                    *b = (*x.add(at + c * col_stride)).load();
                                }
                            }
                        }
                        // `v` (this very load) is in `0..classes`.
                        row_loss(buf, v as usize, smoothing)
                    };
                    // SAFETY: `r < n`: inside the output view.
                    unsafe { *y.add(r * so) = T::store(loss) };
                }
            },
        )
    };
    let work = n.saturating_mul(classes);
    if work >= PARALLEL_MIN_ELEMENTS && n > 1 && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges_with(n, 1, (CHUNK_MIN_ELEMENTS / classes.max(1)).max(1), body);
    } else if n > 0 {
        body(0, n);
    }
    first_bad.into_value()
}
