//! Derivatives of reductions, softmax and scans.

use cartage_core::{Dims, Result};

use super::Meta;
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// `g` of a reduction's output, with the reduced `dims` put back as size 1 (when the reduction
/// dropped them), broadcast to the input's `shape`.
pub(crate) fn expand_back(g: &Tensor, shape: &[usize], dims: &[usize], keepdim: bool) -> Result<Tensor> {
    let kept = keep_dims(g, dims, keepdim)?;
    kept.broadcast_to(shape)
}

/// `t` with the reduced `dims` as size 1 (a view), whether or not the reduction kept them.
fn keep_dims(t: &Tensor, dims: &[usize], keepdim: bool) -> Result<Tensor> {
    let mut kept = t.clone();
    if !keepdim {
        for &d in dims {
            kept = kept.unsqueeze(d as isize)?;
        }
    }
    Ok(kept)
}

/// The backward of `sum(dims)` (`scale` = 1) and `mean(dims)` (`scale` = 1 / count).
pub(crate) fn sum(x: &Tensor, dims: Dims, keepdim: bool, scale: f64) -> (BackwardFn, Saved) {
    let m = Meta::of(x);
    saving(keep(&[]), move |g, _| {
        let g = if scale == 1.0 { g.clone() } else { g.mul_scalar(scale)? };
        // A broadcast view: the consumers read it in place, and a variable's gradient is made
        // contiguous when it is stored.
        Ok(vec![Some(expand_back(&g, &m.shape, &dims, keepdim)?)])
    })
}

/// The backward of `max(dims)`/`min(dims)`: the gradient is shared evenly by the elements equal
/// to the extreme (as PyTorch's `amax`).
pub(crate) fn extreme(x: &Tensor, out: &Tensor, dims: Dims, keepdim: bool) -> (BackwardFn, Saved) {
    let (x, y) = (x.detach(), out.detach());
    saving(keep(&[&x, &y]), move |g, _| {
        let y = keep_dims(&y, &dims, keepdim)?;
        let hits = x.eq(&y)?.to_dtype(x.dtype())?;
        let sdims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
        let count = hits.sum(&sdims, true)?;
        let share = keep_dims(g, &dims, keepdim)?.div(&count)?;
        Ok(vec![Some(hits.mul(&share)?)])
    })
}

/// The backward of `values = max_dim/min_dim/sort/topk(..)` given the `indices` along `dim`:
/// each gradient goes back to the element it came from.
pub(crate) fn take_along(x: &Tensor, dim: usize, indices: &Tensor, keepdim: bool) -> (BackwardFn, Saved) {
    let m = Meta::of(x);
    let idx = indices.detach();
    saving(keep(&[&idx]), move |g, _| {
        let (g, idx) = (keep_dims(g, &[dim], keepdim)?, keep_dims(&idx, &[dim], keepdim)?);
        Ok(vec![Some(m.zeros()?.scatter_add(dim as isize, &idx, &g)?)])
    })
}

/// The backward of `prod(dims)`, exact with zeros: each element's gradient is the product of
/// the others, built from exclusive cumulative products from both ends.
pub(crate) fn prod(x: &Tensor, dims: Dims, keepdim: bool) -> (BackwardFn, Saved) {
    let x = x.detach();
    saving(keep(&[&x]), move |g, _| {
        let rank = x.rank();
        let rest: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
        let perm: Vec<isize> = rest.iter().chain(dims.iter()).map(|&d| d as isize).collect();
        let moved = x.permute(&perm)?;
        let lead: Vec<usize> = rest.iter().map(|&d| x.shape()[d]).collect();
        let n: usize = dims.iter().map(|&d| x.shape()[d]).product();
        let mut flat_shape = lead.clone();
        flat_shape.push(n);
        let flat = moved.reshape(&flat_shape)?;
        let others = product_of_others(&flat)?;
        // Back to the permuted shape, then to the input's order.
        let moved_shape: Vec<usize> = perm.iter().map(|&d| x.shape()[d as usize]).collect();
        let mut inverse = vec![0isize; rank];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p as usize] = i as isize;
        }
        let others = others.reshape(&moved_shape)?.permute(&inverse)?;
        let g = keep_dims(g, &dims, keepdim)?;
        Ok(vec![Some(others.mul(&g)?)])
    })
}

/// For each element of the last dimension, the product of the other elements of its row.
fn product_of_others(flat: &Tensor) -> Result<Tensor> {
    let last = flat.rank() as isize - 1;
    let n = flat.shape()[flat.rank() - 1];
    let mut ones_shape = flat.shape().to_vec();
    ones_shape[flat.rank() - 1] = 1;
    let ones = Tensor::ones(&ones_shape, flat.dtype(), &flat.device())?;
    let exclusive = |t: &Tensor| -> Result<Tensor> {
        let inclusive = t.cumprod(last)?;
        Tensor::cat(&[&ones, &inclusive.narrow(last, 0, n - 1)?], last)
    };
    let left = exclusive(flat)?;
    let right = exclusive(&flat.flip(&[last])?)?.flip(&[last])?;
    left.mul(&right)
}

/// The backward of `logsumexp(dims)`: `g · exp(x - out)`.
pub(crate) fn logsumexp(x: &Tensor, out: &Tensor, dims: Dims, keepdim: bool) -> (BackwardFn, Saved) {
    let (x, y) = (x.detach(), out.detach());
    saving(keep(&[&x, &y]), move |g, _| {
        let y = keep_dims(&y, &dims, keepdim)?;
        let g = keep_dims(g, &dims, keepdim)?;
        Ok(vec![Some(x.sub(&y)?.exp()?.mul(&g)?)])
    })
}

/// The backward of `softmax(dim)` (`log` false: `y·(g - Σ g·y)`) and `log_softmax(dim)`
/// (`g - exp(y)·Σ g`): one fused kernel where the backend has it, else composed. Saves the
/// output only.
pub(crate) fn softmax(out: &Tensor, dim: usize, log: bool) -> (BackwardFn, Saved) {
    let y = out.detach();
    saving(keep(&[&y]), move |g, _| {
        if let Some(fused) = y.softmax_backward_fused(g, dim, log)? {
            return Ok(vec![Some(fused)]);
        }
        let d = dim as isize;
        let grad = if log {
            let total = g.sum(&[d], true)?;
            g.sub(&y.exp()?.mul(&total)?)?
        } else {
            let dot = g.mul(&y)?.sum(&[d], true)?;
            y.mul(&g.sub(&dot)?)?
        };
        Ok(vec![Some(grad)])
    })
}

/// The backward of `cumsum(dim)`: the reversed cumulative sum of the gradient.
pub(crate) fn cumsum(dim: usize) -> (BackwardFn, Saved) {
    saving(keep(&[]), move |g, _| {
        let d = dim as isize;
        Ok(vec![Some(g.flip(&[d])?.cumsum(d)?.flip(&[d])?)])
    })
}

/// The backward of `cumprod(dim)`: `Σ_{k≥i} g_k·y_k / x_i`. Exact where `x` has no zeros; at a
/// zero the division gives inf or NaN, as the closed form does (documented on `cumprod`).
pub(crate) fn cumprod(x: &Tensor, out: &Tensor, dim: usize) -> (BackwardFn, Saved) {
    let (x, y) = (x.detach(), out.detach());
    saving(keep(&[&x, &y]), move |g, _| {
        let d = dim as isize;
        let rev = g.mul(&y)?.flip(&[d])?.cumsum(d)?.flip(&[d])?;
        Ok(vec![Some(rev.div(&x)?)])
    })
}
