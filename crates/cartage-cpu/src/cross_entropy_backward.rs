//! `Kernel::CrossEntropyBackward`: the logits gradient
//! `g[n]·(softmax(x[n]) − (1 − s)·onehot(t[n]) − s/C)` row by row, a zero row where the target
//! is `ignore_index`. Each row is loaded once into a compute-type buffer; targets are loaded once
//! each and checked before they address the row, as in the forward ([`crate::cross_entropy`]).

use cartage_core::{DType, Device, Error, Result, TensorArg};

use crate::cross_entropy::{class_in_range, unexpected_targets};
use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::{lane_max, lane_sum, simd};
use crate::index::{FirstBad, IndexValue};
use crate::map::base;
use crate::rows::{STACK_ROW, row_buffer};
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, for_ranges_with};

/// `Kernel::CrossEntropyBackward`.
pub fn cross_entropy_backward(
    logits: &TensorArg,
    target: &TensorArg,
    grad: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let classes = logits.layout.shape()[1];
    let args = Args {
        logits,
        target,
        grad,
        ignore_index,
        smoothing: label_smoothing,
        out,
    };
    let first_bad = with_float!(logits.dtype, T => {
        // SAFETY: launch ran `Kernel::validate` (shapes, dtypes, bounds, `out` apart from every
        // input); `rows` checks every target it loads before using it.
        unsafe {
            match target.dtype {
                DType::I32 => rows::<T, i32>(&args),
                DType::I64 => rows::<T, i64>(&args),
                dtype => return Err(unexpected_targets("cross_entropy_backward", dtype)),
            }
        }
    }, else return Err(Error::unsupported("cross_entropy_backward", logits.dtype, Device::cpu(), "defined for float logits")));
    class_in_range("cross_entropy_backward", first_bad, classes)
}

/// The kernel's operands and scalars.
struct Args<'a> {
    logits: &'a TensorArg,
    target: &'a TensorArg,
    grad: &'a TensorArg,
    ignore_index: i64,
    smoothing: f64,
    out: &'a TensorArg,
}

/// One row's gradient in place: `row` holds the logits and receives
/// `g·(softmax − (1 − s)·onehot(t) − s/C)`.
#[inline(always)]
fn row_gradient<F: Float>(row: &mut [F], t: usize, g: F, smoothing: f64) {
    let max = lane_max(row);
    for v in row.iter_mut() {
        *v = (*v - max).exp();
    }
    let total = lane_sum(row, 0f64, |v| v.to_f64());
    let scale = F::from_f64(1.0 / total) * g;
    let floor = g * F::from_f64(smoothing / row.len() as f64);
    for v in row.iter_mut() {
        *v = *v * scale - floor;
    }
    row[t] = row[t] - g * F::from_f64(1.0 - smoothing);
}

/// # Safety
/// See [`cross_entropy_backward`]: the kernel was validated and `T` is the logits' storage type.
unsafe fn rows<T: Real, I: IndexValue>(args: &Args<'_>) -> Option<i64> {
    let (n, classes) = (args.logits.layout.shape()[0], args.logits.layout.shape()[1]);
    let (row_stride, col_stride) = (args.logits.layout.strides()[0], args.logits.layout.strides()[1]);
    let (out_row, out_col) = (args.out.layout.strides()[0], args.out.layout.strides()[1]);
    let (st, sg) = (args.target.layout.strides()[0], args.grad.layout.strides()[0]);
    let (x, t, g, y) = (
        base::<T>(args.logits),
        base::<I>(args.target),
        base::<T>(args.grad),
        base::<T>(args.out),
    );
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
                    if v == args.ignore_index {
                        buf.fill(T::C::ZERO);
                    } else if v < 0 || v as u64 >= classes as u64 {
                        first_bad.record(r, v);
                        return;
                    } else {
                        let at = r * row_stride;
                        // SAFETY: the row's `classes` positions lie inside the logits view, and
                        // `r < n` inside the gradient's.
                        let scale = unsafe {
                            for (c, b) in buf.iter_mut().enumerate() {
                                *b = (*x.add(at + c * col_stride)).load();
                            }
                            (*g.add(r * sg)).load()
                        };
                        // `v` (this very load) is in `0..classes`.
                        row_gradient(buf, v as usize, scale, args.smoothing);
                    }
                    for (c, &value) in buf.iter().enumerate() {
                        // SAFETY: inside the output view, whose rows are disjoint across threads
                        // (validate: writable) and apart from every input.
                        unsafe { *y.add(r * out_row + c * out_col) = T::store(value) };
                    }
                }
            },
        )
    };
    let work = n.saturating_mul(classes);
    if work >= PARALLEL_MIN_ELEMENTS && n > 1 {
        for_ranges_with(n, 1, (CHUNK_MIN_ELEMENTS / classes.max(1)).max(1), body);
    } else if n > 0 {
        body(0, n);
    }
    first_bad.into_value()
}
