//! Views: new layouts over the same storage, no data touched. `reshape` is a view whenever the
//! strides allow it; when they do not it copies, and says so (a `tracing` debug event with the
//! bytes and the call site, counted in `cartage::stats().implicit_copies`, R12).

use cartage_core::{Dims, Error, Result, resolve_dim};

use super::{Tensor, caller, check};
use crate::runtime;

impl Tensor {
    /// Swap dimensions `d0` and `d1` (negative counts from the end).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = resolve_dim("transpose", d0, self.rank())?;
        let b = resolve_dim("transpose", d1, self.rank())?;
        Ok(self.with_layout(self.layout.transpose(a, b)?))
    }

    /// Swap the last two dimensions (a tensor of rank below 2 is returned as is).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(-2, -1)
    }

    /// Reorder dimensions: output dimension `i` is input dimension `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.permute(perm)?))
    }

    /// Keep `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        Ok(self.with_layout(self.layout.narrow(d, start, len)?))
    }

    /// View with numpy broadcasting to `shape` (expanded dimensions get stride 0). A target of
    /// more elements than a layout may span is [`Error::SizeOverflow`] naming this dtype.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let layout = self.layout.broadcast_to(shape).map_err(|e| e.with_dtype(self.dtype))?;
        Ok(self.with_layout(layout))
    }

    /// Remove dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        Ok(self.with_layout(self.layout.squeeze(d)?))
    }

    /// Insert a dimension of size 1 at `dim` (`0..=rank`, negative counts from the end: -1
    /// appends). An out-of-range `dim` is [`Error::DimOutOfRange`] naming this tensor's rank.
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let rank = self.rank();
        let d = resolve_dim("unsqueeze", dim, rank + 1).map_err(|_| Error::DimOutOfRange {
            op: "unsqueeze",
            dim,
            rank,
        })?;
        Ok(self.with_layout(self.layout.unsqueeze(d)?))
    }

    /// The same elements with another shape of the same element count: a view when the strides
    /// allow it, else a contiguous copy (logged and counted as an implicit copy).
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let site = caller();
        let view = self
            .layout
            .reshape(shape)
            .map_err(|e| check::rename(e, "reshape").with_dtype(self.dtype))?;
        if let Some(layout) = view {
            return Ok(self.with_layout(layout));
        }
        let copy = self.contiguous_at(site)?;
        runtime::record_implicit_copy("reshape", copy.size_in_bytes(), site);
        match copy.layout.reshape(shape)? {
            Some(layout) => Ok(copy.with_layout(layout)),
            None => Err(Error::invalid(
                "reshape",
                "a contiguous tensor could not be viewed with the new shape",
            )),
        }
    }

    /// All elements in one dimension (a view when the strides allow it).
    #[track_caller]
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])
    }

    /// Collapse the layout to `shape` without checking more than the element count: used where
    /// the caller knows the result is contiguous.
    pub(super) fn view_contiguous(&self, shape: &[usize]) -> Result<Tensor> {
        debug_assert!(self.is_contiguous());
        match self.layout.reshape(shape)? {
            Some(layout) => Ok(self.with_layout(layout)),
            None => Err(Error::invalid("view", "internal: a contiguous tensor did not reshape")),
        }
    }

    /// The shape with `dims` removed.
    pub(super) fn shape_without(&self, dims: &[usize]) -> Dims {
        self.shape()
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, &d)| d)
            .collect()
    }
}
