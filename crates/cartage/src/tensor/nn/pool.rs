//! 2-D max and average pooling. Where the backend lists the fused `Kernel::Pool2d` for the
//! dtype (every backend for the float dtypes), one pass over the input writes the output, and
//! max pooling's indices when asked; elsewhere one `Reduce` (max, mean or sum) runs over the
//! kernel dimensions of the strided window view of the padded input, read in place (no im2col
//! copy). The backward passes are in `pool_grad.rs`.

use cartage_core::{DType, Error, Kernel, Op, PoolKind, PoolMode, PoolWindow, Result, Scalar, Site};

use super::window::Window;
use crate::autograd::graph;
use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// 2-D max pooling of this input `[N, C, H, W]` (or `[C, H, W]`) with windows of `kernel`
    /// taps moved by `stride`, after `padding` rows and columns of `-inf` on both sides
    /// (`[height, width]` each); `stride` `None` is the kernel (PyTorch's default). The output
    /// is `[N, C, OH, OW]` with
    /// `OH = (H + 2·padding - kernel) / stride + 1`. Padding may be at most half the kernel, as
    /// in PyTorch, so no window is all padding. Float dtypes; NaN propagates. The gradient goes
    /// to the first maximum of each window (the first NaN where there is one).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0, 7.0], &[1, 1, 3, 3], &Device::cpu())?;
    /// let y = x.max_pool2d([2, 2], [1, 1], [0, 0])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 5.0, 9.0, 8.0]);
    /// assert_eq!(x.max_pool2d([2, 2], None, [0, 0])?.to_vec::<f32>()?, vec![5.0]); // stride = kernel
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: impl Into<Option<[usize; 2]>>,
        padding: [usize; 2],
    ) -> Result<Tensor> {
        let site = caller();
        let stride = stride.into().unwrap_or(kernel);
        Ok(self
            .max_pool2d_at(PoolWindow::new(kernel, stride, padding), false, site)?
            .0)
    }

    /// [`Tensor::max_pool2d`], also returning where each maximum was: an i64 tensor of the
    /// output's shape holding the flat index `y·W + x` of the chosen tap in its `[H, W]` input
    /// plane (PyTorch's `return_indices=True`). The indices carry no gradient.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0, 7.0], &[1, 1, 3, 3], &Device::cpu())?;
    /// let (y, at) = x.max_pool2d_with_indices([2, 2], [1, 1], [0, 0])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 5.0, 9.0, 8.0]);
    /// assert_eq!(at.to_vec::<i64>()?, vec![1, 1, 6, 7]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d_with_indices(
        &self,
        kernel: [usize; 2],
        stride: impl Into<Option<[usize; 2]>>,
        padding: [usize; 2],
    ) -> Result<(Tensor, Tensor)> {
        let site = caller();
        let stride = stride.into().unwrap_or(kernel);
        let (values, indices) = self.max_pool2d_at(PoolWindow::new(kernel, stride, padding), true, site)?;
        let indices = indices.ok_or_else(|| Error::invalid("max_pool2d", "internal: no indices were computed"))?;
        let indices = graph::record_constant(indices, "max_pool2d indices", &[self]);
        Ok((values, indices))
    }

    /// 2-D average pooling of this input `[N, C, H, W]` (or `[C, H, W]`) with windows of
    /// `kernel` taps moved by `stride`, after `padding` rows and columns of zeros on both sides
    /// (`[height, width]` each). With `count_include_pad` every window divides by
    /// `kernel[0]·kernel[1]` (PyTorch's default); without it, by the number of its taps inside
    /// the input. Padding may be at most half the kernel, as in PyTorch; `stride` `None` is the
    /// kernel. Float dtypes.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2], &Device::cpu())?;
    /// let y = x.avg_pool2d([2, 2], [2, 2], [0, 0], true)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![2.5]);
    /// let edges = x.avg_pool2d([2, 2], [1, 1], [1, 1], false)?;
    /// assert_eq!(edges.to_vec::<f32>()?[0], 1.0); // the corner window sees one input
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: impl Into<Option<[usize; 2]>>,
        padding: [usize; 2],
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let site = caller();
        let stride = stride.into().unwrap_or(kernel);
        let mode = PoolMode::Avg { count_include_pad };
        let window = PoolWindow::new(kernel, stride, padding);
        let fused_backward = self.lists(Op::Pool2dBackward(PoolKind::Avg));
        if graph::tracking(&[self]) && fused_backward {
            let out = {
                let _plain = crate::autograd::no_grad();
                self.pool2d(mode, window, false, site)?.0
            };
            return Ok(graph::record(out, "avg_pool2d", &[self], |_| {
                super::pool_grad::avg_pool2d(self, mode, window, site)
            }));
        }
        // Without the fused backward, the composed forward records its own differentiable ops.
        Ok(self.pool2d(mode, window, false, site)?.0)
    }

    /// Max pooling with autograd: the fused backward from the forward's indices where the
    /// backend lists it, else the composed one (which recomputes the argmax from the input).
    fn max_pool2d_at(&self, window: PoolWindow, want_indices: bool, site: Site) -> Result<(Tensor, Option<Tensor>)> {
        if !graph::tracking(&[self]) {
            return self.pool2d(PoolMode::Max, window, want_indices, site);
        }
        let fused_backward = self.lists(Op::Pool2dBackward(PoolKind::Max)) && self.lists(Op::Pool2d(PoolKind::Max));
        let (out, indices) = {
            let _plain = crate::autograd::no_grad();
            self.pool2d(PoolMode::Max, window, want_indices || fused_backward, site)?
        };
        let saved = indices.clone();
        let out = graph::record(out, "max_pool2d", &[self], |_| match saved {
            Some(at) if fused_backward => super::pool_grad::max_pool2d_fused(self, at, window, site),
            _ => super::pool_grad::max_pool2d_composed(self, window, site),
        });
        Ok((out, indices.filter(|_| want_indices)))
    }

    /// Whether this tensor's backend lists the fused `op` for its dtype.
    pub(super) fn lists(&self, op: Op) -> bool {
        self.backend().capabilities().supports(op, self.dtype)
    }

    /// The pooled output and, for max pooling when `want_indices`, the i64 indices.
    fn pool2d(
        &self,
        mode: PoolMode,
        window: PoolWindow,
        want_indices: bool,
        site: Site,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if self.rank() == 3 {
            let (out, indices) = self.unsqueeze(0)?.pool2d(mode, window, want_indices, site)?;
            return Ok((out.squeeze(0)?, indices.map(|i| i.squeeze(0)).transpose()?));
        }
        let name = mode.kind().name();
        check::float(name, self.dtype)?;
        if self.rank() != 4 {
            return Err(Error::invalid(
                name,
                format!(
                    "the input has shape {:?}; it must be [N, C, H, W] or [C, H, W]",
                    self.shape()
                ),
            ));
        }
        let PoolWindow {
            kernel,
            stride,
            padding,
            dilation,
        } = window;
        for axis in 0..2 {
            if padding[axis] > kernel[axis] / 2 {
                return Err(Error::invalid(
                    name,
                    format!(
                        "padding {:?} must be at most half the kernel {kernel:?} on each axis",
                        padding
                    ),
                ));
            }
        }
        let spatial = [self.shape()[2], self.shape()[3]];
        let view = Window {
            kernel,
            stride,
            padding,
            dilation,
        };
        let out_hw = view
            .output_size(spatial)
            .map_err(|reason| Error::invalid(name, format!("input shape {:?}: {reason}", self.shape())))?;
        let out_shape = [self.shape()[0], self.shape()[1], out_hw[0], out_hw[1]];
        let want_indices = want_indices && mode == PoolMode::Max;
        if self.lists(Op::Pool2d(mode.kind())) {
            let out = self.alloc_like(&out_shape, self.dtype, site)?;
            let indices = want_indices
                .then(|| self.alloc_like(&out_shape, DType::I64, site))
                .transpose()?;
            let kernel = Kernel::Pool2d {
                mode,
                window,
                input: self.as_arg(),
                out: out.as_arg(),
                indices: indices.as_ref().map(Tensor::as_arg),
            };
            let mut operands = vec![self];
            operands.extend(indices.as_ref());
            out.launch(&kernel, &operands, out.numel())?;
            return Ok((out, indices));
        }
        if want_indices {
            return Err(Error::unsupported(
                "max_pool2d_with_indices",
                self.dtype,
                self.device,
                "the indices come from the fused pooling kernel, which this device does not list for the dtype; \
                 use `max_pool2d`, or move the input to a device that lists `max_pool2d` in `capabilities()`",
            ));
        }
        let fill = match mode {
            PoolMode::Max => Scalar::Float(f64::NEG_INFINITY),
            PoolMode::Avg { .. } => Scalar::Int(0),
        };
        let windows = self.padded_2d(padding, fill, site)?.window_view(&view, out_hw)?;
        let reduced = match mode {
            PoolMode::Max => windows.max(&[2, 3], false)?,
            PoolMode::Avg {
                count_include_pad: true,
            } => windows.mean(&[2, 3], false)?,
            PoolMode::Avg {
                count_include_pad: false,
            } => {
                let sums = windows.sum(&[2, 3], false)?;
                // The taps of each window inside the input: the same pooling of a padded plane
                // of ones, [1, 1, OH, OW], broadcast over N and C.
                let ones = self.fill_new_like(&[1, 1, spatial[0], spatial[1]], self.dtype, Scalar::Int(1), site)?;
                let counts = ones
                    .padded_2d(padding, Scalar::Int(0), site)?
                    .window_view(&view, out_hw)?
                    .sum(&[2, 3], false)?;
                sums.div(&counts)?
            }
        };
        debug_assert_eq!(reduced.shape(), out_shape);
        Ok((reduced, None))
    }
}
