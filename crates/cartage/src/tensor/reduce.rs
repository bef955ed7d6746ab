//! Reductions over chosen dimensions (sum, mean, max, min, logsumexp, argmax, argmin), their
//! whole-tensor forms, and softmax / log-softmax along one dimension.
//!
//! Sum, max and min keep the dtype (integer sums wrap); mean and logsumexp need a float dtype;
//! argmax/argmin return i64. Max, min and the arg forms of an empty extent are an error.

use cartage_core::{Dims, Error, Kernel, Op, ReduceOp, Result, Site, resolve_dim};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

impl Tensor {
    /// Sum over `dims` (negative counts from the end); `keepdim` keeps them with size 1.
    /// The list may not be empty (use [`Tensor::sum_all`] for every element); integer sums wrap.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.sum(&[0], false)?.to_vec::<f32>()?, vec![5.0, 7.0, 9.0]);
    /// let rows = x.sum(&[-1], true)?;
    /// assert_eq!((rows.shape(), rows.to_vec::<f32>()?), (&[2usize, 1][..], vec![6.0, 15.0]));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim, caller())
    }

    /// Mean over `dims` (negative counts from the end; float dtypes); `keepdim` keeps them with
    /// size 1.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.mean(&[1], false)?.to_vec::<f32>()?, vec![2.0, 5.0]);
    /// assert_eq!(x.mean(&[0, 1], true)?.shape(), &[1, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dims, keepdim, caller())
    }

    /// Maximum over `dims` (negative counts from the end; NaN propagates; an empty dimension is
    /// an error); `keepdim` keeps them with size 1. [`Tensor::max_dim`] also gives the indices.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.max(&[0], false)?.to_vec::<f32>()?, vec![4.0, 5.0, 6.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim, caller())
    }

    /// Minimum over `dims` (negative counts from the end; NaN propagates; an empty dimension is
    /// an error); `keepdim` keeps them with size 1. [`Tensor::min_dim`] also gives the indices.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.min(&[-1], false)?.to_vec::<f32>()?, vec![1.0, 4.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim, caller())
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably (float dtypes); `keepdim` keeps them
    /// with size 1.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[0.0f32, 0.0], [1000.0, 1000.0]], &Device::cpu())?;
    /// let y = x.logsumexp(&[1], false)?.to_vec::<f32>()?;
    /// assert!((y[0] - 2f32.ln()).abs() < 1e-6 && (y[1] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::LogSumExp, dims, keepdim, caller())
    }

    /// Index (i64) of the first maximum along `dim` (negative counts from the end); `keepdim`
    /// keeps `dim` with size 1.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 3.0, 3.0], [4.0, 0.0, 2.0]], &Device::cpu())?;
    /// let i = x.argmax(1, false)?;
    /// assert_eq!((i.dtype(), i.to_vec::<i64>()?), (DType::I64, vec![1, 0]));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, &[dim], keepdim, caller())
    }

    /// Index (i64) of the first minimum along `dim` (negative counts from the end); `keepdim`
    /// keeps `dim` with size 1.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 3.0, 1.0], [4.0, 0.0, 2.0]], &Device::cpu())?;
    /// assert_eq!(x.argmin(-1, true)?.to_vec2::<i64>()?, vec![vec![0], vec![1]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, &[dim], keepdim, caller())
    }

    /// Sum of every element, shape `[]` (read it with [`Tensor::item`]).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// let total = x.sum_all()?;
    /// assert_eq!((total.shape(), total.item::<f32>()?), (&[][..], 21.0));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum, caller())
    }

    /// Mean of every element, shape `[]` (float dtypes).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.mean_all()?.item::<f32>()?, 3.5);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Mean, caller())
    }

    /// Maximum of every element, shape `[]` (an empty tensor is an error).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.max_all()?.item::<f32>()?, 6.0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Max, caller())
    }

    /// Minimum of every element, shape `[]` (an empty tensor is an error).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.min_all()?.item::<f32>()?, 1.0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Min, caller())
    }

    /// Softmax along `dim` (negative counts from the end; float dtypes): each slice along `dim`
    /// sums to 1.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[0.0f32, 3f32.ln()], [5.0, 5.0]], &Device::cpu())?;
    /// let y = x.softmax(-1)?.to_vec::<f32>()?;
    /// assert!(y.iter().zip([0.25, 0.75, 0.5, 0.5]).all(|(a, b)| (a - b).abs() < 1e-6));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false, false, caller())
    }

    /// Log-softmax along `dim` (negative counts from the end; float dtypes).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([1.0f32, 1.0], &Device::cpu())?;
    /// let y = x.log_softmax(0)?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|v| (v + 2f32.ln()).abs() < 1e-6));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true, false, caller())
    }

    fn reduce_all(&self, op: ReduceOp, site: Site) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.unsqueeze(0)?.reduce(op, &[0], false, site);
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
        if matches!(
            op,
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::LogSumExp
        ) && let Some(wide) = crate::autocast::widened(self)?
        {
            return wide.reduce_resolved(op, dims, keepdim, site);
        }
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
        let out = if keepdim {
            out
        } else {
            out.view_contiguous(&self.shape_without(&dims))?
        };
        Ok(self.record_reduce(op, out, dims, keepdim))
    }

    /// Record a reduction's result for autograd (argmax, argmin and the logical ones have no
    /// derivative).
    fn record_reduce(&self, op: ReduceOp, out: Tensor, dims: Dims, keepdim: bool) -> Tensor {
        use formulas::reduce as f;
        let name = op.name();
        match op {
            ReduceOp::Sum => graph::record(out, name, &[self], |_| f::sum(self, dims, keepdim, 1.0)),
            ReduceOp::Mean => graph::record(out, name, &[self], |_| {
                let count: usize = dims.iter().map(|&d| self.shape()[d]).product();
                f::sum(self, dims, keepdim, 1.0 / count.max(1) as f64)
            }),
            ReduceOp::Max | ReduceOp::Min => {
                graph::record(out, name, &[self], |out| f::extreme(self, out, dims, keepdim))
            }
            ReduceOp::Prod => graph::record(out, name, &[self], |_| f::prod(self, dims, keepdim)),
            ReduceOp::LogSumExp => graph::record(out, name, &[self], |out| f::logsumexp(self, out, dims, keepdim)),
            _ => graph::record_constant(out, name, &[self]),
        }
    }

    /// Softmax over the last dimension with attention's causal mask on the last two
    /// `[.., L, S]`: element `(i, j)` with `j > i` is 0 and the rest of its row sums to 1, as
    /// `where(j <= i, x, -inf).softmax(-1)` in one pass (and without the masked scores to
    /// differentiate: softmax's own derivative gives them 0). `None` where the backend refuses
    /// it with `Unsupported`: the caller masks with `where` instead.
    #[track_caller]
    pub(crate) fn causal_softmax(&self) -> Result<Option<Tensor>> {
        match self.softmax_impl(-1, false, true, caller()) {
            Ok(p) => Ok(Some(p)),
            Err(Error::Unsupported { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn softmax_impl(&self, dim: isize, log: bool, causal: bool, site: Site) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.softmax_impl(dim, log, causal, site);
        }
        let name = if log { "log_softmax" } else { "softmax" };
        let d = resolve_dim(name, dim, self.rank())?;
        check::float(name, self.dtype)?;
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Softmax {
            input: self.as_arg(),
            dim: d,
            log,
            causal,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        Ok(graph::record(out, name, &[self], |out| {
            formulas::reduce::softmax(out, d, log)
        }))
    }
}
