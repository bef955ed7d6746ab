//! Reductions and scans beyond sum/mean/max/min: `prod`, `var`/`std`, `norm`, `any`/`all`,
//! `max_dim`/`min_dim`, `cumsum`/`cumprod`, `sort`/`argsort` and `topk`.
//!
//! Each is one kernel (`Reduce` Prod, `Scan`, `Sort`) or a composition of existing kernels on
//! the device. Dimensions are `isize` (negative counts from the end), dimension lists
//! `&[isize]`.

use cartage_core::{
    BinaryOp, DType, Dims, Error, Kernel, ReduceOp, Result, Scalar, ScanOp, Site, UnaryOp, resolve_dim,
};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

/// The order of a vector norm ([`Tensor::norm`]). A number converts: `1.0` is `L1`, `2.0` is
/// `L2`, `f64::INFINITY` is `Inf`, anything else `P(p)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormOrd {
    /// `Σ |x|`.
    L1,
    /// `sqrt(Σ x²)`.
    L2,
    /// `max |x|`.
    Inf,
    /// `(Σ |x|^p)^(1/p)` for a finite `p > 0`.
    P(f64),
}

impl From<f64> for NormOrd {
    fn from(p: f64) -> Self {
        if p == 1.0 {
            NormOrd::L1
        } else if p == 2.0 {
            NormOrd::L2
        } else if p == f64::INFINITY {
            NormOrd::Inf
        } else {
            NormOrd::P(p)
        }
    }
}

impl From<i32> for NormOrd {
    fn from(p: i32) -> Self {
        NormOrd::from(p as f64)
    }
}

impl Tensor {
    /// Product over `dims`; `keepdim` keeps them with size 1. Integers wrap; the product of
    /// no elements is 1.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3], &Device::cpu())?;
    /// assert_eq!(x.prod(&[1], false)?.to_vec::<i64>()?, vec![6, 120]);
    /// assert_eq!(x.prod(&[0], true)?.shape(), &[1, 3]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, dims, keepdim, caller())
    }

    /// Variance over `dims` (float dtypes): `Σ (x - mean)² / (n - correction)`, computed in two
    /// passes (the mean, then the squared deviations). `correction = 1` is the unbiased
    /// (sample) variance, `0` the population variance, as PyTorch's `correction`. When
    /// `n - correction <= 0` the divisor is 0, so the result is inf (or NaN for a zero sum),
    /// as in PyTorch.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::cpu())?;
    /// assert_eq!(x.var(&[0, 1], 1, false)?.to_vec::<f32>()?, vec![5.0 / 3.0]);
    /// assert_eq!(x.var(&[-1], 0, false)?.to_vec::<f32>()?, vec![0.25, 0.25]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn var(&self, dims: &[isize], correction: impl Into<f64>, keepdim: bool) -> Result<Tensor> {
        self.var_at("var", dims, correction.into(), keepdim, caller())
    }

    /// Standard deviation over `dims`: the square root of [`Tensor::var`] (same `correction`).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[2.0f32, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], &[8], &Device::cpu())?;
    /// assert_eq!(x.std(&[0], 0, false)?.to_vec::<f32>()?, vec![2.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn std(&self, dims: &[isize], correction: impl Into<f64>, keepdim: bool) -> Result<Tensor> {
        let site = caller();
        self.var_at("std", dims, correction.into(), keepdim, site)?
            .unary(UnaryOp::Sqrt, site)
    }

    /// Vector norm over `dims` (float dtypes): [`NormOrd`] L1, L2, Inf or a general `p > 0`;
    /// a number converts (`2.0` is L2).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[3.0f32, -4.0], &[2], &Device::cpu())?;
    /// assert_eq!(x.norm(2.0, &[0], false)?.to_vec::<f32>()?, vec![5.0]);
    /// assert_eq!(x.norm(1.0, &[0], false)?.to_vec::<f32>()?, vec![7.0]);
    /// assert_eq!(x.norm(f64::INFINITY, &[0], false)?.to_vec::<f32>()?, vec![4.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn norm(&self, ord: impl Into<NormOrd>, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let site = caller();
        let ord = ord.into();
        check::float("norm", self.dtype)?;
        let dims = self.resolve_dims("norm", dims)?;
        match ord {
            NormOrd::L1 => self
                .unary(UnaryOp::Abs, site)?
                .reduce_resolved(ReduceOp::Sum, dims, keepdim, site),
            NormOrd::L2 => self
                .binary(BinaryOp::Mul, self, site)?
                .reduce_resolved(ReduceOp::Sum, dims, keepdim, site)?
                .unary(UnaryOp::Sqrt, site),
            NormOrd::Inf => {
                if dims.iter().any(|&d| self.shape()[d] == 0) {
                    // max |x| of nothing: 0, as PyTorch's vector_norm.
                    return self.filled_reduced(&dims, keepdim, self.dtype, Scalar::Int(0), site);
                }
                self.unary(UnaryOp::Abs, site)?
                    .reduce_resolved(ReduceOp::Max, dims, keepdim, site)
            }
            NormOrd::P(p) => {
                if !p.is_finite() || p <= 0.0 {
                    return Err(Error::invalid(
                        "norm",
                        format!(
                            "order p = {p} is not supported; pass a finite p > 0, or NormOrd::Inf for the largest magnitude"
                        ),
                    ));
                }
                self.unary(UnaryOp::Abs, site)?
                    .with_scalar(BinaryOp::Pow, Scalar::Float(p), site)?
                    .reduce_resolved(ReduceOp::Sum, dims, keepdim, site)?
                    .with_scalar(BinaryOp::Pow, Scalar::Float(1.0 / p), site)
            }
        }
    }

    /// True (bool) where any element over `dims` is true (non-zero for other dtypes); false
    /// over an empty extent.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 2.0], &[2, 2], &Device::cpu())?;
    /// assert_eq!(x.any(&[1], false)?.to_vec::<bool>()?, vec![false, true]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn any(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.any_all("any", ReduceOp::Max, dims, keepdim, caller())
    }

    /// True (bool) where every element over `dims` is true (non-zero for other dtypes); true
    /// over an empty extent.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1i64, 2, 0, 3], &[2, 2], &Device::cpu())?;
    /// assert_eq!(x.all(&[1], false)?.to_vec::<bool>()?, vec![true, false]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn all(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.any_all("all", ReduceOp::Min, dims, keepdim, caller())
    }

    /// The maximum along `dim` and the index (i64) of its first occurrence, as PyTorch's
    /// `max(dim)`. NaN counts as the maximum. An empty extent is an error.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, 9.0, 3.0, 7.0, 2.0, 7.0], &[2, 3], &Device::cpu())?;
    /// let (values, indices) = x.max_dim(-1, false)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![9.0, 7.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![1, 0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let site = caller();
        let values = self.reduce(ReduceOp::Max, &[dim], keepdim, site)?;
        let indices = self.reduce(ReduceOp::ArgMax, &[dim], keepdim, site)?;
        Ok((self.record_at_index(values, dim, &indices, keepdim)?, indices))
    }

    /// The minimum along `dim` and the index (i64) of its first occurrence. NaN counts as the
    /// minimum. An empty extent is an error.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[4i64, 1, 1, 0], &[2, 2], &Device::cpu())?;
    /// let (values, indices) = x.min_dim(0, true)?;
    /// assert_eq!(values.to_vec::<i64>()?, vec![1, 0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![1, 1]);
    /// assert_eq!(indices.shape(), &[1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let site = caller();
        let values = self.reduce(ReduceOp::Min, &[dim], keepdim, site)?;
        let indices = self.reduce(ReduceOp::ArgMin, &[dim], keepdim, site)?;
        Ok((self.record_at_index(values, dim, &indices, keepdim)?, indices))
    }

    /// Inclusive cumulative sum along `dim`. Integer and bool tensors are widened to i64 first
    /// (as PyTorch does), floats keep their dtype.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2], &Device::cpu())?;
    /// let c = x.cumsum(1)?;
    /// assert_eq!(c.dtype(), DType::I64);
    /// assert_eq!(c.to_vec::<i64>()?, vec![1, 3, 3, 7]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        self.scan(ScanOp::Sum, dim, caller())
    }

    /// Inclusive cumulative product along `dim` (integers and bool widen to i64 first).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], &Device::cpu())?;
    /// assert_eq!(x.cumprod(-1)?.to_vec::<f32>()?, vec![1.0, 2.0, 6.0, 24.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn cumprod(&self, dim: isize) -> Result<Tensor> {
        self.scan(ScanOp::Prod, dim, caller())
    }

    /// Sort along `dim`: `(values, indices)`, indices (i64) being positions along `dim` in
    /// `self`. The sort is stable in both directions (equal keys keep their input order) and
    /// NaN sorts above +inf (last ascending, first descending), as PyTorch with `stable=True`.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[3.0f32, 1.0, 2.0, 1.0], &[4], &Device::cpu())?;
    /// let (values, indices) = x.sort(0, false)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![1.0, 1.0, 2.0, 3.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![1, 3, 2, 0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        self.sort_at(dim, descending, caller())
    }

    /// The indices (i64) that sort `self` along `dim` (stable, as [`Tensor::sort`]).
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[3i64, 1, 2], &[3], &Device::cpu())?;
    /// assert_eq!(x.argsort(0, true)?.to_vec::<i64>()?, vec![0, 2, 1]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        Ok(self.sort_at(dim, descending, caller())?.1)
    }

    /// The `k` largest (or smallest, `largest = false`) elements along `dim` and their indices
    /// (i64), in sorted order. Ties keep their input order (the sort is stable), so among equal
    /// values the lower index comes first; NaN counts as the largest. `k` larger than the
    /// dimension is [`Error::InvalidArgument`] naming `k` and the size.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 5.0], &[4], &Device::cpu())?;
    /// let (values, indices) = x.topk(2, 0, true)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![5.0, 5.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![1, 3]);
    /// assert!(x.topk(5, 0, true).is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let site = caller();
        let d = resolve_dim("topk", dim, self.rank().max(1))?;
        let n = if self.rank() == 0 { 1 } else { self.shape()[d] };
        if k > n {
            return Err(Error::invalid(
                "topk",
                format!(
                    "k = {k} is larger than dimension {dim}, which has n = {n} elements (shape {:?}); pass k <= n",
                    self.shape()
                ),
            ));
        }
        let (values, indices) = self.sort_at(dim, largest, site)?;
        if self.rank() == 0 || k == n {
            return Ok((values, indices));
        }
        let values = values.narrow(d as isize, 0, k)?.contiguous_at(site)?;
        let indices = indices.narrow(d as isize, 0, k)?.contiguous_at(site)?;
        Ok((values, indices))
    }

    fn var_at(&self, name: &'static str, dims: &[isize], correction: f64, keepdim: bool, site: Site) -> Result<Tensor> {
        check::float(name, self.dtype)?;
        if !correction.is_finite() {
            return Err(Error::invalid(
                name,
                format!("correction = {correction} is not finite; pass 1 (sample) or 0 (population)"),
            ));
        }
        let dims = self.resolve_dims(name, dims)?;
        let n: usize = dims.iter().map(|&d| self.shape()[d]).product();
        let mean = self.reduce_resolved(ReduceOp::Mean, dims.clone(), true, site)?;
        let deviation = self.binary(BinaryOp::Sub, &mean, site)?;
        let squares = deviation.binary(BinaryOp::Mul, &deviation, site)?;
        let total = squares.reduce_resolved(ReduceOp::Sum, dims, keepdim, site)?;
        let divisor = (n as f64 - correction).max(0.0);
        total.with_scalar(BinaryOp::Div, Scalar::Float(divisor), site)
    }

    fn any_all(&self, name: &'static str, op: ReduceOp, dims: &[isize], keepdim: bool, site: Site) -> Result<Tensor> {
        let dims = self.resolve_dims(name, dims)?;
        if dims.iter().any(|&d| self.shape()[d] == 0) {
            // Nothing to look at: `any` is false and `all` true, as in PyTorch.
            let value = Scalar::Bool(op == ReduceOp::Min);
            return self.filled_reduced(&dims, keepdim, DType::Bool, value, site);
        }
        self.truthy(site)?.reduce_resolved(op, dims, keepdim, site)
    }

    /// `value` as `dtype`, shaped like the reduction of `dims` (for empty extents).
    fn filled_reduced(&self, dims: &[usize], keepdim: bool, dtype: DType, value: Scalar, site: Site) -> Result<Tensor> {
        let shape: Dims = if keepdim {
            self.shape()
                .iter()
                .enumerate()
                .map(|(i, &s)| if dims.contains(&i) { 1 } else { s })
                .collect()
        } else {
            self.shape_without(dims)
        };
        let out = self.alloc_like(&shape, dtype, site)?;
        let kernel = Kernel::Fill {
            out: out.as_arg(),
            value,
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }

    fn scan(&self, op: ScanOp, dim: isize, site: Site) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.scan(op, dim, site);
        }
        let name = op.name();
        let widened;
        let input = if self.dtype.is_float() {
            self
        } else {
            widened = self.to_dtype(DType::I64)?;
            &widened
        };
        let (d, view) = input.rank1_view(name, dim)?;
        let out = view.alloc_like(view.shape(), view.dtype, site)?;
        let kernel = Kernel::Scan {
            op,
            input: view.as_arg(),
            dim: d,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[&view], out.numel())?;
        let out = if self.rank() == 0 {
            out.view_contiguous(&[])?
        } else {
            out
        };
        Ok(graph::record(out, name, &[self], |out| {
            if self.rank() == 0 {
                formulas::elementwise::identity()
            } else if op == ScanOp::Sum {
                formulas::reduce::cumsum(d)
            } else {
                formulas::reduce::cumprod(self, out, d)
            }
        }))
    }

    fn sort_at(&self, dim: isize, descending: bool, site: Site) -> Result<(Tensor, Tensor)> {
        let (d, view) = self.rank1_view("sort", dim)?;
        let values = view.alloc_like(view.shape(), view.dtype, site)?;
        let indices = view.alloc_like(view.shape(), DType::I64, site)?;
        let kernel = Kernel::Sort {
            input: view.as_arg(),
            dim: d,
            descending,
            values: values.as_arg(),
            indices: indices.as_arg(),
        };
        values.launch(&kernel, &[&indices, &view], values.numel())?;
        if self.rank() == 0 {
            let values = graph::record(values.view_contiguous(&[])?, "sort", &[self], |_| {
                formulas::elementwise::identity()
            });
            return Ok((values, indices.view_contiguous(&[])?));
        }
        let values = graph::record(values, "sort", &[self], |_| {
            formulas::reduce::take_along(self, d, &indices, true)
        });
        Ok((values, indices))
    }

    /// `dim` resolved, with a 0-d tensor seen as shape `[1]` (PyTorch accepts dim 0 or -1 on a
    /// scalar for scans and sorts).
    /// `values` re-recorded so that its gradient goes to the element `indices` names (as
    /// PyTorch's `max(dim)`/`min(dim)` do), not shared among ties.
    fn record_at_index(&self, values: Tensor, dim: isize, indices: &Tensor, keepdim: bool) -> Result<Tensor> {
        if !graph::tracking(&[self]) {
            return Ok(values);
        }
        let d = resolve_dim("max_dim", dim, self.rank())?;
        Ok(graph::record(values.with_link(None), "max_dim", &[self], |_| {
            formulas::reduce::take_along(self, d, indices, keepdim)
        }))
    }

    fn rank1_view(&self, name: &'static str, dim: isize) -> Result<(usize, Tensor)> {
        if self.rank() == 0 {
            resolve_dim(name, dim, 1).map_err(|_| Error::DimOutOfRange { op: name, dim, rank: 0 })?;
            return Ok((0, self.with_layout(self.layout.unsqueeze(0)?)));
        }
        Ok((resolve_dim(name, dim, self.rank())?, self.clone()))
    }
}
