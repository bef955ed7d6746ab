//! Row kernels (softmax, layer/RMS norm): each row along one dimension is loaded once into a
//! buffer of the compute type (a dense row widens as a block, a strided one is read in place
//! element by element), transformed there while it sits in cache, and stored once. The whole
//! pass over a row runs compiled for the widest vector instructions ([`crate::fast_math::simd`]); many
//! rows spread over rayon.

use cartage_core::TensorArg;

use crate::elem::{Float, Real};
use crate::fast_math::simd;
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, Walk, for_ranges_with, is_non_overlapping};

/// Rows up to this long use a buffer on the stack (no allocation for small kernels).
pub const STACK_ROW: usize = 256;

/// A row buffer of `n` elements: `stack` when it is long enough, else `heap` grown to `n`.
#[inline(always)]
pub fn row_buffer<'a, F: Float>(stack: &'a mut [F; STACK_ROW], heap: &'a mut Vec<F>, n: usize) -> &'a mut [F] {
    if n <= STACK_ROW {
        &mut stack[..n]
    } else {
        heap.resize(n, F::ZERO);
        &mut heap[..]
    }
}

/// Replace every row of `input` along `dim` by `f(row)` in `out` (same shape and dtype).
///
/// # Safety
/// `launch` checked the kernel; `T` is the storage type of both operands, which share a shape;
/// `out` is `input` itself or does not overlap it.
pub unsafe fn map_rows<T: Real>(input: &TensorArg, dim: usize, out: &TensorArg, f: impl Fn(&mut [T::C]) + Sync) {
    let shape = input.layout.shape();
    let n = shape[dim];
    let (si, so) = (input.layout.strides()[dim], out.layout.strides()[dim]);
    let mut row_shape: cartage_core::Dims = shape.into();
    row_shape[dim] = 1;
    let rows = Walk::new(&row_shape, [input.layout.strides(), out.layout.strides()]);
    let [ri, ro] = rows.inner_strides();
    let row_count: usize = row_shape.iter().product();
    let (x, y) = (base::<T>(input), base::<T>(out));
    let body = |start: usize, end: usize| {
        let (mut stack, mut heap) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let buf = row_buffer(&mut stack, &mut heap, n);
        rows.runs(start, end, |[oi, oo], len| {
            for r in 0..len {
                let (a, b) = (oi + r * ri, oo + r * ro);
                let buf = &mut *buf;
                simd(
                    #[inline(always)]
                    || {
                        // SAFETY: positions `k < n` along `dim` of this row lie inside the input
                        // view; the row is read completely before the output row is written.
                        unsafe {
                            if si == 1 {
                                T::widen(std::slice::from_raw_parts(x.add(a), n), buf);
                            } else {
                                for (k, v) in buf.iter_mut().enumerate() {
                                    *v = (*x.add(a + k * si)).load();
                                }
                            }
                        }
                        f(buf);
                        // SAFETY: as above, for the output view.
                        unsafe {
                            if so == 1 {
                                T::narrow(buf, std::slice::from_raw_parts_mut(y.add(b), n));
                            } else {
                                for (k, &v) in buf.iter().enumerate() {
                                    *y.add(b + k * so) = T::store(v);
                                }
                            }
                        }
                    },
                )
            }
        })
    };
    if n == 0 || row_count == 0 {
        return;
    }
    let work = row_count.saturating_mul(n);
    if work >= PARALLEL_MIN_ELEMENTS && row_count > 1 && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges_with(row_count, 1, (CHUNK_MIN_ELEMENTS / n).max(1), body);
    } else {
        body(0, row_count);
    }
}
