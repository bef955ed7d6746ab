//! Backward passes of 2-D pooling. Where the backend lists the fused `Kernel::Pool2dBackward`
//! for the dtype, one pass over the input gradient gathers from the windows that contain each
//! position: max pooling from the forward's saved indices (the gradient goes to the first
//! maximum of each window, or its first NaN, as PyTorch's does), average pooling by each
//! window's divisor. Elsewhere max pooling's backward is composed: the argmax is recomputed from
//! the saved input, scattered into per-tap planes and folded back onto the padded input.
//! Average pooling then needs no formula of its own: its composed forward records
//! differentiable ops.

use cartage_core::{Kernel, PoolMode, PoolWindow, Result, Scalar, Site};

use super::grad::batched;
use super::window::Window;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};
use crate::tensor::Tensor;

/// The backward of `x.max_pool2d(..)` from the forward's `indices` (i64, the output's shape),
/// in one `Kernel::Pool2dBackward`. Saves the indices only, not the input.
pub(super) fn max_pool2d_fused(x: &Tensor, indices: Tensor, window: PoolWindow, site: Site) -> (BackwardFn, Saved) {
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    saving(keep(&[&indices]), move |g, _| {
        let out = pool_backward(g, Some(&indices), PoolMode::Max, window, &shape, dtype, site)?;
        Ok(vec![Some(out)])
    })
}

/// The backward of `x.avg_pool2d(..)`, in one `Kernel::Pool2dBackward`. Saves nothing but the
/// input's shape.
pub(super) fn avg_pool2d(x: &Tensor, mode: PoolMode, window: PoolWindow, site: Site) -> (BackwardFn, Saved) {
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    saving(keep(&[]), move |g, _| {
        Ok(vec![Some(pool_backward(g, None, mode, window, &shape, dtype, site)?)])
    })
}

/// The input gradient (`shape`, `dtype`; `[N, C, H, W]` or `[C, H, W]`) of a pooling from its
/// output gradient `g`.
fn pool_backward(
    g: &Tensor,
    indices: Option<&Tensor>,
    mode: PoolMode,
    window: PoolWindow,
    shape: &[usize],
    dtype: cartage_core::DType,
    site: Site,
) -> Result<Tensor> {
    let unbatched = shape.len() == 3;
    let lift = |t: &Tensor| if unbatched { t.unsqueeze(0) } else { Ok(t.clone()) };
    let g = lift(&g.to_dtype(dtype)?)?;
    let indices = indices.map(lift).transpose()?;
    let plane: Vec<usize> = if unbatched {
        std::iter::once(1).chain(shape.iter().copied()).collect()
    } else {
        shape.to_vec()
    };
    let out = g.alloc_like(&plane, dtype, site)?;
    let kernel = Kernel::Pool2dBackward {
        mode,
        window,
        grad: g.as_arg(),
        indices: indices.as_ref().map(Tensor::as_arg),
        out: out.as_arg(),
    };
    let mut operands = vec![&g];
    operands.extend(indices.as_ref());
    out.launch(&kernel, &operands, out.numel())?;
    if unbatched { out.squeeze(0) } else { Ok(out) }
}

/// The backward of `x.max_pool2d(..)` where no fused kernel is listed: each output's gradient
/// goes to the first maximum of its window (the argmax is recomputed from the saved input).
pub(super) fn max_pool2d_composed(x: &Tensor, window: PoolWindow, site: Site) -> (BackwardFn, Saved) {
    let x = x.detach();
    let window = Window {
        kernel: window.kernel,
        stride: window.stride,
        padding: window.padding,
        dilation: window.dilation,
    };
    saving(keep(&[&x]), move |g, _| {
        let unbatched = x.rank() == 3;
        let (xb, gb) = batched(&x, g, unbatched)?;
        let (x, g) = (&xb, &gb);
        let [n, c, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
        let [kh, kw] = window.kernel;
        let [oh, ow] = [g.shape()[2], g.shape()[3]];
        let taps = x
            .padded_2d(window.padding, Scalar::Float(f64::NEG_INFINITY), site)?
            .window_view(&window, [oh, ow])?
            .contiguous()?
            .reshape(&[n, c, kh * kw, oh, ow])?;
        let first_max = taps.argmax(2, true)?;
        let zeros = Tensor::zeros(&[n, c, kh * kw, oh, ow], x.dtype(), &x.device())?;
        let per_tap = zeros
            .scatter(2, &first_max, &g.unsqueeze(2)?.contiguous()?)?
            .reshape(&[n, c, kh, kw, oh, ow])?;
        let [ph, pw] = window.padding;
        let plane = [n, c, h + 2 * ph, w + 2 * pw];
        let gx = per_tap.fold_windows(&window, plane)?.unpadded(window.padding, [h, w])?;
        Ok(vec![Some(if unbatched { gx.squeeze(0)? } else { gx })])
    })
}
