//! [`Layout`]: shape, strides and offset of a strided view, all in elements.
//!
//! A broadcast dimension has stride 0. Every size is overflow-checked. Views (transpose, permute,
//! narrow, broadcast, reshape of contiguous data, squeeze/unsqueeze) only build a new layout; no
//! method here touches data.

use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A short list of sizes or strides, inline up to rank 6.
pub type Dims = SmallVec<[usize; 6]>;

/// Number of elements of `shape`, or `None` on overflow.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Bytes of `shape` stored as `dtype`, checked (numel × size, R19), at most `isize::MAX`.
pub fn checked_bytes(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_numel(shape)
        .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype,
        })
}

/// Row-major strides of a contiguous tensor of `shape`.
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
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// Shape, strides (elements) and offset (elements) of a strided view.
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

impl Layout {
    /// A contiguous row-major layout of `shape`; fails if its element count overflows.
    pub fn contiguous(shape: &[usize]) -> Result<Layout> {
        if checked_numel(shape).is_none() {
            return Err(Error::SizeOverflow {
                shape: shape.to_vec(),
                dtype: DType::U8,
            });
        }
        Ok(Layout {
            shape: SmallVec::from_slice(shape),
            strides: contiguous_strides(shape),
            offset: 0,
        })
    }

    /// A layout from explicit parts. Checks that the reachable extent does not overflow.
    pub fn from_parts(shape: &[usize], strides: &[usize], offset: usize) -> Result<Layout> {
        if shape.len() != strides.len() {
            return Err(Error::invalid(
                "layout",
                format!("{} sizes but {} strides", shape.len(), strides.len()),
            ));
        }
        let layout = Layout {
            shape: SmallVec::from_slice(shape),
            strides: SmallVec::from_slice(strides),
            offset,
        };
        if checked_numel(shape).is_none() || layout.checked_extent().is_none() {
            return Err(Error::SizeOverflow {
                shape: shape.to_vec(),
                dtype: DType::U8,
            });
        }
        Ok(layout)
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

    /// Number of elements (checked at construction).
    #[inline]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// One past the largest element index this layout reaches (0 when empty), or `None` on
    /// overflow. A buffer must hold at least this many elements.
    #[inline]
    pub fn checked_extent(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }

    /// [`Layout::checked_extent`] for a layout known to be valid.
    pub fn extent(&self) -> usize {
        self.checked_extent().unwrap_or(usize::MAX)
    }

    /// True when elements are row-major and dense (size-1 dimensions may have any stride).
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for i in (0..self.rank()).rev() {
            if self.shape[i] == 1 {
                continue;
            }
            if self.strides[i] != expected {
                return self.numel() == 0;
            }
            expected *= self.shape[i];
        }
        true
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
                dim: a.max(b) as isize,
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
        let mut seen = vec![false; rank];
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
                dim: dim as isize,
                rank,
            });
        }
        let size = self.shape[dim];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::invalid(
                "narrow",
                format!(
                    "range {start}..{} is outside dimension {dim} of size {size}",
                    start.saturating_add(len)
                ),
            ));
        }
        let mut l = self.clone();
        l.shape[dim] = len;
        if len > 0 {
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
        if checked_numel(shape).is_none() {
            return Err(Error::SizeOverflow {
                shape: shape.to_vec(),
                dtype: DType::U8,
            });
        }
        Ok(Layout {
            shape: SmallVec::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// A view with a new shape of the same element count, when the strides allow it
    /// (always for contiguous data); `Ok(None)` when the data must be copied first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Option<Layout>> {
        let numel = checked_numel(shape).ok_or_else(|| Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype: DType::U8,
        })?;
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
        // General case: split/merge runs of dimensions that are mutually contiguous.
        let old: Vec<(usize, usize)> = self
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
                if old[k].1 != old[k + 1].1 * old[k + 1].0 {
                    return Ok(None);
                }
            }
            let mut stride = old[oi].1;
            for k in (nstart..=ni).rev() {
                strides[k] = stride;
                stride *= shape[k];
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
                dim: dim as isize,
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

    /// Insert a size-1 dimension at `dim` (0..=rank) (a view).
    pub fn unsqueeze(&self, dim: usize) -> Result<Layout> {
        let rank = self.rank();
        if dim > rank {
            return Err(Error::DimOutOfRange {
                op: "unsqueeze",
                dim: dim as isize,
                rank: rank + 1,
            });
        }
        let mut l = self.clone();
        let stride = if dim < rank {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride.max(1));
        Ok(l)
    }

    /// The same view with adjacent dimensions merged where memory allows and size-1
    /// dimensions dropped: fewer, longer loops for strided kernels. Element order is kept.
    pub fn coalesced(&self) -> Layout {
        let mut shape: Dims = SmallVec::new();
        let mut strides: Dims = SmallVec::new();
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            if d == 1 {
                continue;
            }
            if let (Some(&ld), Some(&ls)) = (shape.last(), strides.last())
                && ls == s * d
            {
                let n = shape.len();
                shape[n - 1] = ld * d;
                strides[n - 1] = s;
                continue;
            }
            shape.push(d);
            strides.push(s);
        }
        if self.numel() == 0 {
            return Layout {
                shape: SmallVec::from_slice(&[0]),
                strides: SmallVec::from_slice(&[1]),
                offset: self.offset,
            };
        }
        Layout {
            shape,
            strides,
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

    /// Element offset of the element at row-major position `linear`.
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
}
