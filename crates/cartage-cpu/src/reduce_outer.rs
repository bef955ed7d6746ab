//! Reductions over outer dimensions (sum over the batch, max over rows of a row-major matrix):
//! when the kept positions are dense in the input's innermost dimension and the reduced ones
//! are not, each output's elements lie a whole row apart, and folding one output at a time
//! would touch a new cache line per element. Instead a tile of [`TILE`] neighbouring outputs
//! folds together, row by row: every row read is a dense, vectorised segment.
//!
//! Each output still folds its reduced positions in one fixed (row-major) order, whatever the
//! thread count, so results are bit-identical run to run. Float sums accumulate in f64
//! ([`WideSum`]): sequential f64 accumulation of f32 values is more accurate than the blocked
//! tree of [`crate::reduce`] and free here, where the loads dominate.

use std::marker::PhantomData;

use cartage_core::TensorArg;

use crate::elem::{Float, Pod, Real};
use crate::map::base;
use crate::reduce::{Fold, Walks};
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, for_ranges_with, is_non_overlapping};

/// Outputs folded together.
pub const TILE: usize = 64;

/// True when tiling pays: the kept positions are dense in the input's innermost dimension (at
/// least 8 of them) and the reduced positions are not.
pub fn applies(walks: &Walks) -> bool {
    let [kept_input, _] = walks.kept.inner_strides();
    let [reduced] = walks.reduced.inner_strides();
    kept_input == 1 && walks.kept.inner_len() >= 8 && reduced != 1 && walks.count > 1
}

/// A float sum accumulated in f64.
pub struct WideSum<T>(pub PhantomData<T>);

impl<T: Real> Fold for WideSum<T> {
    type In = T;
    type Acc = f64;
    #[inline(always)]
    fn identity(&self) -> f64 {
        0.0
    }
    #[inline(always)]
    fn step(&self, acc: f64, x: T) -> f64 {
        acc + Float::to_f64(x.load())
    }
    #[inline(always)]
    fn merge(&self, a: f64, b: f64) -> f64 {
        a + b
    }
}

/// Fold every output in tiles and store `finish(acc)`; returns true (the reduction is done).
///
/// # Safety
/// `launch` checked the kernel; `T`/`O` are the input's/output's storage types; [`applies`]
/// holds for `walks`.
pub unsafe fn tiled<T: Pod, F: Fold<In = T>, O: Pod>(
    input: &TensorArg,
    out: &TensorArg,
    walks: &Walks,
    fold: &F,
    finish: impl Fn(F::Acc) -> O + Sync,
) -> bool {
    let (x, o) = (base::<T>(input), base::<O>(out));
    let [_, so] = walks.kept.inner_strides();
    let [sr] = walks.reduced.inner_strides();
    let count = walks.count;
    let body = |s: usize, e: usize| {
        walks.kept.runs(s, e, |[io, oo], len| {
            for t0 in (0..len).step_by(TILE) {
                let width = TILE.min(len - t0);
                let mut acc = [fold.identity(); TILE];
                let lanes = &mut acc[..width];
                walks.reduced.runs(0, count, |[ro], rows| {
                    for r in 0..rows {
                        // SAFETY: the kept positions `io + t0 ..+ width` are dense (stride 1)
                        // and, shifted by a reduced position, stay inside the input view.
                        let row = unsafe { std::slice::from_raw_parts(x.add(io + t0 + ro + r * sr), width) };
                        for (a, &v) in lanes.iter_mut().zip(row) {
                            *a = fold.step(*a, v);
                        }
                    }
                });
                for (j, &a) in acc[..width].iter().enumerate() {
                    // SAFETY: output position `t0 + j` of this kept run lies inside the output view.
                    unsafe { *o.add(oo + (t0 + j) * so) = finish(a) };
                }
            }
        })
    };
    let outputs = out.layout.numel();
    let work = outputs.saturating_mul(count);
    if work >= PARALLEL_MIN_ELEMENTS
        && outputs >= 2 * TILE
        && is_non_overlapping(out.layout.shape(), out.layout.strides())
    {
        for_ranges_with(outputs, 1, (CHUNK_MIN_ELEMENTS / count).max(TILE), body);
    } else if outputs > 0 {
        body(0, outputs);
    }
    true
}
