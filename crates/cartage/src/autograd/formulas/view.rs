//! Derivatives of views: each maps the gradient back through the inverse view (transpose,
//! permute, reshape), sums it over broadcast dimensions (expand), or writes it into zeros at
//! the viewed elements (narrow, select, slicing).

use cartage_core::Result;

use super::{Meta, embed, sum_to};
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The backward of `transpose(a, b)`.
pub(crate) fn transpose(a: usize, b: usize) -> (BackwardFn, Saved) {
    saving(keep(&[]), move |g, _| {
        Ok(vec![Some(g.transpose(a as isize, b as isize)?)])
    })
}

/// The backward of `permute(perm)`: the inverse permutation.
pub(crate) fn permute(perm: &[usize]) -> (BackwardFn, Saved) {
    let mut inverse = vec![0isize; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i as isize;
    }
    saving(keep(&[]), move |g, _| Ok(vec![Some(g.permute(&inverse)?)]))
}

/// The backward of any op that only changes the shape (reshape, squeeze, unsqueeze, flatten).
pub(crate) fn reshape(x: &Tensor) -> (BackwardFn, Saved) {
    let shape = x.shape().to_vec();
    saving(keep(&[]), move |g, _| Ok(vec![Some(g.reshape(&shape)?)]))
}

/// The backward of `broadcast_to`/`expand`: summed back over the broadcast dimensions.
pub(crate) fn expand(x: &Tensor) -> (BackwardFn, Saved) {
    let shape = x.shape().to_vec();
    saving(keep(&[]), move |g, _| Ok(vec![Some(sum_to(g, &shape)?)]))
}

/// The backward of a view that picks elements (`narrow`, `select`, `i(..)`): the gradient is
/// written into zeros through the same view, re-applied by `view` to a tensor of the input's
/// shape.
pub(crate) fn picked(
    x: &Tensor,
    view: impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
) -> (BackwardFn, Saved) {
    let m = Meta::of(x);
    saving(keep(&[]), move |g, _| {
        Ok(vec![Some(embed(&m.shape, m.dtype, m.device, g, &view)?)])
    })
}
