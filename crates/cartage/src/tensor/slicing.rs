//! The arguments of slicing and reshaping: [`Tensor::i`] takes a [`SliceSpec`] (one item or a
//! tuple of up to eight), [`Tensor::reshape`] a [`ShapeArg`].
//!
//! # Slicing
//! `x.i((1..3, .., 2))` keeps rows 1 and 2, every column of the second dimension and drops the
//! third dimension at index 2. Each item of the tuple applies to one dimension, in order; the
//! dimensions after the last item are kept whole. The items are:
//! - a single index (`2`, `-1`): keeps that entry and drops the dimension; negative counts from
//!   the end;
//! - a range (`a..b`, `a..`, `..b`, `..`, `a..=b`, `..=b`): keeps `[a, b)` with step 1; negative
//!   bounds count from the end (`-2..` is the last two entries; write `1..-1` as
//!   `s(1, -1, 1)`, since clippy rejects a literal range that looks reversed);
//! - [`s(start, end, step)`](s): a range with a step, whose ends are integers or `None` (the
//!   whole side): `s(None, None, 2)` is every other entry, Python's `::2`.
//!
//! A slice is always a view (no copy): a step multiplies the stride. Bounds are strict — an
//! index outside the dimension is [`Error::IndexOutOfRange`], a range bound outside `[0, size]`
//! or a start after the end, and a step of 0 or below, are [`Error::InvalidArgument`] naming
//! the dimension and the value (reverse with [`Tensor::flip`]).
//!
//! ```
//! use cartage::{DType, Device, Tensor, s};
//! let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &Device::cpu())?.reshape(&[2, 3, 4])?;
//! let y = x.i((1, 1.., s(None, None, 2)))?;
//! assert_eq!(y.shape(), &[2, 2]);
//! assert_eq!(y.to_vec::<f32>()?, vec![16.0, 18.0, 20.0, 22.0]);
//! assert!(y.shares_storage(&x));
//! # Ok::<(), cartage::Error>(())
//! ```
//!
//! # Shapes
//! [`ShapeArg`] is implemented for slices, arrays and `Vec`s of `usize`, `isize`, `i32` and
//! `i64`, passed by reference: `x.reshape(&[2, 3])`, `x.reshape(&[-1, 4])`,
//! `x.reshape(&shape_vec)`, `x.reshape(shape_slice)`. One entry may be `-1`: it is inferred
//! from the element count.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

use cartage_core::{Dims, Error, Layout, Result};
use smallvec::SmallVec;

use super::Tensor;
use crate::autograd::{formulas, graph};

/// One entry of a shape argument: a size, or `-1` (inferred), or a value that is neither.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeEntry {
    /// A size.
    Size(usize),
    /// `-1`: the size that makes the element count match.
    Infer,
    /// A negative value other than `-1` (an error).
    Bad(i64),
}

mod sealed {
    /// Implemented for the integer types a shape or an index may be written with.
    pub trait Sealed {}
}

/// An integer a shape may be written with: `usize`, `isize`, `i32`, `i64`.
pub trait ShapeInt: Copy + sealed::Sealed {
    #[doc(hidden)]
    fn entry(self) -> ShapeEntry;
}

macro_rules! shape_int_signed {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl ShapeInt for $t {
            fn entry(self) -> ShapeEntry {
                match self {
                    -1 => ShapeEntry::Infer,
                    v if v < 0 => ShapeEntry::Bad(v as i64),
                    v => ShapeEntry::Size(v as usize),
                }
            }
        }
    )*};
}
shape_int_signed!(isize, i32, i64);

impl sealed::Sealed for usize {}
impl ShapeInt for usize {
    fn entry(self) -> ShapeEntry {
        ShapeEntry::Size(self)
    }
}

/// A target shape for [`Tensor::reshape`]: sizes, with at most one `-1` to infer.
pub trait ShapeArg {
    #[doc(hidden)]
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]>;
}

impl<T: ShapeInt> ShapeArg for [T] {
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]> {
        self.iter().map(|v| v.entry()).collect()
    }
}

impl<T: ShapeInt, const N: usize> ShapeArg for [T; N] {
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]> {
        self.as_slice().entries()
    }
}

impl<T: ShapeInt> ShapeArg for Vec<T> {
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]> {
        self.as_slice().entries()
    }
}

impl ShapeArg for Dims {
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]> {
        self.as_slice().entries()
    }
}

impl<S: ShapeArg + ?Sized> ShapeArg for &S {
    fn entries(&self) -> SmallVec<[ShapeEntry; 6]> {
        (**self).entries()
    }
}

/// The concrete shape `spec` gives for `numel` elements (`op` names the caller in errors).
pub(super) fn resolve_shape(op: &'static str, spec: &[ShapeEntry], from: &[usize], numel: usize) -> Result<Dims> {
    let mut infer = None;
    let mut known = 1usize;
    let mut shape = Dims::with_capacity(spec.len());
    for (i, entry) in spec.iter().enumerate() {
        match *entry {
            ShapeEntry::Size(v) => {
                shape.push(v);
                known = known.saturating_mul(v);
            }
            ShapeEntry::Infer if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            ShapeEntry::Infer => {
                return Err(Error::invalid(
                    op,
                    format!("dimension {i} is a second -1; at most one size may be inferred"),
                ));
            }
            ShapeEntry::Bad(v) => {
                return Err(Error::invalid(
                    op,
                    format!("dimension {i} has size {v}; sizes must be ≥ 0, or -1 for one inferred size"),
                ));
            }
        }
    }
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::ShapeMismatch {
                op,
                lhs: from.to_vec(),
                rhs: shape.to_vec(),
                reason: format!(
                    "{numel} elements cannot fill the other sizes (product {known}) a whole number of times, \
                     so the -1 at dimension {i} has no size"
                ),
            });
        }
        shape[i] = numel / known;
    }
    Ok(shape)
}

/// One item of a slice: what to keep of one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceItem {
    /// One entry; the dimension is dropped. Negative counts from the end.
    Index(i64),
    /// Entries `start, start + step, …` below `end` (`None`: from the start / to the end).
    /// Negative bounds count from the end.
    Range {
        /// First entry (`None`: 0).
        start: Option<i64>,
        /// One past the last entry (`None`: the size).
        end: Option<i64>,
        /// Distance between kept entries; must be ≥ 1.
        step: i64,
    },
}

/// A range with a step, for [`Tensor::i`]: `s(1, None, 2)` is Python's `1::2`. The ends are
/// integers or `None`; a negative end counts from the end of the dimension.
///
/// ```
/// use cartage::{DType, Device, Tensor, s};
/// let x = Tensor::arange(0.0, 10.0, 1.0, DType::I64, &Device::cpu())?;
/// assert_eq!(x.i(s(1, None, 3))?.to_vec::<i64>()?, vec![1, 4, 7]);
/// assert_eq!(x.i(s(None, -5, 2))?.to_vec::<i64>()?, vec![0, 2, 4]);
/// # Ok::<(), cartage::Error>(())
/// ```
pub fn s(start: impl SliceBound, end: impl SliceBound, step: i64) -> SliceItem {
    SliceItem::Range {
        start: start.bound(),
        end: end.bound(),
        step,
    }
}

/// One end of an [`s`] range: an integer, or `None` for the whole side.
pub trait SliceBound {
    /// The bound (`None`: open).
    fn bound(self) -> Option<i64>;
}

macro_rules! slice_bound {
    ($($t:ty),*) => {$(
        impl SliceBound for $t {
            fn bound(self) -> Option<i64> {
                Some(i64::try_from(self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
slice_bound!(isize, i32, i64, usize);

impl SliceBound for Option<i64> {
    fn bound(self) -> Option<i64> {
        self
    }
}

/// Something that selects from one dimension: an integer, a range, or a [`SliceItem`].
pub trait SliceArg {
    /// The item.
    fn item(&self) -> SliceItem;
}

impl SliceArg for SliceItem {
    fn item(&self) -> SliceItem {
        *self
    }
}

impl SliceArg for RangeFull {
    fn item(&self) -> SliceItem {
        SliceItem::Range {
            start: None,
            end: None,
            step: 1,
        }
    }
}

macro_rules! slice_arg_int {
    ($($t:ty),*) => {$(
        impl SliceArg for $t {
            fn item(&self) -> SliceItem {
                SliceItem::Index(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
        impl SliceArg for Range<$t> {
            fn item(&self) -> SliceItem {
                SliceItem::Range {
                    start: Some(i64::try_from(self.start).unwrap_or(i64::MAX)),
                    end: Some(i64::try_from(self.end).unwrap_or(i64::MAX)),
                    step: 1,
                }
            }
        }
        impl SliceArg for RangeFrom<$t> {
            fn item(&self) -> SliceItem {
                SliceItem::Range { start: Some(i64::try_from(self.start).unwrap_or(i64::MAX)), end: None, step: 1 }
            }
        }
        impl SliceArg for RangeTo<$t> {
            fn item(&self) -> SliceItem {
                SliceItem::Range { start: None, end: Some(i64::try_from(self.end).unwrap_or(i64::MAX)), step: 1 }
            }
        }
        impl SliceArg for RangeInclusive<$t> {
            fn item(&self) -> SliceItem {
                let end = i64::try_from(*self.end()).unwrap_or(i64::MAX);
                // `a..=-1` is up to and including the last entry.
                SliceItem::Range {
                    start: Some(i64::try_from(*self.start()).unwrap_or(i64::MAX)),
                    end: if end == -1 { None } else { Some(end.saturating_add(1)) },
                    step: 1,
                }
            }
        }
        impl SliceArg for RangeToInclusive<$t> {
            fn item(&self) -> SliceItem {
                let end = i64::try_from(self.end).unwrap_or(i64::MAX);
                SliceItem::Range {
                    start: None,
                    end: if end == -1 { None } else { Some(end.saturating_add(1)) },
                    step: 1,
                }
            }
        }
        impl SliceSpec for $t {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
        impl SliceSpec for Range<$t> {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
        impl SliceSpec for RangeFrom<$t> {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
        impl SliceSpec for RangeTo<$t> {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
        impl SliceSpec for RangeInclusive<$t> {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
        impl SliceSpec for RangeToInclusive<$t> {
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                SmallVec::from_elem(self.item(), 1)
            }
        }
    )*};
}
slice_arg_int!(isize, i32, i64, usize);

/// What [`Tensor::i`] takes: one [`SliceArg`], a tuple of up to eight, or a slice of
/// [`SliceItem`]s built at run time.
pub trait SliceSpec {
    /// One item per leading dimension.
    fn items(&self) -> SmallVec<[SliceItem; 6]>;
}

impl SliceSpec for SliceItem {
    fn items(&self) -> SmallVec<[SliceItem; 6]> {
        SmallVec::from_elem(*self, 1)
    }
}

impl SliceSpec for RangeFull {
    fn items(&self) -> SmallVec<[SliceItem; 6]> {
        SmallVec::from_elem(self.item(), 1)
    }
}

impl SliceSpec for [SliceItem] {
    fn items(&self) -> SmallVec<[SliceItem; 6]> {
        SmallVec::from_slice(self)
    }
}

impl SliceSpec for Vec<SliceItem> {
    fn items(&self) -> SmallVec<[SliceItem; 6]> {
        SmallVec::from_slice(self)
    }
}

impl<S: SliceSpec + ?Sized> SliceSpec for &S {
    fn items(&self) -> SmallVec<[SliceItem; 6]> {
        (**self).items()
    }
}

macro_rules! slice_tuple {
    ($($name:ident),+) => {
        impl<$($name: SliceArg),+> SliceSpec for ($($name,)+) {
            #[allow(non_snake_case)]
            fn items(&self) -> SmallVec<[SliceItem; 6]> {
                let ($($name,)+) = self;
                let mut items = SmallVec::new();
                $(items.push($name.item());)+
                items
            }
        }
    };
}
slice_tuple!(A);
slice_tuple!(A, B);
slice_tuple!(A, B, C);
slice_tuple!(A, B, C, D);
slice_tuple!(A, B, C, D, E);
slice_tuple!(A, B, C, D, E, F);
slice_tuple!(A, B, C, D, E, F, G);
slice_tuple!(A, B, C, D, E, F, G, H);

impl Tensor {
    /// Slice with ranges, steps and single indices, one item per leading dimension: a view,
    /// never a copy. See the [module docs](self) for the items and the errors.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 12.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[3, 4])?;
    /// assert_eq!(x.i((1..3, ..2))?.to_vec::<i64>()?, vec![4, 5, 8, 9]);
    /// assert_eq!(x.i((-1, 1..=2))?.to_vec::<i64>()?, vec![9, 10]);
    /// assert_eq!(x.i((.., 3))?.shape(), &[3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn i(&self, spec: impl SliceSpec) -> Result<Tensor> {
        let items = spec.items();
        let rank = self.rank();
        if items.len() > rank {
            return Err(Error::invalid(
                "i",
                format!(
                    "{} slice items for a tensor of rank {rank} (shape {:?}); give at most one item per dimension",
                    items.len(),
                    self.shape()
                ),
            ));
        }
        let (shape, strides) = (self.layout.shape(), self.layout.strides());
        let mut offset = self.layout.offset();
        let mut out_shape = Dims::new();
        let mut out_strides = Dims::new();
        let mut empty = false;
        for (d, item) in items.iter().enumerate() {
            let size = shape[d];
            match *item {
                SliceItem::Index(i) => {
                    let at = resolve_index("i", i, d, size, self)?;
                    offset += at * strides[d];
                }
                SliceItem::Range { start, end, step } => {
                    if step <= 0 {
                        return Err(Error::invalid(
                            "i",
                            format!("dimension {d}: step {step} must be ≥ 1 (reverse a dimension with `flip`)"),
                        ));
                    }
                    let lo = resolve_bound(d, "start", start, 0, size)?;
                    let hi = resolve_bound(d, "end", end, size, size)?;
                    if lo > hi {
                        return Err(Error::invalid(
                            "i",
                            format!("dimension {d} of size {size}: start {lo} is after end {hi}"),
                        ));
                    }
                    let len = (hi - lo).div_ceil(step as usize);
                    if len == 0 {
                        empty = true;
                    } else {
                        offset += lo * strides[d];
                    }
                    out_shape.push(len);
                    out_strides.push(strides[d].saturating_mul(step as usize));
                }
            }
        }
        out_shape.extend_from_slice(&shape[items.len()..]);
        out_strides.extend_from_slice(&strides[items.len()..]);
        if empty {
            offset = self.layout.offset();
        }
        let layout = Layout::from_parts(&out_shape, &out_strides, offset)?;
        let out = self.with_layout(layout);
        Ok(graph::record(out, "i", &[self], |_| {
            formulas::view::picked(self, move |z| z.i(items.as_slice()))
        }))
    }
}

/// A single index `i` into dimension `dim` of `size` (negative counts from the end).
pub(super) fn resolve_index(op: &'static str, i: i64, dim: usize, size: usize, t: &Tensor) -> Result<usize> {
    let resolved = if i < 0 { i + size as i64 } else { i };
    if resolved < 0 || resolved >= size as i64 {
        return Err(Error::IndexOutOfRange {
            op,
            index: i,
            dim,
            size,
            device: t.device,
        });
    }
    Ok(resolved as usize)
}

/// A range bound (`None`: `default`), negative from the end, which must lie in `[0, size]`.
fn resolve_bound(dim: usize, which: &str, bound: Option<i64>, default: usize, size: usize) -> Result<usize> {
    let Some(b) = bound else {
        return Ok(default);
    };
    let resolved = if b < 0 { b + size as i64 } else { b };
    if resolved < 0 || resolved > size as i64 {
        return Err(Error::invalid(
            "i",
            format!(
                "dimension {dim} of size {size}: range {which} {b} is out of range (a bound must lie in \
                 [-{size}, {size}])"
            ),
        ));
    }
    Ok(resolved as usize)
}
