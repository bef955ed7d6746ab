//! [`Layout`]: shape, strides and offset of a strided view, all in elements, and [`coalesce`],
//! the one joint dimension-merging helper every backend's strided kernels use.
//!
//! A broadcast dimension has stride 0. Every size is overflow-checked where a layout is built:
//! no layout spans more than [`MAX_ELEMENTS`] elements (its element count and its extent, the
//! offset one past the last element it reaches), so `numel() × dtype size` and every byte
//! offset of a valid layout fit in `isize` for any dtype and the plain size methods cannot
//! overflow. Views (transpose, permute, narrow, broadcast, reshape of contiguous data,
//! squeeze/unsqueeze) only build a new layout; no method here touches data.
//!
//! A layout knows no dtype: its overflow errors are [`Error::SizeOverflow`] counting one byte per
//! element (dtype u8). Callers that know the element type re-tag them with [`Error::with_dtype`].

use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A short list of sizes or strides, inline up to rank 6.
pub type Dims = SmallVec<[usize; 6]>;

/// The most elements a layout may span (element count and extent): `isize::MAX / 8`, so that
/// a byte count or byte offset of any dtype (at most 8 bytes an element) fits in `isize`.
pub const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// Number of elements of `shape`, or `None` on overflow. A shape with a size 0 anywhere has 0
/// elements, however large its other sizes.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Bytes of `shape` stored as `dtype`, checked: numel × size, with at most [`MAX_ELEMENTS`]
/// elements (so at most `isize::MAX` bytes). The error names the shape and the dtype.
pub fn checked_bytes(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_numel(shape)
        .filter(|&n| n <= MAX_ELEMENTS)
        .map(|n| n * dtype.size_in_bytes())
        .ok_or_else(|| Error::size_overflow(shape, dtype))
}

/// The element count of `shape` when a layout may span it (at most [`MAX_ELEMENTS`]).
#[inline]
fn layout_numel(shape: &[usize]) -> Result<usize> {
    checked_numel(shape)
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| Error::size_overflow(shape, DType::U8))
}

/// Row-major strides of a contiguous tensor of `shape`. Size-0 and size-1 dimensions count as
/// size 1; a stride beyond `usize::MAX` (possible only for an empty shape) saturates.
pub fn contiguous_strides(shape: &[usize]) -> Dims {
    let mut strides: Dims = SmallVec::from_elem(0, shape.len());
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    strides
}

/// The broadcast of two shapes (numpy rules), or a shape error naming both.
///
/// ```
/// use cartage_core::broadcast_shapes;
/// assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap().as_slice(), &[3, 4]);
/// assert!(broadcast_shapes(&[3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = SmallVec::from_elem(0, rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op: "broadcast",
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                    reason: format!(
                        "dimension {i} (from the right: {}) is {da} against {db}; sizes must match or one of them be 1",
                        rank - i
                    ),
                });
            }
        };
    }
    Ok(out)
}

/// Resolve a possibly negative dimension against `rank`.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let r = isize::try_from(rank).unwrap_or(isize::MAX);
    let d = if dim < 0 { dim.checked_add(r).unwrap_or(-1) } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// Several operands of one shape after [`coalesce`]: the merged sizes and each operand's
/// strides over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coalesced {
    /// The merged sizes: no size-1 dimension, `[]` for one element, `[0]` for no element.
    pub shape: Dims,
    /// Per operand (in the order given), its strides over `shape`.
    pub strides: SmallVec<[Dims; 4]>,
}

impl Coalesced {
    /// Number of elements (saturating at `usize::MAX` for a shape no layout could have).
    #[inline]
    pub fn numel(&self) -> usize {
        checked_numel(&self.shape).unwrap_or(usize::MAX)
    }
}

/// Merge the dimensions of `shape` that are adjacent in memory for *every* operand at once
/// (`strides[k]` is operand `k`'s strides over `shape`) and drop size-1 dimensions, keeping the
/// row-major order of elements: the element at each row-major position has the same offset in
/// the result as before, for every operand. Strided kernels then run fewer, longer loops, and
/// dense operands become rank 1.
///
/// The result is canonical: one element (rank 0 or all sizes 1) gives shape `[]`; any size-0
/// dimension gives shape `[0]` with stride 1 for every operand (no element is ever addressed);
/// dimension `d` merges into the one before it when, for every operand, the outer stride equals
/// `stride[d] × size[d]`. A missing stride (a list shorter than `shape`) reads as 0.
///
/// ```
/// use cartage_core::layout::coalesce;
/// // An output [2, 3, 4] dense, an input broadcast along the middle dimension.
/// let c = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[4, 0, 1]]);
/// assert_eq!(c.shape.as_slice(), &[2, 3, 4]);
/// let c = coalesce(&[2, 1, 3, 4], &[&[12, 12, 4, 1], &[12, 0, 4, 1]]);
/// assert_eq!((c.shape.as_slice(), c.strides[1].as_slice()), (&[24][..], &[1][..]));
/// ```
pub fn coalesce(shape: &[usize], strides: &[&[usize]]) -> Coalesced {
    let operands = strides.len();
    let mut out = Coalesced {
        shape: Dims::new(),
        strides: SmallVec::from_elem(Dims::new(), operands),
    };
    if shape.contains(&0) {
        out.shape.push(0);
        for s in &mut out.strides {
            s.push(1);
        }
        return out;
    }
    let stride = |k: usize, d: usize| strides[k].get(d).copied().unwrap_or(0);
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        if let Some(last) = out.shape.last_mut()
            && (0..operands).all(|k| out.strides[k].last().copied() == stride(k, d).checked_mul(size))
        {
            *last *= size;
            for (k, s) in out.strides.iter_mut().enumerate() {
                if let Some(outer) = s.last_mut() {
                    *outer = stride(k, d);
                }
            }
            continue;
        }
        out.shape.push(size);
        for (k, s) in out.strides.iter_mut().enumerate() {
            s.push(stride(k, d));
        }
    }
    out
}

/// True when no two distinct indices of `shape` reach the same element through `strides`:
/// the dimensions sorted by stride, each stride must clear the extent of the dimensions below
/// it. A sufficient test (it may say `false` for an interleaved view that does not overlap,
/// never `true` for one that does). Empty shapes and size-1 dimensions never overlap.
pub fn is_non_overlapping(shape: &[usize], strides: &[usize]) -> bool {
    let mut order: SmallVec<[(usize, usize); 6]> = SmallVec::new();
    for (d, &n) in shape.iter().enumerate() {
        if n == 0 {
            return true;
        }
        if n > 1 {
            order.push((strides.get(d).copied().unwrap_or(0), n));
        }
    }
    if order.len() > 1 {
        order.sort_unstable();
    }
    let mut extent = 1usize;
    for &(s, n) in &order {
        if s < extent {
            return false;
        }
        extent = s.saturating_mul(n - 1).saturating_add(extent);
    }
    true
}

/// Shape, strides (elements) and offset (elements) of a strided view.
///
/// Every constructor refuses a layout that spans more than [`MAX_ELEMENTS`] elements, so
/// [`Layout::numel`], [`Layout::extent`] and byte sizes derived from them never overflow.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

impl Clone for Layout {
    /// A plain copy of the inline sizes and strides (SmallVec's own `Clone` goes element by
    /// element; every op clones layouts, so this is on the tiny-op path).
    #[inline]
    fn clone(&self) -> Self {
        Layout {
            shape: copy_dims(&self.shape),
            strides: copy_dims(&self.strides),
            offset: self.offset,
        }
    }
}

/// A copy of `dims` through a fixed-size buffer when it fits inline: fixed-size moves instead
/// of a variable-length `memcpy` call (whose partial writes then stall the wider loads).
#[inline]
fn copy_dims(dims: &Dims) -> Dims {
    const INLINE: usize = 6;
    if dims.len() > INLINE {
        return SmallVec::from_slice(dims);
    }
    let mut buffer = [0usize; INLINE];
    for (slot, &d) in buffer.iter_mut().zip(dims.iter()) {
        *slot = d;
    }
    SmallVec::from_buf_and_len(buffer, dims.len())
}

/// One past the largest element offset `shape`/`strides`/`offset` reach (0 when empty), or
/// `None` when it overflows `usize`.
#[inline]
fn extent_of(shape: &[usize], strides: &[usize], offset: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = offset;
    for (&d, &s) in shape.iter().zip(strides) {
        last = last.checked_add((d - 1).checked_mul(s)?)?;
    }
    last.checked_add(1)
}

impl Layout {
    /// A contiguous row-major layout of `shape`; fails ([`Error::SizeOverflow`]) when it has
    /// more than [`MAX_ELEMENTS`] elements. An empty shape (a size 0 anywhere) is always valid.
    pub fn contiguous(shape: &[usize]) -> Result<Layout> {
        layout_numel(shape)?;
        Ok(Layout {
            shape: SmallVec::from_slice(shape),
            strides: contiguous_strides(shape),
            offset: 0,
        })
    }

    /// A layout from explicit parts. Fails when the lengths differ, or when the element count
    /// or the extent (offset of the last element reached, plus one) exceeds [`MAX_ELEMENTS`].
    pub fn from_parts(shape: &[usize], strides: &[usize], offset: usize) -> Result<Layout> {
        if shape.len() != strides.len() {
            return Err(Error::invalid(
                "layout",
                format!("{} sizes but {} strides", shape.len(), strides.len()),
            ));
        }
        layout_numel(shape)?;
        if extent_of(shape, strides, offset).is_none_or(|e| e > MAX_ELEMENTS) {
            return Err(Error::invalid(
                "layout",
                format!(
                    "shape {shape:?} with strides {strides:?} from offset {offset} reaches beyond element \
                     {MAX_ELEMENTS}, the most a layout may address"
                ),
            ));
        }
        Ok(Layout {
            shape: SmallVec::from_slice(shape),
            strides: SmallVec::from_slice(strides),
            offset,
        })
    }

    /// The sizes.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements (0 for a broadcast dimension).
    #[inline]
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of the first element, in elements.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (at most [`MAX_ELEMENTS`], checked at construction).
    #[inline]
    pub fn numel(&self) -> usize {
        // A partial product can only overflow before a later size 0: then the layout is empty.
        self.shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(0)
    }

    /// One past the largest element index this layout reaches (0 when empty). A buffer must
    /// hold at least this many elements. Always `Some` (the extent is checked at construction);
    /// kept for callers that check anyway.
    #[inline]
    pub fn checked_extent(&self) -> Option<usize> {
        extent_of(&self.shape, &self.strides, self.offset)
    }

    /// One past the largest element index this layout reaches (0 when empty); at most
    /// [`MAX_ELEMENTS`].
    #[inline]
    pub fn extent(&self) -> usize {
        self.checked_extent().unwrap_or(usize::MAX)
    }

    /// True when elements are row-major and dense (size-1 dimensions may have any stride; an
    /// empty layout is contiguous).
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for i in (0..self.rank()).rev() {
            if self.shape[i] == 1 {
                continue;
            }
            if self.strides[i] != expected {
                return self.shape.contains(&0);
            }
            // Only an empty layout can wrap here (a non-empty one has at most MAX_ELEMENTS
            // elements), and an empty layout is contiguous whatever the comparisons say.
            expected = expected.wrapping_mul(self.shape[i]);
        }
        true
    }

    /// True when no two distinct indices reach the same element, so the view can be written
    /// (from several threads, too). Free for contiguous layouts; otherwise the dimensions are
    /// sorted by stride and each stride must clear the extent of those below it (see
    /// [`is_non_overlapping`]: a sufficient test, `false` only errs on the safe side).
    #[inline]
    pub fn is_non_overlapping(&self) -> bool {
        self.is_contiguous() || is_non_overlapping(&self.shape, &self.strides)
    }

    /// `Some((offset, numel))` when the view is one dense run of memory.
    pub fn contiguous_range(&self) -> Option<(usize, usize)> {
        self.is_contiguous().then(|| (self.offset, self.numel()))
    }

    /// True when some dimension of size > 1 has stride 0.
    pub fn is_broadcast(&self) -> bool {
        self.shape.iter().zip(&self.strides).any(|(&d, &s)| d > 1 && s == 0)
    }

    /// Swap two dimensions (a view).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Layout> {
        let rank = self.rank();
        if a >= rank || b >= rank {
            return Err(Error::DimOutOfRange {
                op: "transpose",
                dim: isize::try_from(a.max(b)).unwrap_or(isize::MAX),
                rank,
            });
        }
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// Reorder dimensions: output dimension `i` is input dimension `perm[i]` (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.rank();
        let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, rank);
        if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::invalid(
                "permute",
                format!("{perm:?} is not a permutation of 0..{rank}; each dimension must appear exactly once"),
            ));
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Keep `len` elements of dimension `dim` starting at `start` (a view).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        let rank = self.rank();
        if dim >= rank {
            return Err(Error::DimOutOfRange {
                op: "narrow",
                dim: isize::try_from(dim).unwrap_or(isize::MAX),
                rank,
            });
        }
        let size = self.shape[dim];
        if start > size {
            return Err(Error::invalid(
                "narrow",
                format!(
                    "start {start} is past the end of dimension {dim} of size {size} (a start must be at most {size})"
                ),
            ));
        }
        if len > size - start {
            return Err(Error::invalid(
                "narrow",
                format!(
                    "start {start} with length {len} runs past the end of dimension {dim} of size {size} \
                     (at most {} elements remain from {start})",
                    size - start
                ),
            ));
        }
        let mut l = self.clone();
        l.shape[dim] = len;
        if len > 0 {
            // start < size, so start × stride stays within the extent.
            l.offset += start * self.strides[dim];
        }
        Ok(l)
    }

    /// Broadcast to `shape` (numpy rules; new and size-1 dimensions get stride 0).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let rank = shape.len();
        let fail = || Error::ShapeMismatch {
            op: "broadcast_to",
            lhs: self.shape.to_vec(),
            rhs: shape.to_vec(),
            reason: "each dimension must equal the target or be 1, and the target may only add leading dimensions"
                .to_string(),
        };
        if rank < self.rank() {
            return Err(fail());
        }
        let lead = rank - self.rank();
        let mut strides: Dims = SmallVec::from_elem(0, rank);
        for i in 0..self.rank() {
            let (d, s) = (self.shape[i], self.strides[i]);
            strides[lead + i] = if d == shape[lead + i] {
                s
            } else if d == 1 {
                0
            } else {
                return Err(fail());
            };
        }
        layout_numel(shape)?;
        // The extent cannot grow (new dimensions have stride 0) unless a size-0 source is
        // broadcast, which needs equal sizes: then the target is empty too.
        Ok(Layout {
            shape: SmallVec::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// A view with a new shape of the same element count, when the strides allow it
    /// (always for contiguous data); `Ok(None)` when the data must be copied first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Option<Layout>> {
        let numel = checked_numel(shape).ok_or_else(|| Error::size_overflow(shape, DType::U8))?;
        if numel != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape.to_vec(),
                rhs: shape.to_vec(),
                reason: format!("{} elements cannot be viewed as {numel}", self.numel()),
            });
        }
        if self.is_contiguous() {
            return Ok(Some(Layout {
                shape: SmallVec::from_slice(shape),
                strides: contiguous_strides(shape),
                offset: self.offset,
            }));
        }
        // General case (non-empty, so no size is 0): split/merge runs of dimensions that are
        // mutually contiguous. Partial products stay at most `numel`.
        let old: SmallVec<[(usize, usize); 6]> = self
            .shape
            .iter()
            .copied()
            .zip(self.strides.iter().copied())
            .filter(|&(d, _)| d != 1)
            .collect();
        let mut strides: Dims = SmallVec::from_elem(0, shape.len());
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < shape.len() {
            if shape[ni] == 1 {
                strides[ni] = 1;
                ni += 1;
                continue;
            }
            if oi >= old.len() {
                return Ok(None);
            }
            // Gather a chunk of old dims whose product equals a chunk of new dims.
            let (mut oprod, mut nprod) = (old[oi].0, shape[ni]);
            let (ostart, nstart) = (oi, ni);
            while oprod != nprod {
                if oprod < nprod {
                    oi += 1;
                    if oi >= old.len() {
                        return Ok(None);
                    }
                    oprod *= old[oi].0;
                } else {
                    ni += 1;
                    if ni >= shape.len() {
                        return Ok(None);
                    }
                    nprod *= shape[ni];
                }
            }
            for k in ostart..oi {
                if old[k + 1].1.checked_mul(old[k + 1].0) != Some(old[k].1) {
                    return Ok(None);
                }
            }
            // Innermost new dimension first; each outer stride is within the old chunk's
            // extent, and the product past the outermost one is never formed.
            let mut stride = old[oi].1;
            for k in (nstart..=ni).rev() {
                strides[k] = stride;
                if k > nstart {
                    stride *= shape[k];
                }
            }
            oi += 1;
            ni += 1;
        }
        Ok(Some(Layout {
            shape: SmallVec::from_slice(shape),
            strides,
            offset: self.offset,
        }))
    }

    /// Remove dimension `dim`, which must have size 1 (a view).
    pub fn squeeze(&self, dim: usize) -> Result<Layout> {
        let rank = self.rank();
        if dim >= rank {
            return Err(Error::DimOutOfRange {
                op: "squeeze",
                dim: isize::try_from(dim).unwrap_or(isize::MAX),
                rank,
            });
        }
        if self.shape[dim] != 1 {
            return Err(Error::invalid(
                "squeeze",
                format!("dimension {dim} has size {}, not 1", self.shape[dim]),
            ));
        }
        let mut l = self.clone();
        l.shape.remove(dim);
        l.strides.remove(dim);
        Ok(l)
    }

    /// Insert a size-1 dimension at `dim` (`0..=rank`) (a view). An out-of-range `dim` is
    /// [`Error::DimOutOfRange`] naming this layout's rank.
    pub fn unsqueeze(&self, dim: usize) -> Result<Layout> {
        let rank = self.rank();
        if dim > rank {
            return Err(Error::DimOutOfRange {
                op: "unsqueeze",
                dim: isize::try_from(dim).unwrap_or(isize::MAX),
                rank,
            });
        }
        let mut l = self.clone();
        // Any stride is valid for a size-1 dimension; this one keeps contiguous data contiguous.
        let stride = if dim < rank {
            self.strides[dim].saturating_mul(self.shape[dim])
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride.max(1));
        Ok(l)
    }

    /// The same view with adjacent dimensions merged where memory allows and size-1
    /// dimensions dropped ([`coalesce`] of this one operand): fewer, longer loops for strided
    /// kernels. Element order is kept; one element gives rank 0, an empty view `[0]`.
    pub fn coalesced(&self) -> Layout {
        let Coalesced { shape, mut strides } = coalesce(&self.shape, &[&self.strides]);
        Layout {
            shape,
            strides: strides.pop().unwrap_or_default(),
            offset: self.offset,
        }
    }

    /// The element offsets of this view in row-major order.
    ///
    /// ```
    /// use cartage_core::Layout;
    /// let t = Layout::contiguous(&[2, 3]).unwrap().transpose(0, 1).unwrap();
    /// assert_eq!(t.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
    /// ```
    pub fn offsets(&self) -> StridedOffsets {
        StridedOffsets::new(self)
    }

    /// Element offset of the element at row-major position `linear` (`linear < numel`; a
    /// larger position wraps around each dimension, so the result is still within the extent).
    pub fn offset_of(&self, mut linear: usize) -> usize {
        let mut off = self.offset;
        for i in (0..self.rank()).rev() {
            let d = self.shape[i];
            if d == 0 {
                return off;
            }
            off += (linear % d) * self.strides[i];
            linear /= d;
        }
        off
    }
}

/// Iterator over the element offsets of a [`Layout`] in row-major order.
pub struct StridedOffsets {
    shape: Dims,
    strides: Dims,
    index: Dims,
    next: usize,
    remaining: usize,
}

impl StridedOffsets {
    fn new(layout: &Layout) -> Self {
        let c = layout.coalesced();
        let remaining = layout.numel();
        StridedOffsets {
            index: SmallVec::from_elem(0, c.rank()),
            shape: c.shape,
            strides: c.strides,
            next: c.offset,
            remaining,
        }
    }
}

impl Iterator for StridedOffsets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.next;
        for i in (0..self.shape.len()).rev() {
            self.index[i] += 1;
            if self.index[i] < self.shape[i] {
                self.next += self.strides[i];
                return Some(current);
            }
            self.next -= (self.shape[i] - 1) * self.strides[i];
            self.index[i] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedOffsets {}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn offsets(l: &Layout) -> Vec<usize> {
        l.offsets().collect()
    }

    #[test]
    fn views_compute_offsets() {
        let l = Layout::contiguous(&[2, 3, 4]).unwrap();
        assert!(l.is_contiguous());
        let p = l.permute(&[2, 0, 1]).unwrap();
        assert!(!p.is_contiguous());
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert_eq!(offsets(&p)[..4], [0, 4, 8, 12]);
        let n = l.narrow(2, 1, 2).unwrap();
        assert_eq!(offsets(&n), vec![1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22]);
        let b = Layout::contiguous(&[3, 1]).unwrap().broadcast_to(&[2, 3, 2]).unwrap();
        assert_eq!(offsets(&b), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        assert!(b.is_broadcast());
    }

    #[test]
    fn reshape_views_when_possible() {
        let l = Layout::contiguous(&[4, 6]).unwrap();
        let r = l.reshape(&[2, 2, 3, 2]).unwrap().unwrap();
        assert!(r.is_contiguous());
        let t = l.transpose(0, 1).unwrap();
        assert!(t.reshape(&[24]).unwrap().is_none());
        let n = Layout::contiguous(&[4, 6]).unwrap().narrow(1, 0, 3).unwrap();
        let split = n.reshape(&[2, 2, 3]).unwrap().unwrap();
        assert_eq!(offsets(&split), offsets(&n));
        assert!(l.reshape(&[5, 5]).is_err());
    }

    #[test]
    fn overflow_and_errors_are_typed() {
        assert!(Layout::contiguous(&[usize::MAX, 2]).is_err());
        assert!(checked_bytes(&[usize::MAX / 2, 1], DType::F32).is_err());
        let l = Layout::contiguous(&[2, 3]).unwrap();
        assert!(l.narrow(1, 2, 2).is_err());
        assert!(l.permute(&[0, 0]).is_err());
        assert!(l.transpose(0, 2).is_err());
        assert!(l.squeeze(0).is_err());
        assert_eq!(resolve_dim("x", -1, 2).unwrap(), 1);
        assert!(resolve_dim("x", 2, 2).is_err());
        assert!(resolve_dim("x", isize::MIN, 2).is_err());
        assert!(resolve_dim("x", isize::MAX, 2).is_err());
    }

    #[test]
    fn no_layout_spans_more_than_max_elements() {
        // Element counts: refused above the limit, whatever the dtype will be.
        assert!(Layout::contiguous(&[MAX_ELEMENTS]).is_ok());
        let err = Layout::contiguous(&[MAX_ELEMENTS + 1]).unwrap_err();
        assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
        assert!(Layout::contiguous(&[1 << 31, 1 << 31, 1 << 2]).is_err());
        let scalar = Layout::contiguous(&[]).unwrap();
        assert!(scalar.broadcast_to(&[usize::MAX]).is_err());
        assert!(scalar.broadcast_to(&[1 << 40, 1 << 40]).is_err());
        let wide = scalar.broadcast_to(&[MAX_ELEMENTS]).unwrap();
        assert_eq!(wide.numel() * 8, MAX_ELEMENTS * 8, "a byte count of any dtype fits");
        assert_eq!(wide.extent(), 1);
        // Extents: from_parts refuses strides that reach past the limit or overflow.
        assert!(Layout::from_parts(&[2], &[MAX_ELEMENTS], 0).is_err());
        assert!(Layout::from_parts(&[3], &[usize::MAX / 2 + 1], 0).is_err());
        assert!(Layout::from_parts(&[2], &[1], usize::MAX).is_err());
        assert!(Layout::from_parts(&[2, 2], &[1], 0).is_err());
        let edge = Layout::from_parts(&[2], &[MAX_ELEMENTS - 1], 0).unwrap();
        assert_eq!(edge.extent(), MAX_ELEMENTS);
        // Views of a valid layout stay valid and their size methods do not overflow.
        let u = edge.unsqueeze(0).unwrap();
        assert_eq!(u.shape(), &[1, 2]);
        assert!(u.is_non_overlapping());
        assert_eq!(edge.reshape(&[2, 1]).unwrap().unwrap().extent(), MAX_ELEMENTS);
        // byte counts: checked_bytes agrees with the layout limit for every dtype.
        assert!(checked_bytes(&[MAX_ELEMENTS + 1], DType::U8).is_err());
        assert_eq!(checked_bytes(&[MAX_ELEMENTS], DType::F64).unwrap(), MAX_ELEMENTS * 8);
    }

    #[test]
    fn empty_layouts_with_huge_sizes_are_valid() {
        for shape in [[0, 1 << 40, 1 << 40], [1 << 40, 1 << 40, 0], [1 << 40, 0, 1 << 40]] {
            let l = Layout::contiguous(&shape).unwrap();
            assert_eq!(l.numel(), 0, "{shape:?}");
            assert_eq!(l.extent(), 0);
            assert!(l.is_contiguous());
            assert!(l.is_non_overlapping());
            assert_eq!(checked_numel(&shape), Some(0));
            assert_eq!(checked_bytes(&shape, DType::F64).unwrap(), 0);
            assert_eq!(offsets(&l), Vec::<usize>::new());
            let t = l.transpose(0, 2).unwrap();
            assert_eq!(t.numel(), 0);
            assert!(t.is_contiguous());
            for d in 0..=3 {
                assert_eq!(l.unsqueeze(d).unwrap().numel(), 0);
            }
            let r = l.reshape(&[0]).unwrap().unwrap();
            assert_eq!(r.shape(), &[0]);
            assert_eq!(l.coalesced().shape(), &[0]);
            assert_eq!(l.permute(&[2, 1, 0]).unwrap().numel(), 0);
        }
    }

    #[test]
    fn narrow_and_unsqueeze_errors_name_the_argument() {
        let l = Layout::contiguous(&[2, 3]).unwrap();
        let err = l.narrow(1, 7, 1).unwrap_err().to_string();
        assert!(err.contains("start 7") && err.contains("size 3"), "{err}");
        let err = l.narrow(1, 1, usize::MAX).unwrap_err().to_string();
        assert!(
            err.contains("start 1") && err.contains(&usize::MAX.to_string()),
            "{err}"
        );
        assert!(l.narrow(1, 3, 0).is_ok(), "an empty range at the end is valid");
        match l.unsqueeze(3).unwrap_err() {
            Error::DimOutOfRange { dim, rank, .. } => assert_eq!((dim, rank), (3, 2)),
            other => panic!("{other}"),
        }
        assert!(l.transpose(usize::MAX, 0).is_err());
    }

    #[test]
    fn coalesce_keeps_order() {
        let l = Layout::contiguous(&[2, 1, 3, 4]).unwrap();
        assert_eq!(l.coalesced().shape(), &[24]);
        let t = l.narrow(3, 0, 2).unwrap();
        assert_eq!(offsets(&t), offsets(&t.coalesced()));
        let e = Layout::contiguous(&[2, 0, 3]).unwrap();
        assert_eq!(offsets(&e), Vec::<usize>::new());
        assert_eq!(e.extent(), 0);
        let s = Layout::contiguous(&[]).unwrap();
        assert_eq!(offsets(&s), vec![0]);
        assert_eq!(s.extent(), 1);
    }

    #[test]
    fn coalesce_merges_only_what_every_operand_allows() {
        let c = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(c.shape.as_slice(), &[24]);
        assert_eq!(c.strides.as_slice(), &[Dims::from_slice(&[1]), Dims::from_slice(&[1])]);
        // A row broadcast over dimension 0 blocks that merge only.
        let c = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[0, 4, 1]]);
        assert_eq!(c.shape.as_slice(), &[2, 12]);
        assert_eq!(c.strides[1].as_slice(), &[0, 1]);
        // A transposed operand blocks every merge.
        let c = coalesce(&[4, 5], &[&[5, 1], &[1, 4]]);
        assert_eq!(c.shape.as_slice(), &[4, 5]);
        // Size-1 dimensions vanish whatever their stride; a fully broadcast operand merges.
        let c = coalesce(&[2, 1, 3], &[&[3, 99, 1], &[0, 7, 0]]);
        assert_eq!(c.shape.as_slice(), &[6]);
        assert_eq!(c.strides[1].as_slice(), &[0]);
        // One element: rank 0. No element: [0] with stride 1, whatever the other sizes.
        let c = coalesce(&[1, 1], &[&[5, 3]]);
        assert!(c.shape.is_empty() && c.strides[0].is_empty());
        assert_eq!(c.numel(), 1);
        let c = coalesce(&[], &[&[], &[]]);
        assert!(c.shape.is_empty() && c.strides.len() == 2);
        for shape in [[3, 0], [0, 3]] {
            let c = coalesce(&shape, &[&[0, 1], &[3, 1]]);
            assert_eq!((c.shape.as_slice(), c.numel()), (&[0][..], 0));
            assert!(c.strides.iter().all(|s| s.as_slice() == [1]));
        }
        // No operand: plain dropping of size-1 dimensions and merging.
        assert_eq!(coalesce(&[2, 1, 3], &[]).shape.as_slice(), &[6]);
        // A stride product that would overflow does not merge.
        let c = coalesce(&[2, 3], &[&[usize::MAX, usize::MAX / 2]]);
        assert_eq!(c.shape.as_slice(), &[2, 3]);
        // Missing strides read as 0 instead of panicking.
        assert_eq!(coalesce(&[2, 3], &[&[3]]).strides[0].as_slice(), &[3, 0]);
    }

    #[test]
    fn overlap_detection() {
        let ok = |shape: &[usize], strides: &[usize]| is_non_overlapping(shape, strides);
        assert!(ok(&[3, 4], &[4, 1]));
        assert!(ok(&[3, 4], &[1, 3]));
        assert!(!ok(&[3, 4], &[0, 1]));
        assert!(!ok(&[3, 3], &[1, 1]));
        assert!(ok(&[3, 1], &[1, 0]));
        assert!(ok(&[0, 5], &[0, 0]));
        assert!(ok(&[], &[]));
        assert!(!ok(&[2], &[0]));
        assert!(ok(&[2, 2], &[usize::MAX / 2, 1]));
        let l = Layout::contiguous(&[4, 6]).unwrap();
        assert!(l.is_non_overlapping());
        assert!(l.transpose(0, 1).unwrap().is_non_overlapping());
        assert!(l.narrow(1, 1, 3).unwrap().is_non_overlapping());
        assert!(
            !Layout::contiguous(&[6])
                .unwrap()
                .broadcast_to(&[4, 6])
                .unwrap()
                .is_non_overlapping()
        );
        assert!(
            Layout::contiguous(&[1])
                .unwrap()
                .broadcast_to(&[1, 1])
                .unwrap()
                .is_non_overlapping()
        );
    }

    /// A layout over a small buffer: a random view of random sizes (sizes 0..4, rank 0..5),
    /// strides either contiguous, permuted, narrowed, broadcast or arbitrary.
    fn arb_shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..4, 0..5)
    }

    /// Strides for `shape`: contiguous, a permutation of contiguous, broadcast in some
    /// dimensions, or arbitrary small values.
    fn arb_strides(shape: Vec<usize>) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        let rank = shape.len();
        let contiguous = contiguous_strides(&shape).to_vec();
        (
            0u8..4,
            prop::collection::vec(0usize..24, rank),
            prop::collection::vec(any::<bool>(), rank),
            Just(shape),
        )
            .prop_map(move |(kind, random, zero, shape)| {
                let strides = match kind {
                    0 => contiguous.clone(),
                    1 => contiguous.iter().rev().copied().collect(),
                    2 => contiguous
                        .iter()
                        .zip(&zero)
                        .map(|(&s, &z)| if z { 0 } else { s })
                        .collect(),
                    _ => random,
                };
                (shape, strides)
            })
    }

    /// Row-major position `linear` of `shape` through `strides` (no offset).
    fn naive_offset(shape: &[usize], strides: &[usize], mut linear: usize) -> usize {
        let mut off = 0;
        for i in (0..shape.len()).rev() {
            off += (linear % shape[i]) * strides[i];
            linear /= shape[i];
        }
        off
    }

    proptest! {
        #[test]
        fn coalesce_preserves_the_offset_of_every_index(
            (shape, operands) in arb_shape().prop_flat_map(|shape| {
                let one = arb_strides(shape.clone());
                prop::collection::vec(one, 1..4).prop_map(move |v| {
                    (shape.clone(), v.into_iter().map(|(_, s)| s).collect::<Vec<_>>())
                })
            })
        ) {
            let refs: Vec<&[usize]> = operands.iter().map(Vec::as_slice).collect();
            let c = coalesce(&shape, &refs);
            let numel: usize = shape.iter().product();
            prop_assert_eq!(c.numel(), numel);
            prop_assert_eq!(c.strides.len(), operands.len());
            prop_assert!(c.shape.len() <= shape.len().max(1));
            if numel == 0 {
                prop_assert_eq!(c.shape.as_slice(), &[0]);
            } else {
                prop_assert!(c.shape.iter().all(|&d| d > 1), "size-1 dims dropped: {:?}", c.shape);
            }
            for (k, strides) in operands.iter().enumerate() {
                prop_assert_eq!(c.strides[k].len(), c.shape.len());
                for i in 0..numel {
                    prop_assert_eq!(
                        naive_offset(&c.shape, &c.strides[k], i),
                        naive_offset(&shape, strides, i),
                        "operand {} position {}: {:?} {:?} -> {:?}", k, i, shape, strides, c
                    );
                }
            }
            // Coalescing again changes nothing.
            let again: Vec<&[usize]> = c.strides.iter().map(|s| s.as_slice()).collect();
            prop_assert_eq!(coalesce(&c.shape, &again), c.clone());
        }

        #[test]
        fn non_overlapping_layouts_reach_distinct_elements(
            (shape, strides) in arb_shape().prop_flat_map(arb_strides),
            offset in 0usize..5,
        ) {
            let layout = Layout::from_parts(&shape, &strides, offset).unwrap();
            let mut seen: Vec<usize> = layout.offsets().collect();
            prop_assert_eq!(seen.len(), layout.numel());
            prop_assert!(seen.iter().all(|&o| o < layout.extent()));
            seen.sort_unstable();
            let distinct = seen.windows(2).all(|w| w[0] != w[1]);
            if layout.is_non_overlapping() {
                prop_assert!(distinct, "{:?} claims no overlap", layout);
            }
            if layout.is_contiguous() {
                prop_assert!(layout.is_non_overlapping());
            }
            // Every element offset agrees with offset_of, and the coalesced view keeps them.
            let ordered: Vec<usize> = layout.offsets().collect();
            for (i, &o) in ordered.iter().enumerate() {
                prop_assert_eq!(layout.offset_of(i), o);
            }
            prop_assert_eq!(layout.coalesced().offsets().collect::<Vec<_>>(), ordered);
        }
    }
}
