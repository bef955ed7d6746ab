//! Derivatives of indexing: gather, index_select, embedding, masked_fill and the scatters. The
//! index tensors are saved, never differentiated.

use cartage_core::Result;

use super::{Meta, when};
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The backward of `x.gather(dim, index)`: the gradient is added back at the gathered places.
pub(crate) fn gather(x: &Tensor, dim: usize, index: &Tensor) -> (BackwardFn, Saved) {
    let m = Meta::of(x);
    let index = index.detach();
    saving(keep(&[&index]), move |g, _| {
        Ok(vec![Some(m.zeros()?.scatter_add(dim as isize, &index, g)?)])
    })
}

/// The backward of `x.index_select(dim, index)` (and `embedding`, dim 0): rows of the gradient
/// are added back to the rows they came from, repeated indices summing.
pub(crate) fn index_select(x: &Tensor, dim: usize, index: &Tensor) -> (BackwardFn, Saved) {
    let m = Meta::of(x);
    let index = index.detach();
    saving(keep(&[&index]), move |g, _| {
        Ok(vec![Some(m.zeros()?.index_add(dim as isize, &index, g)?)])
    })
}

/// The backward of `x.scatter(dim, index, src)` (`add` false) and `x.scatter_add(..)`:
/// `src` gets the gradient gathered at its targets; `x` gets it where nothing overwrote it.
pub(crate) fn scatter(dim: usize, index: &Tensor, src: &Tensor, add: bool) -> (BackwardFn, Saved) {
    let index = index.detach();
    let src_meta = Meta::of(src);
    saving(keep(&[&index]), move |g, need| {
        let d = dim as isize;
        let gx = when(need[0], || -> Result<Tensor> {
            if add {
                Ok(g.clone())
            } else {
                g.scatter(d, &index, &src_meta.zeros()?)
            }
        })?;
        let gsrc = when(need[1], || gather_like(g, d, &index, &src_meta))?;
        Ok(vec![gx, gsrc])
    })
}

/// `g.gather(dim, index)`, shaped like `src` (the index may cover less of `src` than its shape).
fn gather_like(g: &Tensor, dim: isize, index: &Tensor, src: &Meta) -> Result<Tensor> {
    let picked = g.gather(dim, index)?;
    if picked.shape() == src.shape.as_slice() {
        return Ok(picked);
    }
    let full = src.zeros()?;
    let mut view = full.clone();
    for (d, &n) in index.shape().iter().enumerate() {
        view = view.narrow(d as isize, 0, n)?;
    }
    view.copy_from(&picked)?;
    Ok(full)
}

/// The backward of `x.index_add(dim, index, src)`: `x` passes the gradient through; `src` gets
/// the rows it was added to.
pub(crate) fn index_add(dim: usize, index: &Tensor) -> (BackwardFn, Saved) {
    let index = index.detach();
    saving(keep(&[&index]), move |g, need| {
        Ok(vec![
            when(need[0], || Ok(g.clone()))?,
            when(need[1], || g.index_select(dim as isize, &index))?,
        ])
    })
}
