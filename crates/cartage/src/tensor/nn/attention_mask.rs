//! The masks of scaled dot-product attention: a caller's mask as the additive one both paths
//! apply (a bool mask becomes 0 where kept and −inf elsewhere, as PyTorch turns it), its view as
//! the fused kernels' `[outer, inner, L, S]` operand over the merged batch, and the softmax of
//! masked scores, whose rows that see no key give 0 (PyTorch's `_safe_softmax`, from 2.5 on)
//! rather than NaN, in value and in gradient.

use cartage_core::{CompareOp, DType, Error, Layout, Result, Scalar, Site, broadcast_shapes};

use crate::tensor::{Tensor, check};

const NAME: &str = "scaled_dot_product_attention";

impl Tensor {
    /// `mask` as an additive mask on scores of shape `scores` (`[.., L, S]`) in this tensor's
    /// dtype (this is `q`): a float mask as it is (it must be `q`'s dtype), a bool mask as 0
    /// where true and −inf where false. Its shape is the caller's; it must broadcast to
    /// `scores`.
    pub(crate) fn attention_additive_mask(&self, mask: &Tensor, scores: &[usize], site: Site) -> Result<Tensor> {
        check::same_device(NAME, self, mask)?;
        let fits = broadcast_shapes(mask.shape(), scores).is_ok_and(|b| b.as_slice() == scores);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: NAME,
                lhs: mask.shape().to_vec(),
                rhs: scores.to_vec(),
                reason: "the mask must broadcast to the attention scores [.., L, S] (the right-hand shape)".into(),
            });
        }
        if mask.dtype != DType::Bool {
            check::same_dtype(NAME, self, mask)?;
            return Ok(mask.clone());
        }
        let _plain = crate::autograd::no_grad();
        let kept = self.scalar_like(Scalar::Float(0.0), site)?;
        let removed = self.scalar_like(Scalar::Float(f64::NEG_INFINITY), site)?;
        Tensor::where_cond(mask, &kept, &removed)
    }

    /// This additive mask (shape broadcasting to `[batch_dims.., l, s]`) as a view
    /// `[outer, inner, l, s]` with `outer · inner` the product of `batch_dims`, batch entry `b`
    /// of the merged batch at `[b / inner, b % inner]`: the fused kernels' operand. Broadcast
    /// dimensions keep stride 0, so nothing is copied. `None` where no split of the batch
    /// dimensions into two gives dimensions a single stride can step (the caller composes).
    pub(crate) fn attention_mask_view(&self, batch_dims: &[usize], l: usize, s: usize) -> Result<Option<Tensor>> {
        let mut full = batch_dims.to_vec();
        full.extend([l, s]);
        let wide = self.broadcast_to(&full)?;
        let (sizes, strides) = (wide.shape(), wide.layout.strides());
        let n = batch_dims.len();
        for split in 0..=n {
            let outer = merged_stride(&sizes[..split], &strides[..split]);
            let inner = merged_stride(&sizes[split..n], &strides[split..n]);
            if let (Some(outer_stride), Some(inner_stride)) = (outer, inner) {
                let outer_size = sizes[..split].iter().product::<usize>();
                let inner_size = sizes[split..n].iter().product::<usize>();
                let layout = Layout::from_parts(
                    &[outer_size, inner_size, l, s],
                    &[outer_stride, inner_stride, strides[n], strides[n + 1]],
                    wide.layout.offset(),
                )?;
                return Ok(Some(wide.with_layout(layout)));
            }
        }
        Ok(None)
    }

    /// The softmax over the last dimension of masked scores, with every row whose scores are
    /// all −inf (it sees no key) 0 instead of NaN, its gradient 0 too: such rows are softmaxed
    /// as zeros and then zeroed, so no NaN reaches backward.
    pub(crate) fn masked_softmax(&self, site: Site) -> Result<Tensor> {
        if self.shape().last() == Some(&0) {
            return self.softmax(-1);
        }
        let dead = self
            .max(&[-1], true)?
            .compare_scalar(CompareOp::Eq, Scalar::Float(f64::NEG_INFINITY), site)?;
        let zero = self.scalar_like(Scalar::Float(0.0), site)?;
        let live = Tensor::where_cond(&dead, &zero, self)?;
        // Under autocast the softmax is f32 while the scores are not.
        let p = live.softmax(-1)?;
        let zero = p.scalar_like(Scalar::Float(0.0), site)?;
        Tensor::where_cond(&dead, &zero, &p)
    }
}

/// The one stride that steps dimensions `sizes` (with `strides`) merged into one, if any:
/// dimensions of size 1 do not count, and each other must step over the next one exactly (or
/// all be broadcast, stride 0).
fn merged_stride(sizes: &[usize], strides: &[usize]) -> Option<usize> {
    let dims: Vec<(usize, usize)> = sizes
        .iter()
        .zip(strides)
        .filter(|(size, _)| **size != 1)
        .map(|(&size, &stride)| (size, stride))
        .collect();
    let Some(&(_, last)) = dims.last() else {
        return Some(0);
    };
    let steps_evenly = dims.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0);
    steps_evenly.then_some(last)
}

#[cfg(test)]
mod tests {
    use super::merged_stride;

    #[test]
    fn dimensions_merge_where_one_stride_steps_them() {
        assert_eq!(merged_stride(&[], &[]), Some(0));
        assert_eq!(merged_stride(&[4, 3], &[3, 1]), Some(1));
        assert_eq!(merged_stride(&[4, 3], &[0, 0]), Some(0));
        assert_eq!(merged_stride(&[4, 1, 3], &[6, 99, 2]), Some(2));
        // A broadcast batch over real heads cannot be one dimension.
        assert_eq!(merged_stride(&[4, 3], &[0, 5]), None);
        assert_eq!(merged_stride(&[4, 3], &[5, 0]), None);
    }
}
