//! Views: new layouts over the same storage, no data touched. `reshape` is a view whenever the
//! strides allow it; when they do not it copies, and says so (a `tracing` debug event with the
//! bytes and the call site, counted in `cartage::stats().implicit_copies`, R12).

use cartage_core::{Dims, Error, Result, resolve_dim};

use super::slicing::{self, ShapeArg, resolve_shape};
use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};
use crate::runtime;

impl Tensor {
    /// Swap dimensions `d0` and `d1` (negative counts from the end). A view: it shares this
    /// tensor's storage (and is in general no longer contiguous).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// let y = x.transpose(0, -1)?;
    /// assert_eq!(y.to_vec2::<i64>()?, vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
    /// assert!(y.shares_storage(&x) && !y.is_contiguous());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = resolve_dim("transpose", d0, self.rank())?;
        let b = resolve_dim("transpose", d1, self.rank())?;
        let out = self.with_layout(self.layout.transpose(a, b)?);
        Ok(graph::record(out, "transpose", &[self], |_| {
            formulas::view::transpose(a, b)
        }))
    }

    /// Swap the last two dimensions (a view; a tensor of rank below 2 is returned as is).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[4, 2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.t()?.shape(), &[4, 3, 2]);
    /// assert_eq!(x.flatten()?.t()?.shape(), &[24]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(-2, -1)
    }

    /// Reorder dimensions: output dimension `i` is input dimension `perm[i]` (negative counts
    /// from the end). Anything but a permutation of the dimensions is
    /// [`Error::InvalidArgument`] naming the list.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.permute(&[2, 0, 1])?.shape(), &[4, 2, 3]);
    /// assert_eq!(x.permute(&[-1, 0, 1])?.shape(), &[4, 2, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        let rank = self.rank();
        let resolved: Option<Dims> = perm.iter().map(|&p| resolve_dim("permute", p, rank).ok()).collect();
        let Some(resolved) = resolved else {
            return Err(Error::invalid(
                "permute",
                format!("{perm:?} is not a permutation of 0..{rank}: a dimension is out of range for rank {rank}"),
            ));
        };
        let out = self.with_layout(self.layout.permute(&resolved)?);
        Ok(graph::record(out, "permute", &[self], |_| {
            formulas::view::permute(&resolved)
        }))
    }

    /// Keep `len` entries of dimension `dim` (negative counts from the end) starting at
    /// `start`: a view sharing this tensor's storage.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// let y = x.narrow(-1, 1, 2)?;
    /// assert_eq!(y.to_vec2::<i64>()?, vec![vec![1, 2], vec![4, 5]]);
    /// assert!(y.shares_storage(&x));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        let out = self.with_layout(self.layout.narrow(d, start, len)?);
        Ok(graph::record(out, "narrow", &[self], |_| {
            formulas::view::picked(self, move |z| z.narrow(d as isize, start, len))
        }))
    }

    /// View with numpy broadcasting to `shape` (expanded dimensions get stride 0). A target of
    /// more elements than a layout may span is [`Error::SizeOverflow`] naming this dtype.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1i32, 2, 3], &[3], &Device::cpu())?;
    /// let y = x.broadcast_to(&[2, 3])?;
    /// assert_eq!(y.to_vec::<i32>()?, vec![1, 2, 3, 1, 2, 3]);
    /// assert_eq!(y.layout().strides(), &[0, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let layout = self.layout.broadcast_to(shape).map_err(|e| e.with_dtype(self.dtype))?;
        let out = self.with_layout(layout);
        Ok(graph::record(out, "broadcast_to", &[self], |_| {
            formulas::view::expand(self)
        }))
    }

    /// Remove dimension `dim` (negative counts from the end), which must have size 1: a view.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 1, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.squeeze(1)?.shape(), &[2, 3]);
    /// assert!(x.squeeze(0).is_err()); // size 2
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        let out = self.with_layout(self.layout.squeeze(d)?);
        Ok(graph::record(out, "squeeze", &[self], |_| {
            formulas::view::reshape(self)
        }))
    }

    /// Insert a dimension of size 1 at `dim` (`0..=rank`, negative counts from the end: -1
    /// appends). An out-of-range `dim` is [`Error::DimOutOfRange`] naming this tensor's rank.
    /// A view.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.unsqueeze(0)?.shape(), &[1, 2, 3]);
    /// assert_eq!(x.unsqueeze(-1)?.shape(), &[2, 3, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let rank = self.rank();
        let d = resolve_dim("unsqueeze", dim, rank + 1).map_err(|_| Error::DimOutOfRange {
            op: "unsqueeze",
            dim,
            rank,
        })?;
        let out = self.with_layout(self.layout.unsqueeze(d)?);
        Ok(graph::record(out, "unsqueeze", &[self], |_| {
            formulas::view::reshape(self)
        }))
    }

    /// The same elements with another shape of the same element count: a view when the strides
    /// allow it, else a contiguous copy (logged and counted as an implicit copy). One size may
    /// be `-1`, inferred from the element count; the shape may be given as `usize`, `isize`,
    /// `i32` or `i64` ([`crate::tensor::slicing::ShapeArg`]).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.reshape(&[6, 4])?.shape(), &[6, 4]);
    /// assert_eq!(x.reshape(&[-1, 2])?.shape(), &[12, 2]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn reshape<S: ShapeArg + ?Sized>(&self, shape: &S) -> Result<Tensor> {
        let site = caller();
        let shape = resolve_shape("reshape", &shape.entries(), self.shape(), self.numel())?;
        let shape = &shape[..];
        let view = self
            .layout
            .reshape(shape)
            .map_err(|e| check::rename(e, "reshape").with_dtype(self.dtype))?;
        if let Some(layout) = view {
            let out = self.with_layout(layout);
            return Ok(graph::record(out, "reshape", &[self], |_| {
                formulas::view::reshape(self)
            }));
        }
        let copy = self.contiguous_at(site)?;
        runtime::record_implicit_copy("reshape", copy.size_in_bytes(), site);
        match copy.layout.reshape(shape)? {
            Some(layout) => {
                let out = copy.with_layout(layout);
                Ok(graph::record(out, "reshape", &[&copy], |_| {
                    formulas::view::reshape(&copy)
                }))
            }
            None => Err(Error::invalid(
                "reshape",
                "a contiguous tensor could not be viewed with the new shape",
            )),
        }
    }

    /// All elements in one dimension (a view when the strides allow it, else a copy like
    /// [`Tensor::reshape`]); see [`Tensor::flatten_dims`] for a range of dimensions.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// assert_eq!(x.flatten()?.shape(), &[6]);
    /// assert_eq!(x.t()?.flatten()?.to_vec::<i64>()?, vec![0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])
    }

    /// Merge dimensions `start..=end` (negative counts from the end) into one: a view when the
    /// strides allow it, else a copy like [`Tensor::reshape`]. A rank-0 tensor becomes `[1]`.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4, 5], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.flatten_dims(1, 2)?.shape(), &[2, 12, 5]);
    /// assert_eq!(x.flatten_dims(1, -1)?.shape(), &[2, 60]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn flatten_dims(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1usize]);
        }
        let a = resolve_dim("flatten_dims", start, self.rank())?;
        let b = resolve_dim("flatten_dims", end, self.rank())?;
        if a > b {
            return Err(Error::invalid(
                "flatten_dims",
                format!("start dimension {start} comes after end dimension {end}"),
            ));
        }
        let shape = self.shape();
        let mut out: Dims = Dims::from_slice(&shape[..a]);
        out.push(shape[a..=b].iter().product());
        out.extend_from_slice(&shape[b + 1..]);
        self.reshape(&out)
    }

    /// View with the sizes `sizes` (numpy broadcasting, like [`Tensor::broadcast_to`]); a `-1`
    /// keeps this tensor's size in that dimension. Expanded dimensions have stride 0 (no copy).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0], &[2, 1], &Device::cpu())?;
    /// let y = x.expand(&[3, -1, 4])?;
    /// assert_eq!(y.shape(), &[3, 2, 4]);
    /// assert!(y.shares_storage(&x));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn expand(&self, sizes: &[isize]) -> Result<Tensor> {
        let rank = self.rank();
        if sizes.len() < rank {
            return Err(Error::invalid(
                "expand",
                format!(
                    "{} sizes {sizes:?} for a tensor of rank {rank} (shape {:?}); give at least one size per dimension",
                    sizes.len(),
                    self.shape()
                ),
            ));
        }
        let lead = sizes.len() - rank;
        let mut target = Dims::with_capacity(sizes.len());
        for (i, &s) in sizes.iter().enumerate() {
            target.push(match s {
                -1 if i >= lead => self.shape()[i - lead],
                s if s >= 0 => s as usize,
                _ => {
                    return Err(Error::invalid(
                        "expand",
                        format!(
                            "size {s} at dimension {i} of {sizes:?}: sizes must be ≥ 0, or -1 to keep an \
                             existing dimension"
                        ),
                    ));
                }
            });
        }
        let layout = self
            .layout
            .broadcast_to(&target)
            .map_err(|e| check::rename(e, "expand").with_dtype(self.dtype))?;
        let out = self.with_layout(layout);
        Ok(graph::record(out, "expand", &[self], |_| formulas::view::expand(self)))
    }

    /// The entry `index` of dimension `dim`, with that dimension dropped (a view). Negative
    /// `dim` and `index` count from the end; an index outside the dimension is
    /// [`Error::IndexOutOfRange`].
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// assert_eq!(x.select(1, -1)?.to_vec::<i64>()?, vec![2, 5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let d = resolve_dim("select", dim, self.rank())?;
        let at = slicing::resolve_index("select", index as i64, d, self.shape()[d], self)?;
        let narrowed = self.layout.narrow(d, at, 1)?;
        let out = self.with_layout(narrowed.squeeze(d)?);
        Ok(graph::record(out, "select", &[self], |_| {
            formulas::view::picked(self, move |z| z.select(d as isize, at as isize))
        }))
    }

    /// Collapse the layout to `shape` without checking more than the element count: used where
    /// the caller knows the result is contiguous.
    pub(super) fn view_contiguous(&self, shape: &[usize]) -> Result<Tensor> {
        debug_assert!(self.is_contiguous());
        match self.layout.reshape(shape)? {
            Some(layout) => {
                let out = self.with_layout(layout);
                Ok(graph::record(out, "reshape", &[self], |_| {
                    formulas::view::reshape(self)
                }))
            }
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
