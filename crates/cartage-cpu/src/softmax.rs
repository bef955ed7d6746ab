//! `Kernel::Softmax`: softmax or log-softmax along one dimension, max-subtracted, computed in
//! the compute type (f32 for f16/bf16) with the normaliser accumulated in f64. Rows are read
//! and written in place through their strides; many rows spread over rayon.

use cartage_core::{Device, Error, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real, fmax};
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, Walk, for_ranges_with, is_non_overlapping};

/// `Kernel::Softmax`.
pub fn softmax(input: &TensorArg, dim: usize, log: bool, out: &TensorArg) -> Result<()> {
    with_float!(input.dtype, T => {
        // SAFETY: launch checked the kernel (same shape and float dtype, `dim` in range).
        unsafe { softmax_typed::<T>(input, dim, log, out) };
        Ok(())
    }, else Err(Error::unsupported("softmax", input.dtype, Device::cpu(), "softmax is defined for floats")))
}

/// # Safety
/// `launch` checked the kernel; `T` is the storage type of both operands.
unsafe fn softmax_typed<T: Real>(input: &TensorArg, dim: usize, log: bool, out: &TensorArg) {
    let shape = input.layout.shape();
    let n = shape[dim];
    let (si, so) = (input.layout.strides()[dim], out.layout.strides()[dim]);
    let mut row_shape: cartage_core::Dims = shape.into();
    row_shape[dim] = 1;
    let rows = Walk::new(&row_shape, [input.layout.strides(), out.layout.strides()]);
    let [ri, ro] = rows.inner_strides();
    let row_count: usize = row_shape.iter().product();
    let (x, y) = (base::<T>(input), base::<T>(out));
    let row = |at_in: usize, at_out: usize| {
        // SAFETY: positions `k * si` / `k * so` for `k < n` are the row's elements in the views.
        let read = |k: usize| unsafe { (*x.add(at_in + k * si)).load() };
        let mut max = T::C::NEG_INFINITY;
        for k in 0..n {
            max = fmax(max, read(k));
        }
        let mut total = 0f64;
        for k in 0..n {
            total += Float::to_f64((read(k) - max).exp());
        }
        let total = T::C::from_f64(total);
        let log_total = total.ln();
        for k in 0..n {
            let shifted = read(k) - max;
            let v = if log {
                shifted - log_total
            } else {
                shifted.exp() / total
            };
            // SAFETY: as above, for the output row.
            unsafe { *y.add(at_out + k * so) = T::store(v) };
        }
    };
    let body = |s: usize, e: usize| {
        rows.runs(s, e, |[oi, oo], len| {
            for k in 0..len {
                row(oi + k * ri, oo + k * ro);
            }
        })
    };
    let work = row_count.saturating_mul(n);
    if work >= PARALLEL_MIN_ELEMENTS && row_count > 1 && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges_with(row_count, 1, (CHUNK_MIN_ELEMENTS / n.max(1)).max(1), body);
    } else if row_count > 0 && n > 0 {
        body(0, row_count);
    }
}
