//! Row kernels (softmax, layer/RMS norm): each row along one dimension is loaded once into a
//! buffer of the compute type (a dense row widens as a block, a strided one is read in place
//! element by element), transformed there while it sits in cache, and stored once. The whole
//! pass over a row runs compiled for the widest vector instructions ([`crate::fast_math::simd`]); many
//! rows spread over rayon.

use cartage_core::TensorArg;

use crate::elem::{Float, Real};
use crate::fast_math::simd;
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, SyncPtr, Walk, for_ranges_with, is_non_overlapping};

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

/// Load the row of `n` elements at element `at` (stride `stride`) into `buf`, widened.
///
/// # Safety
/// Positions `at + k·stride` for `k < buf.len()` lie inside the operand's buffer.
#[inline(always)]
unsafe fn load_row<T: Real>(x: SyncPtr<T>, at: usize, stride: usize, buf: &mut [T::C]) {
    // SAFETY: the caller's contract.
    unsafe {
        if stride == 1 {
            T::widen(std::slice::from_raw_parts(x.add(at), buf.len()), buf);
        } else {
            for (k, v) in buf.iter_mut().enumerate() {
                *v = (*x.add(at + k * stride)).load();
            }
        }
    }
}

/// Store `buf` into the row at element `at` (stride `stride`), rounded once.
///
/// # Safety
/// Positions `at + k·stride` for `k < buf.len()` lie inside the output's buffer, which no other
/// thread writes meanwhile.
#[inline(always)]
unsafe fn store_row<T: Real>(buf: &[T::C], y: SyncPtr<T>, at: usize, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if stride == 1 {
            T::narrow(buf, std::slice::from_raw_parts_mut(y.add(at), buf.len()));
        } else {
            for (k, &v) in buf.iter().enumerate() {
                *y.add(at + k * stride) = T::store(v);
            }
        }
    }
}

/// Run `body(start, end)` over `row_count` rows of `n` elements, spread over rayon when the work
/// is large and `out` has no two elements at one address.
fn run_rows(row_count: usize, n: usize, out: &TensorArg, body: impl Fn(usize, usize) + Sync) {
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

/// The rows along `dim` of a shape: (row length, row shape with `dim` set to 1, row count).
fn row_geometry(shape: &[usize], dim: usize) -> (usize, cartage_core::Dims, usize) {
    let mut row_shape: cartage_core::Dims = shape.into();
    row_shape[dim] = 1;
    let row_count = row_shape.iter().product();
    (shape[dim], row_shape, row_count)
}

/// Replace every row of `input` along `dim` by `f(index, row)` in `out` (same shape and dtype),
/// `index` counting the rows in row-major order of the other dimensions.
///
/// # Safety
/// `launch` checked the kernel; `T` is the storage type of both operands, which share a shape;
/// `out` is `input` itself or does not overlap it.
pub unsafe fn map_rows<T: Real>(input: &TensorArg, dim: usize, out: &TensorArg, f: impl Fn(usize, &mut [T::C]) + Sync) {
    let (n, row_shape, row_count) = row_geometry(input.layout.shape(), dim);
    let (si, so) = (input.layout.strides()[dim], out.layout.strides()[dim]);
    let rows = Walk::new(&row_shape, [input.layout.strides(), out.layout.strides()]);
    let [ri, ro] = rows.inner_strides();
    let (x, y) = (base::<T>(input), base::<T>(out));
    let body = |start: usize, end: usize| {
        let (mut stack, mut heap) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let buf = row_buffer(&mut stack, &mut heap, n);
        // Runs come in order: the first row of each is `next`.
        let mut next = start;
        rows.runs(start, end, |[oi, oo], len| {
            for r in 0..len {
                let (a, b) = (oi + r * ri, oo + r * ro);
                let (index, buf) = (next + r, &mut *buf);
                simd(
                    #[inline(always)]
                    || {
                        // SAFETY: positions `k < n` along `dim` of this row lie inside the input
                        // and output views; the row is read completely before the output row is
                        // written, and rows of `out` are disjoint across threads.
                        unsafe { load_row::<T>(x, a, si, buf) };
                        f(index, buf);
                        // SAFETY: as above.
                        unsafe { store_row::<T>(buf, y, b, so) };
                    },
                )
            }
            next += len;
        })
    };
    run_rows(row_count, n, out, body);
}

/// Write `f(first_row, second_row)` (computed in place in the first row's buffer) into every
/// row of `out` along `dim`: the row kernels of a backward pass, which read the forward's values
/// and the incoming gradient side by side.
///
/// # Safety
/// `launch` checked the kernel; `T` is the storage type of all three operands, which share a
/// shape; `out` does not overlap either input.
pub unsafe fn zip_rows<T: Real>(
    first: &TensorArg,
    second: &TensorArg,
    dim: usize,
    out: &TensorArg,
    f: impl Fn(&mut [T::C], &[T::C]) + Sync,
) {
    let (n, row_shape, row_count) = row_geometry(first.layout.shape(), dim);
    let strides = [first, second, out].map(|arg| arg.layout.strides()[dim]);
    let rows = Walk::new(
        &row_shape,
        [first.layout.strides(), second.layout.strides(), out.layout.strides()],
    );
    let [r1, r2, ro] = rows.inner_strides();
    let (x1, x2, y) = (base::<T>(first), base::<T>(second), base::<T>(out));
    let body = |start: usize, end: usize| {
        let (mut stack1, mut heap1) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let (mut stack2, mut heap2) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let buf1 = row_buffer(&mut stack1, &mut heap1, n);
        let buf2 = row_buffer(&mut stack2, &mut heap2, n);
        rows.runs(start, end, |[o1, o2, oo], len| {
            for r in 0..len {
                let (a1, a2, b) = (o1 + r * r1, o2 + r * r2, oo + r * ro);
                let (buf1, buf2) = (&mut *buf1, &mut *buf2);
                simd(
                    #[inline(always)]
                    || {
                        // SAFETY: positions `k < n` along `dim` of this row lie inside each view;
                        // `out` overlaps neither input, and its rows are disjoint across threads.
                        unsafe {
                            load_row::<T>(x1, a1, strides[0], buf1);
                            load_row::<T>(x2, a2, strides[1], buf2);
                        }
                        f(buf1, buf2);
                        // SAFETY: as above.
                        unsafe { store_row::<T>(buf1, y, b, strides[2]) };
                    },
                )
            }
        })
    };
    run_rows(row_count, n, out, body);
}

/// [`zip_rows`] with a fold: the rows are cut into chunks of `chunk_rows` consecutive rows (in
/// row-major order of the other dimensions), each chunk folds its rows into a fresh `init()`
/// with `f(acc, first_row, second_row)` (which also leaves the output row in the first row's
/// buffer), and the chunks' results come back in chunk order. The chunking depends on the shape
/// and `chunk_rows` alone, and each chunk is folded in row order by one thread, so the results
/// are the same for any number of threads and any timing. No chunks when a row is empty.
///
/// # Safety
/// As [`zip_rows`].
pub unsafe fn zip_rows_chunked<T: Real, A: Send>(
    first: &TensorArg,
    second: &TensorArg,
    dim: usize,
    out: &TensorArg,
    chunk_rows: usize,
    init: impl Fn() -> A + Sync,
    f: impl Fn(&mut A, &mut [T::C], &[T::C]) + Sync,
) -> Vec<A> {
    use rayon::prelude::*;
    let (n, row_shape, row_count) = row_geometry(first.layout.shape(), dim);
    if n == 0 || row_count == 0 {
        return Vec::new();
    }
    let strides = [first, second, out].map(|arg| arg.layout.strides()[dim]);
    let rows = Walk::new(
        &row_shape,
        [first.layout.strides(), second.layout.strides(), out.layout.strides()],
    );
    let [r1, r2, ro] = rows.inner_strides();
    let (x1, x2, y) = (base::<T>(first), base::<T>(second), base::<T>(out));
    let chunk_rows = chunk_rows.max(1);
    let chunk = |c: usize| {
        let (start, end) = (c * chunk_rows, ((c + 1) * chunk_rows).min(row_count));
        let mut acc = init();
        let (mut stack1, mut heap1) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let (mut stack2, mut heap2) = ([T::C::ZERO; STACK_ROW], Vec::new());
        let buf1 = row_buffer(&mut stack1, &mut heap1, n);
        let buf2 = row_buffer(&mut stack2, &mut heap2, n);
        rows.runs(start, end, |[o1, o2, oo], len| {
            for r in 0..len {
                let (a1, a2, b) = (o1 + r * r1, o2 + r * r2, oo + r * ro);
                let (buf1, buf2, acc) = (&mut *buf1, &mut *buf2, &mut acc);
                simd(
                    #[inline(always)]
                    || {
                        // SAFETY: positions `k < n` along `dim` of this row lie inside each view;
                        // `out` overlaps neither input, and its rows are disjoint across chunks.
                        unsafe {
                            load_row::<T>(x1, a1, strides[0], buf1);
                            load_row::<T>(x2, a2, strides[1], buf2);
                        }
                        f(acc, buf1, buf2);
                        // SAFETY: as above.
                        unsafe { store_row::<T>(buf1, y, b, strides[2]) };
                    },
                )
            }
        });
        acc
    };
    let chunks = row_count.div_ceil(chunk_rows);
    let parallel = chunks > 1
        && row_count.saturating_mul(n) >= PARALLEL_MIN_ELEMENTS
        && is_non_overlapping(out.layout.shape(), out.layout.strides());
    if parallel {
        (0..chunks).into_par_iter().map(chunk).collect()
    } else {
        (0..chunks).map(chunk).collect()
    }
}
