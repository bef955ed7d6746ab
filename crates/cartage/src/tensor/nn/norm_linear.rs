//! `Tensor::layer_norm_linear`: `layer_norm(x) · Wᵀ + b` recorded by autograd as one node that
//! saves the norm's input (and the parameters) and recomputes the normalised tensor in its
//! backward. The composed pair keeps both the norm's input (for the norm's derivative) and its
//! output (for the linear layer's weight gradient; under autocast, its half-precision copy).

use cartage_core::{Epilogue, Result};

use crate::autograd::{formulas, graph};
use crate::tensor::Tensor;

const NAME: &str = "layer_norm_linear";

impl Tensor {
    /// `layer_norm(self, norm_weight, norm_bias, eps) · weightᵀ + bias` — the same values as
    /// [`Tensor::layer_norm`] then [`Tensor::linear`] — recorded by autograd as one node that
    /// keeps `self` and the parameters only: its backward recomputes the normalised tensor for
    /// the weight's gradient. A tracked call so holds one `[.., in]` tensor fewer until backward
    /// than the composed pair, at the price of one more norm pass in backward.
    ///
    /// Under [`crate::autocast`] the norm runs in f32 and the linear layer in the autocast
    /// dtype, as the composed pair does; a half-precision input or norm parameter there is
    /// composed.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::new([[1.0f32, 3.0], [0.0, -2.0]], &cpu)?;
    /// let w = Tensor::new([[1.0f32, 0.0]], &cpu)?;
    /// let y = x.layer_norm_linear(None, None, 0.0, &w, None)?;
    /// assert_eq!(y.to_vec2::<f32>()?, vec![vec![-1.0], vec![1.0]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn layer_norm_linear(
        &self,
        norm_weight: Option<&Tensor>,
        norm_bias: Option<&Tensor>,
        eps: f64,
        weight: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let norm_inputs: Vec<&Tensor> = std::iter::once(self).chain(norm_weight).chain(norm_bias).collect();
        let half = |t: &&Tensor| t.dtype().is_float() && t.dtype().size_in_bytes() == 2;
        let autocast = crate::autocast::autocast_dtype().is_some();
        if autocast && norm_inputs.iter().any(half) {
            return self
                .layer_norm(norm_weight, norm_bias, eps)?
                .linear(weight, bias, Epilogue::Identity);
        }
        let (w, b) = if autocast {
            (
                crate::autocast::lower(weight)?,
                bias.map(crate::autocast::lower).transpose()?,
            )
        } else {
            (weight.clone(), bias.cloned())
        };
        let mut inputs = norm_inputs;
        inputs.push(&w);
        inputs.extend(b.as_ref());
        let out = {
            // Plain ops: the node below stands for both. They check the operands.
            let _plain = graph::tracking(&inputs).then(crate::autograd::no_grad);
            self.layer_norm(norm_weight, norm_bias, eps)?
                .linear(&w, b.as_ref(), Epilogue::Identity)?
        };
        Ok(graph::record(out, NAME, &inputs, |_| {
            formulas::nn::layer_norm_linear(self, norm_weight, norm_bias, eps, &w, b.is_some())
        }))
    }
}
