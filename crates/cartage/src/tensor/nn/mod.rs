//! Neural-network primitives: normalisation, losses, dropout, convolution, pooling, attention.
//!
//! One file per job: `norm` (layer norm, RMS norm: one `Kernel::Norm` each), `loss`
//! (cross-entropy through `Kernel::CrossEntropy`, NLL composed, reductions on the device),
//! `dropout` (composed from a random draw), `window` (padding and the sliding-window view shared
//! by convolution and pooling), `conv` (2-D convolution as im2col plus one batched matmul),
//! `pool` (max and average pooling: one fused `Kernel::Pool2d`, or one reduction over the window
//! view), `pool_grad` (their backward: one fused `Kernel::Pool2dBackward`, or composed), `attention`
//! (scaled dot-product attention: fused, else composed), `attention_packed` (the same over one
//! packed q/k/v projection, one node whose backward builds the packed gradient once), `linear` (a linear layer with its activation: one
//! fused `Kernel::Linear`, or composed) `activation_linear` (an activation then a linear
//! layer, recorded as one node that recomputes the activation in backward) and `norm_linear`
//! (layer norm then a linear layer, recorded as one node that recomputes the norm). The option types live here, in `tensor::nn`.

mod activation_linear;
mod attention;
mod attention_mask;
mod attention_packed;
mod class_loss;
mod conv;
mod dropout;
mod fused_backward;
mod grad;
mod linear;
mod loss;
mod loss_grad_ahead;
mod norm;
mod norm_linear;
mod pool;
mod pool_grad;
mod regression_loss;
mod softplus;
mod window;

pub(crate) use attention::{attention_operands, attention_probabilities, merged_copies};
pub use conv::Conv2dOptions;
pub use loss::{CrossEntropy, Reduction};

use cartage_core::{DType, Kernel, Result, Scalar, Site};

use super::Tensor;

impl Tensor {
    /// The same elements with `shape` (same element count): a view when the strides allow it,
    /// else a contiguous copy first. Internal, so that the NN ops do not depend on the public
    /// `reshape`'s argument type.
    fn reshape_internal(&self, shape: &[usize], site: Site) -> Result<Tensor> {
        if let Some(layout) = self.layout.reshape(shape)? {
            return Ok(self.with_layout(layout));
        }
        self.contiguous_at(site)?.view_contiguous(shape)
    }

    /// A fresh contiguous tensor of `shape` and `dtype` on this tensor's device, every element
    /// `value`.
    fn fill_new_like(&self, shape: &[usize], dtype: DType, value: Scalar, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(shape, dtype, site)?;
        let kernel = Kernel::Fill {
            out: out.as_arg(),
            value,
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }
}
