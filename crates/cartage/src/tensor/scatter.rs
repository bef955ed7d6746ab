//! Writes at indices and index-built tensors: `masked_fill`, `scatter`, `scatter_add`,
//! `index_add`, `one_hot`, `nonzero` and `embedding`.
//!
//! The scatter family is functional: it copies `self` into a new tensor and scatters into that
//! copy in place with `Kernel::Scatter`, so `self` is unchanged. Indices are i32 or i64; one
//! outside the destination's dimension is [`Error::IndexOutOfRange`], found on the device (a
//! GPU reports it at the next synchronisation, such as the read of the result).

use cartage_core::{DType, Dims, Error, Kernel, Layout, Result, Scalar, ScatterMode, Site, resolve_dim};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

impl Tensor {
    /// `value` where the bool `mask` is true, `self` elsewhere; `mask` broadcasts to this
    /// tensor's shape.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &Device::cpu())?;
    /// let mask = Tensor::from_slice(&[true, false, true], &[3], &Device::cpu())?;
    /// assert_eq!(x.masked_fill(&mask, -1.0)?.to_vec::<f32>()?, vec![-1.0, 2.0, -1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let site = caller();
        check::same_device("masked_fill", self, mask)?;
        if mask.dtype != DType::Bool {
            return Err(Error::WrongDType {
                op: "masked_fill",
                dtype: mask.dtype,
                expected: "a bool mask; build it with a comparison such as `x.gt(&y)`",
            });
        }
        let mask = mask
            .broadcast_to(self.shape())
            .map_err(|e| check::rename(e, "masked_fill"))?;
        let fill = self.scalar_like(value.into(), site)?;
        let out = Tensor::where_cond(&mask, &fill, self)?;
        Ok(Tensor { origin: site, ..out })
    }

    /// A copy of `self` with `src[p]` written at `p` with `p[dim]` replaced by `index[p]`, for
    /// every position `p` of `index` (torch's `scatter`): `index` has this tensor's rank, fits
    /// inside `src`, and inside `self` except along `dim`. With repeated indices one of the
    /// written values is kept (unspecified which).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], cartage::DType::F32, &Device::cpu())?;
    /// let index = Tensor::from_slice(&[2i64, 0], &[2, 1], &Device::cpu())?;
    /// let src = Tensor::from_slice(&[5.0f32, 7.0], &[2, 1], &Device::cpu())?;
    /// let y = x.scatter(1, &index, &src)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 5.0, 7.0, 0.0, 0.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn scatter(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let site = caller();
        let d = resolve_dim("scatter", dim, self.rank())?;
        self.scatter_with(ScatterMode::Assign, d, index, None, src, site)
    }

    /// Like [`Tensor::scatter`], but adding: every `src[p]` is added at its position, repeated
    /// indices included.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::zeros(&[3], cartage::DType::F32, &Device::cpu())?;
    /// let index = Tensor::from_slice(&[0i64, 2, 0], &[3], &Device::cpu())?;
    /// let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &Device::cpu())?;
    /// assert_eq!(x.scatter_add(0, &index, &src)?.to_vec::<f32>()?, vec![4.0, 0.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let site = caller();
        let d = resolve_dim("scatter_add", dim, self.rank())?;
        self.scatter_with(ScatterMode::Add, d, index, None, src, site)
    }

    /// A copy of `self` with slice `i` of `src` along `dim` added to slice `index[i]`
    /// (torch's `index_add`): `index` is 1-D, `src` has this tensor's shape except `index.len()`
    /// entries along `dim`.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[3, 2], DType::F32, &Device::cpu())?;
    /// let index = Tensor::from_slice(&[2i64, 0, 2], &[3], &Device::cpu())?;
    /// let src = Tensor::ones(&[3, 2], DType::F32, &Device::cpu())?;
    /// let y = x.index_add(0, &index, &src)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 1.0, 0.0, 0.0, 2.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn index_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let site = caller();
        let d = resolve_dim("index_add", dim, self.rank())?;
        check::same_device("index_add", self, index)?;
        check::index_dtype("index_add", index)?;
        if index.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
                reason: "the index must be one-dimensional".into(),
            });
        }
        let mut expected: Dims = Dims::from_slice(self.shape());
        expected[d] = index.numel();
        if src.shape() != &expected[..] {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
                reason: format!(
                    "the source must have the destination's shape with {} entries (the index's length) along \
                     dimension {d}, that is {:?}",
                    index.numel(),
                    &expected[..]
                ),
            });
        }
        // The index broadcast (stride 0) over every dimension but `dim`.
        let mut strides: Dims = smallvec::smallvec![0; self.rank()];
        strides[d] = index.layout.strides()[0];
        let layout = Layout::from_parts(src.shape(), &strides, index.layout.offset())?;
        self.scatter_with(ScatterMode::Add, d, index, Some(layout), src, site)
    }

    /// [`Tensor::index_add`] of `alpha · src` (PyTorch's `index_add(dim, index, src,
    /// alpha=alpha)`). For integer tensors `alpha` must be a whole number.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[3], DType::F32, &Device::cpu())?;
    /// let index = Tensor::from_slice(&[2i64, 0], &[2], &Device::cpu())?;
    /// let src = Tensor::ones(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.index_add_alpha(0, &index, &src, -0.5)?.to_vec::<f32>()?, vec![-0.5, 0.0, -0.5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn index_add_alpha(&self, dim: isize, index: &Tensor, src: &Tensor, alpha: f64) -> Result<Tensor> {
        if !self.dtype().is_float() && alpha.fract() != 0.0 {
            return Err(Error::invalid(
                "index_add",
                format!("alpha {alpha} must be a whole number for a {} tensor", self.dtype()),
            ));
        }
        if alpha == 1.0 {
            return self.index_add(dim, index, src);
        }
        self.index_add(dim, index, &src.mul_scalar(alpha)?)
    }

    fn scatter_with(
        &self,
        mode: ScatterMode,
        d: usize,
        index: &Tensor,
        index_layout: Option<Layout>,
        src: &Tensor,
        site: Site,
    ) -> Result<Tensor> {
        let op = mode.name();
        check::same_device(op, self, index)?;
        check::same_device_and_dtype(op, self, src)?;
        check::index_dtype(op, index)?;
        let index_layout_given = index_layout.is_some();
        let index_arg = match index_layout {
            Some(layout) => index.arg_with(layout),
            None => index.as_arg(),
        };
        let work = index_arg.layout.numel();
        let out = self.fresh_copy(site)?;
        let kernel = Kernel::Scatter {
            mode,
            src: src.as_arg(),
            index: index_arg,
            dim: d,
            out: out.as_arg(),
        };
        // Structural rules (ranks, sizes) are checked even when there is nothing to write.
        kernel.validate()?;
        out.launch_indexed(&kernel, &[src, index], index, work)?;
        let out = out.with_link(None);
        Ok(graph::record(out, op, &[self, src], |_| {
            match (mode, index_layout_given) {
                (ScatterMode::Add, true) => formulas::index::index_add(d, index),
                (mode, _) => formulas::index::scatter(d, index, src, mode == ScatterMode::Add),
            }
        }))
    }

    /// Each integer class id as a row of `num_classes` i64 values, 1 at the id and 0 elsewhere:
    /// shape `[.., num_classes]`, built on the device (ones scattered into zeros). An id outside
    /// `[0, num_classes)` is [`Error::IndexOutOfRange`], reported like any scatter index (on a
    /// GPU at the next synchronisation, such as the read of the result).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let ids = Tensor::from_slice(&[2i64, 0], &[2], &Device::cpu())?;
    /// assert_eq!(ids.one_hot(3)?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        let site = caller();
        check::index_dtype("one_hot", self)?;
        // A scatter of ones into zeros: an id outside `[0, num_classes)` is
        // `Error::IndexOutOfRange`, found on the device like any scatter index.
        let mut shape: Dims = Dims::from_slice(self.shape());
        shape.push(num_classes);
        let zeros = Tensor::zeros(&shape, DType::I64, &self.device)?;
        let mut ones_shape: Dims = Dims::from_slice(self.shape());
        ones_shape.push(1);
        let ones = Tensor::ones(&[1], DType::I64, &self.device)?.broadcast_to(&ones_shape)?;
        let index = self.unsqueeze(-1)?;
        let out = zeros
            .scatter_with(ScatterMode::Assign, shape.len() - 1, &index, None, &ones, site)
            .map_err(|e| check::rename(e, "one_hot"))?;
        Ok(Tensor { origin: site, ..out })
    }

    /// The positions of the non-zero elements (true, for bool) as an i64 tensor
    /// `[count, rank]`, in row-major order. The count decides the shape, so this reads the mask
    /// back to the host: a synchronisation point, counted in `cartage::stats().host_syncs`.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[0.0f32, 3.0, 0.0, 1.0], &[2, 2], &Device::cpu())?;
    /// let nz = x.nonzero()?;
    /// assert_eq!(nz.shape(), &[2, 2]);
    /// assert_eq!(nz.to_vec::<i64>()?, vec![0, 1, 1, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn nonzero(&self) -> Result<Tensor> {
        let site = caller();
        // A cast to bool is `!= 0` (every device casts, i64 on wgpu included).
        let mask = self.to_dtype(DType::Bool)?;
        let flags = mask.to_vec::<bool>()?;
        let shape = self.shape();
        let rank = shape.len();
        let mut coords = Vec::new();
        let mut position: Dims = smallvec::smallvec![0; rank];
        let mut count = 0usize;
        for &flag in &flags {
            if flag {
                coords.extend(position.iter().map(|&p| p as i64));
                count += 1;
            }
            for d in (0..rank).rev() {
                position[d] += 1;
                if position[d] < shape[d] {
                    break;
                }
                position[d] = 0;
            }
        }
        let out = Tensor::from_vec(coords, &[count, rank], &self.device)?;
        Ok(Tensor { origin: site, ..out })
    }

    /// Rows of this `[num, dim]` table picked by the integer `ids` of any shape:
    /// `ids [..]` gives `[.., dim]` (one `index_select` of rows).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let weight = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &Device::cpu())?.reshape(&[3, 2])?;
    /// let ids = Tensor::from_slice(&[2i64, 0, 2, 1], &[2, 2], &Device::cpu())?;
    /// let e = weight.embedding(&ids)?;
    /// assert_eq!(e.shape(), &[2, 2, 2]);
    /// assert_eq!(e.to_vec::<f32>()?, vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0, 2.0, 3.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let site = caller();
        check::same_device("embedding", self, ids)?;
        check::index_dtype("embedding", ids)?;
        if self.rank() != 2 {
            return Err(Error::ShapeMismatch {
                op: "embedding",
                lhs: self.shape().to_vec(),
                rhs: ids.shape().to_vec(),
                reason: "the weight must be a 2-D table [num_embeddings, dim]".into(),
            });
        }
        let flat = ids.reshape(&[ids.numel()])?;
        let rows = self.index_select_at(0, &flat, site)?;
        let mut shape: Dims = Dims::from_slice(ids.shape());
        shape.push(self.shape()[1]);
        rows.reshape(&shape)
    }
}
