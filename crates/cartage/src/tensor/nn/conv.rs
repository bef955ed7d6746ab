//! 2-D convolution. Where the backend lists the fused `Kernel::Conv2d` for the dtype (CUDA with
//! cuDNN), one launch into a fresh contiguous output, then the bias added in place. Elsewhere
//! im2col plus one batched matmul: the padded input is seen through a strided window view
//! `[N, G, C/G, kh, kw, OH, OW]`, copied contiguous once (the column matrix
//! `[N, G, C/G·kh·kw, OH·OW]`) and multiplied by the weight `[G, O/G, C/G·kh·kw]`, giving
//! `[N, O, OH, OW]` without a further copy.

use cartage_core::{BinaryOp, Error, Kernel, Layout, Op, Result, Scalar, Site};

use super::window::Window;
use crate::autograd::graph;
use crate::tensor::{Tensor, caller, check};

/// Options of [`Tensor::conv2d`], per spatial axis `[height, width]`. The default is PyTorch's:
/// stride 1, no padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between output positions.
    pub stride: [usize; 2],
    /// Zeros added on both sides of each axis.
    pub padding: [usize; 2],
    /// Step between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups: input and output channels split into this many independent blocks
    /// (`groups == C` with one weight channel each is a depthwise convolution).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Tensor {
    /// 2-D convolution (cross-correlation, as in PyTorch) of this input `[N, C, H, W]` (or
    /// unbatched `[C, H, W]`) with `weight` `[O, C/groups, kh, kw]`, plus an optional `bias`
    /// `[O]`: the output is `[N, O, OH, OW]` with `OH = (H + 2·padding - dilation·(kh-1) - 1) /
    /// stride + 1` (likewise `OW`). Float dtypes; every operand on one device and dtype.
    ///
    /// Runs as the backend's fused convolution where its capabilities list `Op::Conv2d` for the
    /// dtype (strided inputs read in place, the bias added in place after). Elsewhere as im2col:
    /// a strided view of the padded input copied contiguous once (memory `N·C·kh·kw·OH·OW`
    /// elements) and one batched matmul; with groups and a batch above 1 the weight is also
    /// copied once per sample.
    ///
    /// ```
    /// use cartage::tensor::nn::Conv2dOptions;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2], &cpu)?;
    /// let w = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0], &[1, 1, 2, 2], &cpu)?;
    /// let b = Tensor::from_slice(&[0.5f32], &[1], &cpu)?;
    /// let y = x.conv2d(&w, Some(&b), Conv2dOptions { padding: [1, 1], ..Default::default() })?;
    /// assert_eq!(y.shape(), &[1, 1, 3, 3]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.5, 3.5, 2.5, 4.5, 10.5, 6.5, 3.5, 7.5, 4.5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: Conv2dOptions) -> Result<Tensor> {
        let site = caller();
        if let Some(dtype) = crate::autocast::autocast_dtype()
            && [Some(self), Some(weight), bias]
                .into_iter()
                .flatten()
                .any(|t| t.dtype != dtype)
        {
            let (x, w) = (crate::autocast::lower(self)?, crate::autocast::lower(weight)?);
            let b = bias.map(crate::autocast::lower).transpose()?;
            if x.dtype != self.dtype || w.dtype != weight.dtype || b.as_ref().map(|t| t.dtype) != bias.map(|t| t.dtype)
            {
                return x.conv2d(&w, b.as_ref(), opts);
            }
        }
        let inputs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        if graph::tracking(&inputs) {
            let out = {
                let _plain = crate::autograd::no_grad();
                self.conv2d_at(weight, bias, opts, site)?
            };
            return Ok(graph::record(out, "conv2d", &inputs, |_| {
                super::grad::conv2d(self, weight, opts, site)
            }));
        }
        self.conv2d_at(weight, bias, opts, site)
    }

    fn conv2d_at(&self, weight: &Tensor, bias: Option<&Tensor>, opts: Conv2dOptions, site: Site) -> Result<Tensor> {
        if self.rank() == 3 {
            let batched = self.with_layout(self.layout.unsqueeze(0)?);
            let out = batched.conv2d_batched(weight, bias, &opts, site)?;
            return Ok(out.with_layout(out.layout.squeeze(0)?));
        }
        self.conv2d_batched(weight, bias, &opts, site)
    }

    fn conv2d_batched(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        site: Site,
    ) -> Result<Tensor> {
        let name = "conv2d";
        check::same_device_and_dtype(name, self, weight)?;
        check::float(name, self.dtype)?;
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: name,
            lhs: self.shape().to_vec(),
            rhs: weight.shape().to_vec(),
            reason,
        };
        if self.rank() != 4 || weight.rank() != 4 {
            return Err(mismatch(
                "the input must be [N, C, H, W] (or [C, H, W]) and the weight [O, C/groups, kh, kw]".into(),
            ));
        }
        let [n, c, h, w] = [self.shape()[0], self.shape()[1], self.shape()[2], self.shape()[3]];
        let [o, cg, kh, kw] = [
            weight.shape()[0],
            weight.shape()[1],
            weight.shape()[2],
            weight.shape()[3],
        ];
        let g = opts.groups;
        if g == 0 {
            return Err(Error::invalid(name, "groups is 0; it must be at least 1"));
        }
        if cg.checked_mul(g) != Some(c) {
            return Err(mismatch(format!(
                "input has {c} channels but weight expects {cg} (× groups {g})"
            )));
        }
        if o % g != 0 {
            return Err(mismatch(format!(
                "the weight has {o} output channels, not a multiple of groups {g}"
            )));
        }
        if let Some(bias) = bias {
            check::same_device_and_dtype(name, self, bias)?;
            if bias.shape() != [o] {
                return Err(Error::ShapeMismatch {
                    op: name,
                    lhs: weight.shape().to_vec(),
                    rhs: bias.shape().to_vec(),
                    reason: format!("the bias must be [{o}], one value per output channel of the weight"),
                });
            }
        }
        let window = Window {
            kernel: [kh, kw],
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
        };
        let [oh, ow] = window.output_size([h, w]).map_err(mismatch)?;
        if self.backend().capabilities().supports(Op::Conv2d, self.dtype) {
            return self.conv2d_fused(weight, bias, opts, [n, o, oh, ow], site);
        }

        let padded = self.padded_2d(opts.padding, Scalar::Int(0), site)?;
        let win = padded.window_view(&window, [oh, ow])?;
        let st = win.layout.strides();
        let cols_view = Layout::from_parts(
            &[n, g, cg, kh, kw, oh, ow],
            &[st[0], cg.saturating_mul(st[1]), st[1], st[2], st[3], st[4], st[5]],
            win.layout.offset(),
        )?;
        let k = cg * kh * kw;
        let l = oh * ow;
        let cols = win
            .with_layout(cols_view)
            .contiguous_at(site)?
            .view_contiguous(&[n, g, k, l])?;

        let og = o / g;
        let weights = weight.reshape_internal(&[g, og, k], site)?;
        // Batch dims [N, G] against [G] do not collapse to one batch dim as a view when both
        // exceed 1, so the weight is broadcast explicitly (a copy N·O·K, small beside the
        // columns).
        let weights = if g > 1 && n > 1 {
            weights
                .with_layout(weights.layout.unsqueeze(0)?.broadcast_to(&[n, g, og, k])?)
                .contiguous_at(site)?
        } else {
            weights
        };
        let out = weights.matmul(&cols)?.view_contiguous(&[n, o, oh, ow])?;
        match bias {
            Some(bias) => out.add(&bias.reshape_internal(&[o, 1, 1], site)?),
            None => Ok(out),
        }
    }

    /// The fused path: one `Kernel::Conv2d` into a fresh `[N, O, OH, OW]`, then the bias
    /// (broadcast over N, OH, OW by stride 0) added into it in place.
    fn conv2d_fused(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        shape: [usize; 4],
        site: Site,
    ) -> Result<Tensor> {
        let out = self.alloc_like(&shape, self.dtype, site)?;
        let kernel = Kernel::Conv2d {
            input: self.as_arg(),
            weight: weight.as_arg(),
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
            groups: opts.groups,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self, weight], out.numel())?;
        if let Some(bias) = bias {
            let spread = Layout::from_parts(&shape, &[0, bias.layout.strides()[0], 0, 0], bias.layout.offset())?;
            let add = Kernel::Binary {
                op: BinaryOp::Add,
                lhs: out.as_arg(),
                rhs: bias.arg_with(spread),
                out: out.as_arg(),
            };
            out.launch(&add, &[bias], out.numel())?;
        }
        Ok(out)
    }
}
