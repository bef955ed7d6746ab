//! Indexing by tensors: `gather` (torch.gather) and `index_select`. Index tensors are i32 or
//! i64 on every device (a float index is [`Error::WrongDType`] everywhere, R27); an index out of
//! range is [`Error::IndexOutOfRange`] reported by the device, never garbage.

use cartage_core::{Dims, Error, Kernel, Result, Site, resolve_dim};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

impl Tensor {
    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim = 0` (and likewise for other
    /// dims): the output has `index`'s shape; `index` has this tensor's rank and no dimension
    /// other than `dim` larger than this tensor's. Negative `dim` counts from the end.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &Device::cpu())?;
    /// let index = Tensor::new([[0i64, 0], [1, 0]], &Device::cpu())?;
    /// assert_eq!(x.gather(1, &index)?.to_vec::<f32>()?, vec![1.0, 1.0, 4.0, 3.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let site = caller();
        check::same_device("gather", self, index)?;
        check::index_dtype("gather", index)?;
        let d = resolve_dim("gather", dim, self.rank())?;
        let fits = index.rank() == self.rank()
            && index
                .shape()
                .iter()
                .zip(self.shape())
                .enumerate()
                .all(|(i, (&n, &s))| i == d || n <= s);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: "gather",
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
                reason: format!(
                    "the index must have the input's rank and no dimension other than {d} larger than the input's"
                ),
            });
        }
        let out = self.alloc_like(index.shape(), self.dtype, site)?;
        let kernel = Kernel::Gather {
            input: self.as_arg(),
            index: index.as_arg(),
            dim: d,
            out: out.as_arg(),
        };
        out.launch_indexed(&kernel, &[self, index], index, out.numel())?;
        Ok(graph::record(out, "gather", &[self], |_| {
            formulas::index::gather(self, d, index)
        }))
    }

    /// The entries of dimension `dim` (negative counts from the end) listed by the 1-D i32/i64
    /// `index`, in that order (repeats allowed); a copy, not a view.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[3, 2])?;
    /// let rows = x.index_select(0, &Tensor::new([2i32, 0, 2], &Device::cpu())?)?;
    /// assert_eq!(rows.to_vec2::<i64>()?, vec![vec![4, 5], vec![0, 1], vec![4, 5]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_select", dim, self.rank())?;
        self.index_select_at(d, index, caller())
    }

    /// [`Tensor::index_select`] along the resolved dimension `d`.
    pub(super) fn index_select_at(&self, d: usize, index: &Tensor, site: Site) -> Result<Tensor> {
        check::same_device("index_select", self, index)?;
        check::index_dtype("index_select", index)?;
        if index.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: "index_select",
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
                reason: "the index must be one-dimensional".into(),
            });
        }
        let mut shape: Dims = Dims::from_slice(self.shape());
        shape[d] = index.numel();
        let out = self.alloc_like(&shape, self.dtype, site)?;
        let kernel = Kernel::IndexSelect {
            input: self.as_arg(),
            index: index.as_arg(),
            dim: d,
            out: out.as_arg(),
        };
        out.launch_indexed(&kernel, &[self, index], index, out.numel())?;
        Ok(graph::record(out, "index_select", &[self], |_| {
            formulas::index::index_select(self, d, index)
        }))
    }
}
