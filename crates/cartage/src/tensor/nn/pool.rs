//! 2-D max and average pooling: one `Reduce` (max, mean or sum) over the kernel dimensions of
//! the strided window view of the padded input, read in place (no im2col copy).

use cartage_core::{Error, Result, Scalar, Site};

use super::window::Window;
use crate::autograd::graph;
use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// 2-D max pooling of this input `[N, C, H, W]` (or `[C, H, W]`) with windows of `kernel`
    /// taps moved by `stride`, after `padding` rows and columns of `-inf` on both sides
    /// (`[height, width]` each). The output is `[N, C, OH, OW]` with
    /// `OH = (H + 2·padding - kernel) / stride + 1`. Padding may be at most half the kernel, as
    /// in PyTorch, so no window is all padding. Float dtypes; NaN propagates.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0, 7.0], &[1, 1, 3, 3], &Device::cpu())?;
    /// let y = x.max_pool2d([2, 2], [1, 1], [0, 0])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 5.0, 9.0, 8.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d(&self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor> {
        let site = caller();
        if graph::tracking(&[self]) {
            let out = {
                let _plain = crate::autograd::no_grad();
                self.pool2d(Pool::Max, kernel, stride, padding, site)?
            };
            let window = Window {
                kernel,
                stride,
                padding,
                dilation: [1, 1],
            };
            return Ok(graph::record(out, "max_pool2d", &[self], |_| {
                super::grad::max_pool2d(self, window, site)
            }));
        }
        self.pool2d(Pool::Max, kernel, stride, padding, site)
    }

    /// 2-D average pooling of this input `[N, C, H, W]` (or `[C, H, W]`) with windows of
    /// `kernel` taps moved by `stride`, after `padding` rows and columns of zeros on both sides
    /// (`[height, width]` each). With `count_include_pad` every window divides by
    /// `kernel[0]·kernel[1]` (PyTorch's default); without it, by the number of its taps inside
    /// the input. Padding may be at most half the kernel, as in PyTorch. Float dtypes.
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
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let site = caller();
        let pool = if count_include_pad {
            Pool::Mean
        } else {
            Pool::MeanOfInside
        };
        self.pool2d(pool, kernel, stride, padding, site)
    }

    fn pool2d(
        &self,
        pool: Pool,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        site: Site,
    ) -> Result<Tensor> {
        if self.rank() == 3 {
            let out = self.unsqueeze(0)?.pool2d(pool, kernel, stride, padding, site)?;
            return out.squeeze(0);
        }
        let name = pool.name();
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
        let window = Window {
            kernel,
            stride,
            padding,
            dilation: [1, 1],
        };
        let spatial = [self.shape()[2], self.shape()[3]];
        let out_hw = window
            .output_size(spatial)
            .map_err(|reason| Error::invalid(name, format!("input shape {:?}: {reason}", self.shape())))?;
        let fill = match pool {
            Pool::Max => Scalar::Float(f64::NEG_INFINITY),
            Pool::Mean | Pool::MeanOfInside => Scalar::Int(0),
        };
        let windows = self.padded_2d(padding, fill, site)?.window_view(&window, out_hw)?;
        let out_shape = [self.shape()[0], self.shape()[1], out_hw[0], out_hw[1]];
        let reduced = match pool {
            Pool::Max => windows.max(&[2, 3], false)?,
            Pool::Mean => windows.mean(&[2, 3], false)?,
            Pool::MeanOfInside => {
                let sums = windows.sum(&[2, 3], false)?;
                // The taps of each window inside the input: the same pooling of a padded plane
                // of ones, [1, 1, OH, OW], broadcast over N and C.
                let ones = self.fill_new_like(&[1, 1, spatial[0], spatial[1]], self.dtype, Scalar::Int(1), site)?;
                let counts = ones
                    .padded_2d(padding, Scalar::Int(0), site)?
                    .window_view(&window, out_hw)?
                    .sum(&[2, 3], false)?;
                sums.div(&counts)?
            }
        };
        debug_assert_eq!(reduced.shape(), out_shape);
        Ok(reduced)
    }
}

/// Which pooling.
#[derive(Clone, Copy, Debug)]
enum Pool {
    Max,
    /// Divide by the whole window.
    Mean,
    /// Divide by the window's taps inside the input.
    MeanOfInside,
}

impl Pool {
    fn name(self) -> &'static str {
        match self {
            Pool::Max => "max_pool2d",
            Pool::Mean | Pool::MeanOfInside => "avg_pool2d",
        }
    }
}
