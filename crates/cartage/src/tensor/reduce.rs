//! Reductions over chosen dimensions (sum, mean, max, min, logsumexp, argmax, argmin), their
//! whole-tensor forms, and softmax / log-softmax along one dimension.
//!
//! Sum, max and min keep the dtype (integer sums wrap); mean and logsumexp need a float dtype;
//! argmax/argmin return i64. Max, min and the arg forms of an empty extent are an error.

use cartage_core::{Dims, Error, Kernel, Op, ReduceOp, Result, Site, resolve_dim};

use super::{Tensor, caller, check};

impl Tensor {
    /// Sum over `dims` (negative counts from the end); `keepdim` keeps them with size 1.
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim, caller())
    }

    /// Mean over `dims` (float dtypes).
    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dims, keepdim, caller())
    }

    /// Maximum over `dims` (NaN propagates).
    #[track_caller]
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim, caller())
    }

    /// Minimum over `dims` (NaN propagates).
    #[track_caller]
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim, caller())
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably (float dtypes).
    #[track_caller]
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::LogSumExp, dims, keepdim, caller())
    }

    /// Index (i64) of the first maximum along `dim`.
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, &[dim], keepdim, caller())
    }

    /// Index (i64) of the first minimum along `dim`.
    #[track_caller]
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, &[dim], keepdim, caller())
    }

    /// Sum of every element, shape `[]`.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum, caller())
    }

    /// Mean of every element, shape `[]` (float dtypes).
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Mean, caller())
    }

    /// Maximum of every element, shape `[]`.
    #[track_caller]
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Max, caller())
    }

    /// Minimum of every element, shape `[]`.
    #[track_caller]
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Min, caller())
    }

    /// Softmax along `dim` (float dtypes).
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false, caller())
    }

    /// Log-softmax along `dim` (float dtypes).
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true, caller())
    }

    fn reduce_all(&self, op: ReduceOp, site: Site) -> Result<Tensor> {
        if self.rank() == 0 {
            return self
                .with_layout(self.layout.unsqueeze(0)?)
                .reduce(op, &[0], false, site);
        }
        let dims: Dims = (0..self.rank()).collect();
        self.reduce_resolved(op, dims, false, site)
    }

    pub(super) fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool, site: Site) -> Result<Tensor> {
        let resolved = self.resolve_dims(op.name(), dims)?;
        self.reduce_resolved(op, resolved, keepdim, site)
    }

    /// `dims` (negative from the end) as sorted, distinct indices; an empty list, a dimension
    /// out of range or one named twice is an error naming `name` and the dims given.
    pub(super) fn resolve_dims(&self, name: &'static str, dims: &[isize]) -> Result<Dims> {
        if dims.is_empty() {
            return Err(Error::invalid(
                name,
                "no dimension given; name the dimensions to reduce, or use the `_all` form for every element",
            ));
        }
        let mut resolved = Dims::new();
        for &d in dims {
            resolved.push(resolve_dim(name, d, self.rank())?);
        }
        resolved.sort_unstable();
        if resolved.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                name,
                format!("dimensions {dims:?} name one dimension twice"),
            ));
        }
        Ok(resolved)
    }

    pub(super) fn reduce_resolved(&self, op: ReduceOp, dims: Dims, keepdim: bool, site: Site) -> Result<Tensor> {
        let name = op.name();
        match op {
            ReduceOp::Mean | ReduceOp::LogSumExp => check::float(name, self.dtype)?,
            _ => check::defined_for(name, Op::Reduce(op), self.dtype, "a numeric dtype")?,
        }
        let needs_elements = matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin);
        if needs_elements && dims.iter().any(|&d| self.shape()[d] == 0) {
            return Err(Error::invalid(
                name,
                format!(
                    "cannot take the {name} of an empty dimension (shape {:?})",
                    self.shape()
                ),
            ));
        }
        let mut kept: Dims = Dims::from_slice(self.shape());
        for &d in &dims {
            kept[d] = 1;
        }
        let out = self.alloc_like(&kept, op.output_dtype(self.dtype), site)?;
        let kernel = Kernel::Reduce {
            op,
            input: self.as_arg(),
            dims: dims.clone(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        if keepdim {
            Ok(out)
        } else {
            out.view_contiguous(&self.shape_without(&dims))
        }
    }

    fn softmax_impl(&self, dim: isize, log: bool, site: Site) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        let d = resolve_dim(name, dim, self.rank())?;
        check::float(name, self.dtype)?;
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Softmax {
            input: self.as_arg(),
            dim: d,
            log,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        Ok(out)
    }
}
