//! Derivatives of joining and tiling: `cat` hands each input its slice of the gradient,
//! `repeat` sums the tiles, `pad` takes the interior back.

use super::when;
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The backward of `cat(inputs, dim)`; `sizes` are the inputs' extents along `dim`.
pub(crate) fn cat(sizes: Vec<usize>, dim: usize) -> (BackwardFn, Saved) {
    saving(keep(&[]), move |g, need| {
        let mut start = 0;
        let mut grads = Vec::with_capacity(sizes.len());
        for (i, &n) in sizes.iter().enumerate() {
            grads.push(when(need[i], || g.narrow(dim as isize, start, n)?.contiguous())?);
            start += n;
        }
        Ok(grads)
    })
}

/// The backward of `x.repeat(reps)`: the gradient viewed as `[r0, s0, r1, s1, ..]` and summed
/// over the repeat dimensions.
pub(crate) fn repeat(x: &Tensor, reps: &[usize]) -> (BackwardFn, Saved) {
    let reps = reps.to_vec();
    let in_shape = x.shape().to_vec();
    saving(keep(&[]), move |g, _| {
        let lead = reps.len() - in_shape.len();
        // Leading new dimensions are tiles of size-1 inputs.
        let sizes: Vec<usize> = (0..reps.len())
            .map(|i| if i < lead { 1 } else { in_shape[i - lead] })
            .collect();
        let mut split = Vec::with_capacity(2 * reps.len());
        for (r, s) in reps.iter().zip(&sizes) {
            split.push(*r);
            split.push(*s);
        }
        let tiled = g.reshape(&split)?;
        let dims: Vec<isize> = (0..reps.len()).map(|i| 2 * i as isize).collect();
        let summed = if dims.is_empty() {
            tiled
        } else {
            tiled.sum(&dims, false)?
        };
        Ok(vec![Some(summed.reshape(&in_shape)?)])
    })
}

/// The backward of `x.pad(pads, value)`: the interior of the gradient. `pads` are PyTorch-style
/// `(before, after)` pairs from the last dimension.
pub(crate) fn pad(x: &Tensor, pads: &[usize]) -> (BackwardFn, Saved) {
    let pads = pads.to_vec();
    let in_shape = x.shape().to_vec();
    saving(keep(&[]), move |g, _| {
        let rank = in_shape.len();
        let mut view = g.clone();
        for (pair, chunk) in pads.chunks(2).enumerate() {
            let d = rank - 1 - pair;
            view = view.narrow(d as isize, chunk[0], in_shape[d])?;
        }
        Ok(vec![Some(view.contiguous()?)])
    })
}
