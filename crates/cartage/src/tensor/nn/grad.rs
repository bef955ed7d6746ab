//! Backward passes of convolution. Convolution's input and weight gradients are one
//! fused kernel each (`Kernel::Conv2dBackwardInput`, `Kernel::Conv2dBackwardWeight`: cuDNN on
//! CUDA) where the backend lists it for the dtype; elsewhere, and for pooling, they are composed
//! from cartage's own ops so that they run on every backend: the column matrix is rebuilt from
//! the saved input (im2col), the weight gradient is one batched matmul against it, and the input
//! gradient is the column gradient folded back onto the padded plane (the adjoint of the window
//! view: one strided add per kernel tap). The bias gradient is a sum either way. Pooling's
//! backward passes are in `pool_grad.rs`.

use cartage_core::{Kernel, Op, Result, Scalar, Site};

use super::conv::Conv2dOptions;
use super::window::Window;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};
use crate::tensor::Tensor;
use crate::tensor::slicing::s;

impl Tensor {
    /// The adjoint of [`Tensor::window_view`]: `self`, `[N, C, kh, kw, OH, OW]`, summed onto a
    /// zero plane `[N, C, Hp, Wp]` at the positions each tap read.
    pub(super) fn fold_windows(&self, window: &Window, plane: [usize; 4]) -> Result<Tensor> {
        let out = Tensor::zeros(&plane, self.dtype, &self.device)?;
        let [_, _, kh, kw, oh, ow] = <[usize; 6]>::try_from(self.shape())
            .map_err(|_| cartage_core::Error::invalid("fold", "internal: the window gradient is not 6-D"))?;
        if oh == 0 || ow == 0 {
            return Ok(out);
        }
        let ([sh, sw], [dh, dw]) = (window.stride, window.dilation);
        for i in 0..kh {
            for j in 0..kw {
                let rows = s(i * dh, i * dh + (oh - 1) * sh + 1, sh as i64);
                let cols = s(j * dw, j * dw + (ow - 1) * sw + 1, sw as i64);
                let region = out.i((.., .., rows, cols))?;
                let tap = self.i((.., .., i, j))?;
                region.copy_from(&region.add(&tap)?)?;
            }
        }
        Ok(out)
    }

    /// The input gradient `[N, C, H, W]` (`input_shape`) of a batched convolution, from the
    /// output gradient `self` `[N, O, OH, OW]` and the forward's `weight`, in one
    /// `Kernel::Conv2dBackwardInput`; `None` where the backend lists no such kernel for the dtype.
    fn conv2d_backward_input_fused(
        &self,
        weight: &Tensor,
        input_shape: &[usize],
        opts: &Conv2dOptions,
        site: Site,
    ) -> Result<Option<Tensor>> {
        if !self
            .backend()
            .capabilities()
            .supports(Op::Conv2dBackwardInput, weight.dtype())
        {
            return Ok(None);
        }
        let grad = self.to_dtype(weight.dtype())?;
        let out = grad.alloc_like(input_shape, weight.dtype(), site)?;
        let kernel = Kernel::Conv2dBackwardInput {
            grad: grad.as_arg(),
            weight: weight.as_arg(),
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
            groups: opts.groups,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[&grad, weight], out.numel())?;
        Ok(Some(out))
    }

    /// The weight gradient `[O, C/groups, kh, kw]` (`weight_shape`) of a batched convolution,
    /// from the output gradient `self` `[N, O, OH, OW]` and the forward's `input`, in one
    /// `Kernel::Conv2dBackwardWeight`; `None` where the backend lists no such kernel for the
    /// dtype.
    fn conv2d_backward_weight_fused(
        &self,
        input: &Tensor,
        weight_shape: &[usize],
        opts: &Conv2dOptions,
        site: Site,
    ) -> Result<Option<Tensor>> {
        if !self
            .backend()
            .capabilities()
            .supports(Op::Conv2dBackwardWeight, input.dtype())
        {
            return Ok(None);
        }
        let grad = self.to_dtype(input.dtype())?;
        let out = grad.alloc_like(weight_shape, input.dtype(), site)?;
        let kernel = Kernel::Conv2dBackwardWeight {
            input: input.as_arg(),
            grad: grad.as_arg(),
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
            groups: opts.groups,
            out: out.as_arg(),
        };
        out.launch(&kernel, &[input, &grad], out.numel())?;
        Ok(Some(out))
    }

    /// The interior of a padded plane (the inverse of `padded_2d`'s placement).
    pub(super) fn unpadded(&self, padding: [usize; 2], spatial: [usize; 2]) -> Result<Tensor> {
        self.narrow(2, padding[0], spatial[0])?
            .narrow(3, padding[1], spatial[1])?
            .contiguous()
    }
}

/// The backward of `x.conv2d(w, bias, opts)` for a batched `x` `[N, C, H, W]` (or unbatched
/// `[C, H, W]`); the node's inputs are `[x, w]` plus the bias when there is one. Each of the
/// input and weight gradients is one fused kernel where the backend lists it, else composed.
pub(super) fn conv2d(x: &Tensor, w: &Tensor, opts: Conv2dOptions, site: Site) -> (BackwardFn, Saved) {
    let (x, w) = (x.detach(), w.detach());
    saving(keep(&[&x, &w]), move |g, need| {
        let unbatched = x.rank() == 3;
        let (xb, gb) = batched(&x, g, unbatched)?;
        let (x, g) = (&xb, &gb);
        let fused_gw = if need[1] {
            g.conv2d_backward_weight_fused(x, w.shape(), &opts, site)?
        } else {
            None
        };
        let fused_gx = if need[0] {
            g.conv2d_backward_input_fused(&w, x.shape(), &opts, site)?
        } else {
            None
        };
        let composed_gw = need[1] && fused_gw.is_none();
        let composed_gx = need[0] && fused_gx.is_none();
        if !composed_gw && !composed_gx {
            let gx = fused_gx
                .map(|gx| if unbatched { gx.squeeze(0) } else { Ok(gx) })
                .transpose()?;
            return bias_too(vec![gx, fused_gw], g, need);
        }
        let [n, c, h, wd] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
        let [o, cg, kh, kw] = [w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]];
        let (groups, og) = (opts.groups, w.shape()[0] / opts.groups);
        let [oh, ow] = [g.shape()[2], g.shape()[3]];
        let (k, l) = (cg * kh * kw, oh * ow);
        let window = Window {
            kernel: [kh, kw],
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
        };
        let g_r = g.contiguous()?.reshape(&[n, groups, og, l])?;
        let gw = if composed_gw {
            let cols = x
                .padded_2d(opts.padding, Scalar::Int(0), site)?
                .window_view(&window, [oh, ow])?
                .contiguous()?
                .reshape(&[n, groups, k, l])?;
            let per_sample = g_r.matmul(&cols.transpose(-1, -2)?)?;
            Some(per_sample.sum(&[0], false)?.reshape(&[o, cg, kh, kw])?)
        } else {
            fused_gw
        };
        let gx = if composed_gx {
            let w_r = w.contiguous()?.reshape(&[groups, og, k])?;
            let gcols = w_r.transpose(-1, -2)?.matmul(&g_r)?.reshape(&[n, c, kh, kw, oh, ow])?;
            let [ph, pw] = opts.padding;
            let plane = [n, c, h + 2 * ph, wd + 2 * pw];
            Some(gcols.fold_windows(&window, plane)?.unpadded(opts.padding, [h, wd])?)
        } else {
            fused_gx
        };
        let gx = gx
            .map(|gx| if unbatched { gx.squeeze(0) } else { Ok(gx) })
            .transpose()?;
        bias_too(vec![gx, gw], g, need)
    })
}

/// `grads` (input, weight) followed by the bias gradient, the sum of the batched output
/// gradient `g` over batch and plane, when the node has a bias.
fn bias_too(mut grads: Vec<Option<Tensor>>, g: &Tensor, need: &[bool]) -> Result<Vec<Option<Tensor>>> {
    if need.len() > 2 {
        grads.push(if need[2] { Some(g.sum(&[0, 2, 3], false)?) } else { None });
    }
    Ok(grads)
}

/// The input and the output gradient with a batch dimension of 1 added when the op ran on an
/// unbatched `[C, H, W]` input.
pub(super) fn batched(x: &Tensor, g: &Tensor, unbatched: bool) -> Result<(Tensor, Tensor)> {
    if unbatched {
        Ok((x.unsqueeze(0)?, g.unsqueeze(0)?))
    } else {
        Ok((x.clone(), g.clone()))
    }
}
