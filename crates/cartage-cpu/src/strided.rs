//! Strided iteration shared by every kernel: a joint walk over operands of one shape, cut into
//! runs of the innermost dimension, and the rule deciding when work goes to rayon.
//!
//! [`Walk`] merges adjacent dimensions that are contiguous for *every* operand and drops size-1
//! dimensions (core's `layout::coalesce`), so a strided kernel runs a tight inner
//! loop with fixed strides and touches index arithmetic once per run, not per element.
//! Broadcast operands have stride 0 and are read in place.

use cartage_core::Dims;
use cartage_core::layout::coalesce;
use rayon::prelude::*;

/// Element-wise work below this many elements runs on the calling thread, with no rayon call.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 20;

/// The smallest piece of element-wise work handed to a rayon task.
pub const CHUNK_MIN_ELEMENTS: usize = 1 << 16;

/// A raw pointer that may cross into rayon tasks. Kernels give each task disjoint output
/// elements; inputs are only read.
#[derive(Debug)]
pub struct SyncPtr<T>(pub *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}

// SAFETY: the pointer is only dereferenced by kernels that partition the elements they write
// between tasks (see `for_ranges`), so sharing it between threads creates no data race.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer `count` elements further.
    ///
    /// # Safety
    /// The result must stay inside the allocation the pointer points into.
    #[inline(always)]
    pub unsafe fn add(self, count: usize) -> *mut T {
        // SAFETY: the caller keeps the offset inside the allocation.
        unsafe { self.0.add(count) }
    }
}

/// Call `f(start, end)` over `0..numel`: once on this thread below `min_parallel` elements (or
/// with one rayon thread), else on rayon in chunks of at least `chunk_min` elements.
#[inline]
pub fn for_ranges_with(numel: usize, min_parallel: usize, chunk_min: usize, f: impl Fn(usize, usize) + Sync) {
    if numel < min_parallel.max(1) {
        if numel > 0 {
            f(0, numel);
        }
        return;
    }
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        f(0, numel);
        return;
    }
    let chunks = (numel / chunk_min.max(1)).clamp(1, threads * 4);
    let chunk = numel.div_ceil(chunks);
    (0..chunks).into_par_iter().for_each(|c| {
        let start = c * chunk;
        let end = (start + chunk).min(numel);
        if start < end {
            f(start, end);
        }
    });
}

/// [`for_ranges_with`] with the element-wise thresholds.
#[inline]
pub fn for_ranges(numel: usize, f: impl Fn(usize, usize) + Sync) {
    for_ranges_with(numel, PARALLEL_MIN_ELEMENTS, CHUNK_MIN_ELEMENTS, f)
}

/// A joint walk over `N` operands that share one shape (strides may differ; 0 = broadcast).
#[derive(Clone, Debug)]
pub struct Walk<const N: usize> {
    shape: Dims,
    strides: [Dims; N],
}

impl<const N: usize> Walk<N> {
    /// Merge what can be merged ([`cartage_core::layout::coalesce`]); a rank-0 or all-ones
    /// shape becomes one dimension of size 1, an empty one a dimension of size 0.
    #[inline]
    pub fn new(shape: &[usize], strides: [&[usize]; N]) -> Self {
        let coalesced = coalesce(shape, &strides);
        let mut merged = coalesced.shape;
        let mut per_operand = coalesced.strides.into_iter();
        let mut merged_strides: [Dims; N] = std::array::from_fn(|_| per_operand.next().unwrap_or_default());
        if merged.is_empty() {
            merged.push(1);
            for s in &mut merged_strides {
                s.push(0);
            }
        }
        Walk {
            shape: merged,
            strides: merged_strides,
        }
    }

    /// Number of positions.
    #[cfg(test)]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The stride of each operand along the innermost (merged) dimension.
    #[inline]
    pub fn inner_strides(&self) -> [usize; N] {
        let last = self.shape.len() - 1;
        std::array::from_fn(|k| self.strides[k][last])
    }

    /// The length of the innermost (merged) dimension.
    #[inline]
    pub fn inner_len(&self) -> usize {
        self.shape[self.shape.len() - 1]
    }

    /// True when the walk is one dense run for every operand.
    #[cfg(test)]
    pub fn is_dense(&self) -> bool {
        self.shape.len() == 1 && self.strides.iter().all(|s| s[0] == 1)
    }

    /// Call `f(offsets, len)` for each run of the innermost dimension covering the row-major
    /// positions `start..end`; `offsets` are each operand's element offset of the run's first
    /// position, relative to the operand's layout offset.
    #[inline]
    pub fn runs(&self, start: usize, end: usize, mut f: impl FnMut([usize; N], usize)) {
        if start >= end {
            return;
        }
        let rank = self.shape.len();
        let inner = self.shape[rank - 1];
        if rank == 1 {
            f(std::array::from_fn(|k| start * self.strides[k][0]), end - start);
            return;
        }
        let mut index: Dims = Dims::from_elem(0, rank);
        let mut offsets = [0usize; N];
        let mut rest = start;
        for d in (0..rank).rev() {
            let i = rest % self.shape[d];
            rest /= self.shape[d];
            index[d] = i;
            for (o, s) in offsets.iter_mut().zip(&self.strides) {
                *o += i * s[d];
            }
        }
        let mut pos = start;
        loop {
            let len = (inner - index[rank - 1]).min(end - pos);
            f(offsets, len);
            pos += len;
            if pos >= end {
                return;
            }
            // The run ended a row: back to the row's start, then carry into the outer dims.
            for (o, s) in offsets.iter_mut().zip(&self.strides) {
                *o -= index[rank - 1] * s[rank - 1];
            }
            index[rank - 1] = 0;
            for d in (0..rank - 1).rev() {
                index[d] += 1;
                for (o, s) in offsets.iter_mut().zip(&self.strides) {
                    *o += s[d];
                }
                if index[d] < self.shape[d] {
                    break;
                }
                for (o, s) in offsets.iter_mut().zip(&self.strides) {
                    *o -= self.shape[d] * s[d];
                }
                index[d] = 0;
            }
        }
    }
}

/// True when no two positions of the layout share memory (safe to write from several threads):
/// core's `layout::is_non_overlapping`, re-exported.
pub use cartage_core::layout::is_non_overlapping;

#[cfg(test)]
mod tests {
    use super::*;
    use cartage_core::Layout;

    fn collect<const N: usize>(walk: &Walk<N>, start: usize, end: usize) -> Vec<[usize; N]> {
        let strides = walk.inner_strides();
        let mut out = Vec::new();
        walk.runs(start, end, |offs, len| {
            for i in 0..len {
                out.push(std::array::from_fn(|k| offs[k] + i * strides[k]));
            }
        });
        out
    }

    #[test]
    fn walk_matches_layout_offsets_for_views() {
        let base = Layout::contiguous(&[3, 4, 5]).unwrap();
        let views = [
            base.clone(),
            base.permute(&[2, 0, 1]).unwrap(),
            base.narrow(2, 1, 3).unwrap(),
            base.transpose(0, 2).unwrap().narrow(1, 1, 2).unwrap(),
            Layout::contiguous(&[4, 1]).unwrap().broadcast_to(&[3, 4, 5]).unwrap(),
        ];
        for a in &views {
            for b in &views {
                if a.shape() != b.shape() {
                    continue;
                }
                let walk = Walk::new(a.shape(), [a.strides(), b.strides()]);
                let expected: Vec<[usize; 2]> = a
                    .offsets()
                    .zip(b.offsets())
                    .map(|(x, y)| [x - a.offset(), y - b.offset()])
                    .collect();
                let n = expected.len();
                assert_eq!(collect(&walk, 0, n), expected);
                // Any split into ranges gives the same positions.
                for cut in [1, 7, n / 2, n - 1] {
                    let mut parts = collect(&walk, 0, cut);
                    parts.extend(collect(&walk, cut, n));
                    assert_eq!(parts, expected, "cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn contiguous_operands_merge_into_one_run() {
        let walk = Walk::new(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]]);
        assert!(walk.is_dense());
        let scalar = Walk::new(&[], [&[], &[]]);
        assert_eq!(scalar.numel(), 1);
        assert_eq!(collect(&scalar, 0, 1), vec![[0, 0]]);
        let bias = Walk::new(&[4, 8], [&[8, 1], &[0, 1]]);
        assert_eq!(bias.inner_strides(), [1, 1]);
        assert_eq!(bias.numel(), 32);
    }

    #[test]
    fn empty_walks_have_no_runs() {
        let walk = Walk::new(&[3, 0, 2], [&[0, 2, 1], &[2, 2, 1]]);
        assert_eq!(walk.numel(), 0);
        assert_eq!(walk.inner_len(), 0);
        assert!(collect(&walk, 0, 0).is_empty());
        assert!(is_non_overlapping(&[0, 5], &[0, 0]));
        assert!(!is_non_overlapping(&[3, 4], &[0, 1]));
    }
}
