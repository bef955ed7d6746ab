//! `Kernel::Sort`: a stable sort of every row along one dimension, with the positions.
//!
//! Each row is gathered (through its stride, in place) into `(key, position)` pairs, sorted with
//! the standard library's stable sort under [`order`] (NaN above +inf, -0 equal to +0) and
//! written to `values` and `indices`. Descending order compares the other way round, so equal
//! keys keep their input order in both directions. Rows are independent and spread over rayon.

use std::cmp::Ordering;

use cartage_core::{Result, TensorArg};

use crate::argreduce::MaybeNan;
use crate::dispatch::with_storage;
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, Walk, for_ranges_with, is_non_overlapping};

/// The ascending order of the sort: a total preorder in which NaN is above everything (and
/// equal to itself) and other values compare as usual.
#[inline(always)]
pub fn order<T: MaybeNan>(a: T, b: T) -> Ordering {
    match (a.is_nan_value(), b.is_nan_value()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Stable sort of `(key, position)` pairs, largest first when `descending`.
pub fn sort_pairs<T: MaybeNan>(pairs: &mut [(T, i64)], descending: bool) {
    if descending {
        pairs.sort_by(|a, b| order(b.0, a.0));
    } else {
        pairs.sort_by(|a, b| order(a.0, b.0));
    }
}

/// `Kernel::Sort`.
pub fn sort(input: &TensorArg, dim: usize, descending: bool, values: &TensorArg, indices: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is the storage type of `input` and `values`, and
    // `indices` is i64.
    with_storage!(input.dtype, T => unsafe { sort_typed::<T>(input, dim, descending, values, indices) });
    Ok(())
}

/// # Safety
/// `launch` checked the kernel; `T` is the storage type of `input` and `values`.
unsafe fn sort_typed<T: MaybeNan>(
    input: &TensorArg,
    dim: usize,
    descending: bool,
    values: &TensorArg,
    indices: &TensorArg,
) {
    let shape = input.layout.shape();
    let n = shape[dim];
    let (sx, sv, sn) = (
        input.layout.strides()[dim],
        values.layout.strides()[dim],
        indices.layout.strides()[dim],
    );
    let mut row_shape: cartage_core::Dims = shape.into();
    row_shape[dim] = 1;
    let rows = Walk::new(
        &row_shape,
        [
            input.layout.strides(),
            values.layout.strides(),
            indices.layout.strides(),
        ],
    );
    let [rx, rv, rn] = rows.inner_strides();
    let row_count: usize = row_shape.iter().product();
    let (x, v, ix) = (base::<T>(input), base::<T>(values), base::<i64>(indices));
    let body = |start: usize, end: usize| {
        let mut pairs: Vec<(T, i64)> = Vec::with_capacity(n);
        rows.runs(start, end, |[ox, ov, on], len| {
            for r in 0..len {
                let (a, b, c) = (ox + r * rx, ov + r * rv, on + r * rn);
                pairs.clear();
                // SAFETY: positions `k < n` along `dim` of this row are inside the input view.
                pairs.extend((0..n).map(|k| (unsafe { *x.add(a + k * sx) }, k as i64)));
                sort_pairs(&mut pairs, descending);
                for (k, &(key, at)) in pairs.iter().enumerate() {
                    // SAFETY: as above, for the two output views.
                    unsafe {
                        *v.add(b + k * sv) = key;
                        *ix.add(c + k * sn) = at;
                    }
                }
            }
        })
    };
    if n == 0 || row_count == 0 {
        return;
    }
    let work = row_count.saturating_mul(n);
    let split = is_non_overlapping(values.layout.shape(), values.layout.strides())
        && is_non_overlapping(indices.layout.shape(), indices.layout.strides());
    if work >= PARALLEL_MIN_ELEMENTS / 16 && row_count > 1 && split {
        for_ranges_with(row_count, 1, (CHUNK_MIN_ELEMENTS / 16 / n).max(1), body);
    } else {
        body(0, row_count);
    }
}
