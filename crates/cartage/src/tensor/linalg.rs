//! `matmul` with numpy's rules: 1-D × 1-D is a dot product, a 1-D operand gains (and then loses)
//! a unit dimension, and operands of rank ≥ 3 broadcast their batch dimensions. Everything runs
//! as one `Kernel::Matmul` on `[B, M, K] × [B, K, N]`; batch dimensions are collapsed as a view
//! when the strides allow it (always for contiguous or broadcast operands), else the operand is
//! copied, logged and counted as an implicit copy.

use cartage_core::{Dims, Error, Kernel, Layout, Result, Scalar, Site, broadcast_shapes, checked_bytes};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};
use crate::runtime;

impl Tensor {
    /// Matrix product (see the module docs for ranks and broadcasting). Float dtypes only.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let a = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu)?;
    /// let b = Tensor::new([[5.0f32, 6.0], [7.0, 8.0]], &cpu)?;
    /// assert_eq!(a.matmul(&b)?.to_vec2::<f32>()?, vec![vec![19.0, 22.0], vec![43.0, 50.0]]);
    /// let batch = Tensor::zeros(&[3, 2, 4], DType::F32, &cpu)?; // [4, 5] broadcasts over 3
    /// assert_eq!(batch.matmul(&Tensor::zeros(&[4, 5], DType::F32, &cpu)?)?.shape(), &[3, 2, 5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let site = caller();
        if crate::autocast::autocast_dtype().is_some_and(|d| self.dtype != d || rhs.dtype != d) {
            let (a, b) = (crate::autocast::lower(self)?, crate::autocast::lower(rhs)?);
            if a.dtype != self.dtype || b.dtype != rhs.dtype {
                return a.matmul(&b);
            }
        }
        if graph::tracking(&[self, rhs]) {
            let out = {
                let _plain = crate::autograd::no_grad();
                self.matmul_at(rhs, site)?
            };
            return Ok(graph::record(out, "matmul", &[self, rhs], |_| {
                formulas::linalg::matmul(self, rhs)
            }));
        }
        self.matmul_at(rhs, site)
    }

    fn matmul_at(&self, rhs: &Tensor, site: Site) -> Result<Tensor> {
        check::same_device_and_dtype("matmul", self, rhs)?;
        check::float("matmul", self.dtype)?;
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
                reason: "both operands need at least one dimension; use `mul` to scale by a scalar".into(),
            });
        }
        let lhs = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let rhs_m = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let out = lhs.matmul_batched(&rhs_m, site)?;
        let mut shape: Dims = Dims::from_slice(out.shape());
        if rhs.rank() == 1 {
            shape.remove(shape.len() - 1);
        }
        if self.rank() == 1 {
            shape.remove(shape.len() - if rhs.rank() == 1 { 1 } else { 2 });
        }
        out.view_contiguous(&shape)
    }

    /// Both operands of rank ≥ 2.
    fn matmul_batched(&self, rhs: &Tensor, site: Site) -> Result<Tensor> {
        let (ls, rs) = (self.shape(), rhs.shape());
        let (m, k) = (ls[ls.len() - 2], ls[ls.len() - 1]);
        let (k2, n) = (rs[rs.len() - 2], rs[rs.len() - 1]);
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: "matmul",
            lhs: ls.to_vec(),
            rhs: rs.to_vec(),
            reason,
        };
        if k != k2 {
            return Err(mismatch(format!(
                "the inner dimensions differ: {k} columns on the left, {k2} rows on the right"
            )));
        }
        let batch = broadcast_shapes(&ls[..ls.len() - 2], &rs[..rs.len() - 2])
            .map_err(|_| mismatch("the batch dimensions do not broadcast".into()))?;
        let mut out_shape = batch.clone();
        out_shape.extend_from_slice(&[m, n]);
        // Checked before anything is computed from it: the batch product of two broadcast
        // operands can overflow even when each operand is small.
        checked_bytes(&out_shape, self.dtype)?;
        let out = self.alloc_like(&out_shape, self.dtype, site)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        // The output is not empty, so every batch size is at least 1 and the product is at most
        // the output's element count.
        let b: usize = batch.iter().product();
        if k == 0 {
            let fill = Kernel::Fill {
                out: out.as_arg(),
                value: Scalar::Int(0),
            };
            out.launch(&fill, &[], out.numel())?;
            return Ok(out);
        }
        let lhs3 = self.batch_view(&batch, [m, k], b, site)?;
        let rhs3 = rhs.batch_view(&batch, [k, n], b, site)?;
        let out3 = Layout::contiguous(&[b, m, n])?;
        let kernel = Kernel::Matmul {
            lhs: lhs3.as_arg(),
            rhs: rhs3.as_arg(),
            out: out.arg_with(out3),
        };
        out.launch(&kernel, &[&lhs3, &rhs3], out.numel())?;
        Ok(out)
    }

    /// This operand broadcast to `batch + matrix` and viewed as `[b, rows, cols]`.
    fn batch_view(&self, batch: &[usize], matrix: [usize; 2], b: usize, site: Site) -> Result<Tensor> {
        let mut full: Dims = Dims::from_slice(batch);
        full.extend_from_slice(&matrix);
        let broadcast = self.layout.broadcast_to(&full).map_err(|e| e.with_dtype(self.dtype))?;
        let target = [b, matrix[0], matrix[1]];
        if let Some(layout) = broadcast.reshape(&target)? {
            return Ok(self.with_layout(layout));
        }
        let copy = self.with_layout(broadcast).contiguous_at(site)?;
        runtime::record_implicit_copy("matmul batch", copy.size_in_bytes(), site);
        copy.view_contiguous(&target)
    }
}
