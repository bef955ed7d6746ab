//! Joining and reshaping: `cat`, `stack`, `split`, `split_sizes`, `chunk`, `repeat`, `flip`,
//! `roll`, `tril`/`triu` and `pad`.
//!
//! Splits are views. Everything that builds a new tensor does it on the device: `cat` copies
//! each input into its slot of the output with one strided copy kernel (no host round trip),
//! `repeat` copies one broadcast view, `tril`/`triu` build their mask from `arange` and a
//! comparison, `pad` fills and then copies into the middle.

use cartage_core::{CompareOp, DType, Dims, Error, Kernel, Layout, Result, Scalar, Site, resolve_dim};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

impl Tensor {
    /// Join `tensors` along `dim` (negative counts from the end). All must share device, dtype
    /// and rank, and have the same sizes except along `dim`; the first that differs is named in
    /// the error. Each input is copied into its slot of the output by one strided copy kernel.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let a = Tensor::from_slice(&[1i64, 2, 3, 4], &[2, 2], &Device::cpu())?;
    /// let b = Tensor::from_slice(&[5i64, 6], &[2, 1], &Device::cpu())?;
    /// let c = Tensor::cat(&[&a, &b], -1)?;
    /// assert_eq!(c.shape(), &[2, 3]);
    /// assert_eq!(c.to_vec::<i64>()?, vec![1, 2, 5, 3, 4, 6]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        Tensor::cat_at(tensors, dim, "cat", caller())
    }

    /// Join `tensors`, all of one shape, along a new dimension `dim` (`0..=rank`, negative
    /// counts from the end: -1 appends).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let a = Tensor::from_slice(&[1i64, 2], &[2], &Device::cpu())?;
    /// let b = Tensor::from_slice(&[3i64, 4], &[2], &Device::cpu())?;
    /// assert_eq!(Tensor::stack(&[&a, &b], 0)?.to_vec::<i64>()?, vec![1, 2, 3, 4]);
    /// assert_eq!(Tensor::stack(&[&a, &b], -1)?.to_vec::<i64>()?, vec![1, 3, 2, 4]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let site = caller();
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("stack", "no tensors given; pass at least one"))?;
        for (i, t) in tensors.iter().enumerate().skip(1) {
            if t.shape() != first.shape() {
                return Err(Error::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: format!("input {i} differs from input 0; stack needs tensors of one shape"),
                });
            }
        }
        let rank = first.rank();
        let d = resolve_dim("stack", dim, rank + 1).map_err(|_| Error::DimOutOfRange { op: "stack", dim, rank })?;
        let expanded = tensors
            .iter()
            .map(|t| t.unsqueeze(d as isize))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = expanded.iter().collect();
        Tensor::cat_at(&refs, d as isize, "stack", site)
    }

    fn cat_at(tensors: &[&Tensor], dim: isize, op: &'static str, site: Site) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(op, "no tensors given; pass at least one"))?;
        let rank = first.rank();
        if rank == 0 {
            return Err(Error::invalid(
                op,
                "input 0 is a rank-0 tensor; cat joins along an existing dimension (use `stack`, or `unsqueeze` first)",
            ));
        }
        let d = resolve_dim(op, dim, rank)?;
        let mut total = 0usize;
        for (i, t) in tensors.iter().enumerate() {
            check::same_device_and_dtype(op, first, t)?;
            if t.rank() != rank {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: format!(
                        "input {i} (shape {:?}) has rank {}, input 0 (shape {:?}) rank {rank}; every input needs \
                         the same rank",
                        t.shape(),
                        t.rank(),
                        first.shape()
                    ),
                });
            }
            let fits = t
                .shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .all(|(k, (a, b))| k == d || a == b);
            if !fits {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: format!(
                        "input {i} (shape {:?}) differs from input 0 (shape {:?}) in a dimension other than {d}; \
                         every input needs rank {rank} and the same sizes except along dimension {d}",
                        t.shape(),
                        first.shape()
                    ),
                });
            }
            total = total
                .checked_add(t.shape()[d])
                .ok_or_else(|| Error::size_overflow(first.shape(), first.dtype))?;
        }
        let mut shape: Dims = Dims::from_slice(first.shape());
        shape[d] = total;
        let out = first.alloc_like(&shape, first.dtype, site)?;
        let mut at = 0;
        for t in tensors {
            let len = t.shape()[d];
            let slot = out.narrow(d as isize, at, len)?;
            let kernel = Kernel::Copy {
                input: t.as_arg(),
                out: slot.as_arg(),
            };
            slot.launch(&kernel, &[t], slot.numel())?;
            at += len;
        }
        Ok(graph::record(out, op, tensors, |_| {
            formulas::shape::cat(tensors.iter().map(|t| t.shape()[d]).collect(), d)
        }))
    }

    /// Views of `size` entries each along `dim` (the last may be shorter).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 5.0, 1.0, DType::I64, &Device::cpu())?;
    /// let parts = x.split(2, 0)?;
    /// assert_eq!(parts.len(), 3);
    /// assert_eq!(parts[2].to_vec::<i64>()?, vec![4]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("split", dim, self.rank())?;
        let n = self.shape()[d];
        if size == 0 {
            return Err(Error::invalid(
                "split",
                format!("split size 0 along dimension {d} of size {n}; the size must be ≥ 1"),
            ));
        }
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        (0..n)
            .step_by(size)
            .map(|start| self.narrow(d as isize, start, size.min(n - start)))
            .collect()
    }

    /// Views of the sizes `sizes` along `dim`, which must add up to that dimension's size.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?;
    /// let parts = x.split_sizes(&[1, 3, 2], 0)?;
    /// assert_eq!(parts[1].to_vec::<i64>()?, vec![1, 2, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("split_sizes", dim, self.rank())?;
        let n = self.shape()[d];
        let sum = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
        if sum != Some(n) {
            return Err(Error::invalid(
                "split_sizes",
                format!("sizes {sizes:?} do not add up to {n}, the size of dimension {d}"),
            ));
        }
        let mut at = 0;
        sizes
            .iter()
            .map(|&len| {
                let part = self.narrow(d as isize, at, len);
                at += len;
                part
            })
            .collect()
    }

    /// At most `chunks` views along `dim`, each of `ceil(size / chunks)` entries but the last
    /// (PyTorch's `chunk`: fewer chunks when the size does not need them all).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// let parts = x.chunk(3, 1)?;
    /// assert_eq!(parts.len(), 3);
    /// assert_eq!(parts[0].to_vec::<i64>()?, vec![0, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("chunk", dim, self.rank())?;
        if chunks == 0 {
            return Err(Error::invalid("chunk", "0 chunks asked for; ask for at least 1"));
        }
        let n = self.shape()[d];
        self.split(n.div_ceil(chunks).max(1), dim)
    }

    /// Tile this tensor `reps[i]` times along each dimension (PyTorch's `repeat`; `reps` may
    /// be longer than the rank, adding leading dimensions). One copy of a broadcast view.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1i64, 2], &[2], &Device::cpu())?;
    /// let y = x.repeat(&[2, 2])?;
    /// assert_eq!(y.shape(), &[2, 4]);
    /// assert_eq!(y.to_vec::<i64>()?, vec![1, 2, 1, 2, 1, 2, 1, 2]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn repeat(&self, reps: &[usize]) -> Result<Tensor> {
        let site = caller();
        let rank = self.rank();
        if reps.len() < rank {
            return Err(Error::invalid(
                "repeat",
                format!(
                    "{} repeats {reps:?} for a tensor of rank {rank}; give one per dimension (or more)",
                    reps.len()
                ),
            ));
        }
        let lead = reps.len() - rank;
        // [r0, s0, r1, s1, …] with stride 0 for each repetition.
        let mut shape = Dims::new();
        let mut strides = Dims::new();
        let mut out_shape = Dims::new();
        for (i, &r) in reps.iter().enumerate() {
            let (size, stride) = if i < lead {
                (1, 0)
            } else {
                (self.shape()[i - lead], self.layout.strides()[i - lead])
            };
            shape.extend_from_slice(&[r, size]);
            strides.extend_from_slice(&[0, stride]);
            out_shape.push(
                r.checked_mul(size)
                    .ok_or_else(|| Error::size_overflow(&[r, size], self.dtype))?,
            );
        }
        Layout::contiguous(&out_shape).map_err(|e| e.with_dtype(self.dtype))?;
        let tiled = self.with_layout(Layout::from_parts(&shape, &strides, self.layout.offset())?);
        let out = self.alloc_like(&shape, self.dtype, site)?;
        let kernel = Kernel::Copy {
            input: tiled.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        let out = out.view_contiguous(&out_shape)?;
        Ok(graph::record(out, "repeat", &[self], |_| {
            formulas::shape::repeat(self, reps)
        }))
    }

    /// Reverse the order of entries along each of `dims` (negative counts from the end). Strides
    /// cannot be negative, so this copies: one `index_select` with a reversed `arange` per dim.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// assert_eq!(x.flip(&[-1])?.to_vec::<i64>()?, vec![2, 1, 0, 5, 4, 3]);
    /// assert_eq!(x.flip(&[0, 1])?.to_vec::<i64>()?, vec![5, 4, 3, 2, 1, 0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn flip(&self, dims: &[isize]) -> Result<Tensor> {
        let site = caller();
        let mut seen = Dims::new();
        for &dim in dims {
            let d = resolve_dim("flip", dim, self.rank())?;
            if seen.contains(&d) {
                return Err(Error::invalid(
                    "flip",
                    format!("dimension {dim} appears twice in {dims:?}"),
                ));
            }
            seen.push(d);
        }
        let mut out: Option<Tensor> = None;
        for &d in &seen {
            let n = self.shape()[d];
            if n <= 1 {
                continue;
            }
            let index = Tensor::arange(n as f64 - 1.0, -1.0, -1.0, DType::I64, &self.device)?;
            out = Some(out.as_ref().unwrap_or(self).index_select_at(d, &index, site)?);
        }
        match out {
            Some(out) => Ok(out),
            None => self.fresh_copy(site),
        }
    }

    /// Shift entries by `shift` along `dim`, wrapping around: entry `i` moves to
    /// `(i + shift) mod size` (negative shifts move the other way).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 5.0, 1.0, DType::I64, &Device::cpu())?;
    /// assert_eq!(x.roll(2, 0)?.to_vec::<i64>()?, vec![3, 4, 0, 1, 2]);
    /// assert_eq!(x.roll(-1, -1)?.to_vec::<i64>()?, vec![1, 2, 3, 4, 0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn roll(&self, shift: isize, dim: isize) -> Result<Tensor> {
        let site = caller();
        let d = resolve_dim("roll", dim, self.rank())?;
        let n = self.shape()[d];
        if n == 0 {
            return self.fresh_copy(site);
        }
        let s = shift.rem_euclid(n as isize) as usize;
        if s == 0 {
            return self.fresh_copy(site);
        }
        let tail = self.narrow(d as isize, n - s, s)?;
        let head = self.narrow(d as isize, 0, n - s)?;
        Tensor::cat_at(&[&tail, &head], d as isize, "roll", site)
    }

    /// The lower triangle of the last two dimensions, the main diagonal included: PyTorch's
    /// `x.tril()`. [`Tensor::tril_with`] takes the diagonal.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[3, 3], DType::I64, &Device::cpu())?;
    /// assert_eq!(x.tril()?.to_vec::<i64>()?, vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn tril(&self) -> Result<Tensor> {
        self.triangle(0, CompareOp::Le, "tril", caller())
    }

    /// The lower triangle of the last two dimensions: entries with `col - row <= diagonal` are
    /// kept, the rest become 0 (PyTorch's `x.tril(diagonal)`). `0` is the main diagonal, `> 0`
    /// above it, `< 0` below. The mask is built on the device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[3, 3], DType::I64, &Device::cpu())?;
    /// assert_eq!(x.tril_with(-1)?.to_vec::<i64>()?, vec![0, 0, 0, 1, 0, 0, 1, 1, 0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn tril_with(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle(diagonal, CompareOp::Le, "tril", caller())
    }

    /// The upper triangle of the last two dimensions, the main diagonal included: PyTorch's
    /// `x.triu()`. [`Tensor::triu_with`] takes the diagonal.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.triu()?.to_vec::<f32>()?, vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn triu(&self) -> Result<Tensor> {
        self.triangle(0, CompareOp::Ge, "triu", caller())
    }

    /// The upper triangle of the last two dimensions: entries with `col - row >= diagonal` are
    /// kept, the rest become 0 (PyTorch's `x.triu(diagonal)`).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.triu_with(1)?.to_vec::<f32>()?, vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn triu_with(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle(diagonal, CompareOp::Ge, "triu", caller())
    }

    fn triangle(&self, k: i64, keep: CompareOp, op: &'static str, site: Site) -> Result<Tensor> {
        let rank = self.rank();
        if rank < 2 {
            return Err(Error::invalid(
                op,
                format!(
                    "the tensor has shape {:?}; it needs at least 2 dimensions",
                    self.shape()
                ),
            ));
        }
        let (rows, cols) = (self.shape()[rank - 2], self.shape()[rank - 1]);
        let device = self.device;
        // col - row (keep) k  ⇔  col (keep) row + k. col - row lies in (-rows, cols), so k can be
        // clamped to [-rows, cols] without changing the mask; then i32 holds every value when
        // the sizes allow it (half the bytes of i64), else i64.
        let k = k.clamp(-(rows as i64), cols as i64);
        let narrow = rows.max(cols) <= i32::MAX as usize / 2;
        let dtype = if narrow { DType::I32 } else { DType::I64 };
        let row = Tensor::arange(k as f64, rows as f64 + k as f64, 1.0, dtype, &device)?.reshape(&[rows, 1])?;
        let col = Tensor::arange(0.0, cols as f64, 1.0, dtype, &device)?.reshape(&[1, cols])?;
        let mask = match keep {
            CompareOp::Le => col.le(&row)?,
            _ => col.ge(&row)?,
        };
        let zero = self.scalar_like(Scalar::Int(0), site)?;
        let out = Tensor::where_cond(&mask, self, &zero)?;
        Ok(Tensor { origin: site, ..out })
    }

    /// Pad with the constant `value`: `pads` holds pairs `(before, after)` starting from the
    /// last dimension (PyTorch's `F.pad` order): `[1, 2]` pads the last dimension with one
    /// entry before and two after, `[1, 1, 2, 2]` also the one before it with two on each side.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1i64, 2, 3, 4], &[2, 2], &Device::cpu())?;
    /// let y = x.pad(&[1, 0, 0, 1], 9)?;
    /// assert_eq!(y.shape(), &[3, 3]);
    /// assert_eq!(y.to_vec::<i64>()?, vec![9, 1, 2, 9, 3, 4, 9, 9, 9]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn pad(&self, pads: &[usize], value: impl Into<Scalar>) -> Result<Tensor> {
        let site = caller();
        let rank = self.rank();
        if !pads.len().is_multiple_of(2) || pads.len() > 2 * rank {
            return Err(Error::invalid(
                "pad",
                format!(
                    "pads {pads:?} must be pairs (before, after), at most one per dimension of the shape {:?}",
                    self.shape()
                ),
            ));
        }
        let mut shape: Dims = Dims::from_slice(self.shape());
        let mut starts: Dims = smallvec::smallvec![0; rank];
        for (i, pair) in pads.chunks(2).enumerate() {
            let d = rank - 1 - i;
            starts[d] = pair[0];
            shape[d] = shape[d]
                .checked_add(pair[0])
                .and_then(|s| s.checked_add(pair[1]))
                .ok_or_else(|| Error::size_overflow(self.shape(), self.dtype))?;
        }
        let out = self.alloc_like(&shape, self.dtype, site)?;
        let fill = Kernel::Fill {
            out: out.as_arg(),
            value: value.into(),
        };
        out.launch(&fill, &[], out.numel())?;
        let mut inner = out.clone();
        for (d, &start) in starts.iter().enumerate() {
            inner = inner.narrow(d as isize, start, self.shape()[d])?;
        }
        let copy = Kernel::Copy {
            input: self.as_arg(),
            out: inner.as_arg(),
        };
        inner.launch(&copy, &[self], inner.numel())?;
        Ok(graph::record(out, "pad", &[self], |_| formulas::shape::pad(self, pads)))
    }

    /// A fresh contiguous copy that shares no storage with `self`.
    pub(super) fn fresh_copy(&self, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Copy {
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        Ok(graph::record(out, "copy", &[self], |_| {
            formulas::elementwise::identity()
        }))
    }
}
