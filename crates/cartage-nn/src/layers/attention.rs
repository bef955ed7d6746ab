//! [`MultiHeadAttention`]: self-attention over `[B, T, D]` on scaled dot-product attention.

use cartage::{Generator, Result, Tensor};

use super::{Linear, check_last};
use crate::{Module, Scope};

/// Multi-head self-attention: one projection to queries, keys and values (`[D, 3D]`), `heads`
/// heads of `D / heads` each through `Tensor::scaled_dot_product_attention` (fused where the
/// backend has it), and an output projection.
pub struct MultiHeadAttention {
    qkv: Linear,
    out: Linear,
    heads: usize,
    dim: usize,
    causal: bool,
}

impl MultiHeadAttention {
    /// Attention over width `dim` with `heads` heads (`dim` must divide by `heads`), with biases.
    pub fn new(scope: &Scope, dim: usize, heads: usize, causal: bool, rng: &mut Generator) -> Result<Self> {
        MultiHeadAttention::with_bias(scope, dim, heads, causal, true, rng)
    }

    /// [`MultiHeadAttention::new`] with biases on the projections only when `bias` is set.
    pub fn with_bias(
        scope: &Scope,
        dim: usize,
        heads: usize,
        causal: bool,
        bias: bool,
        rng: &mut Generator,
    ) -> Result<Self> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(cartage::Error::InvalidArgument {
                op: "MultiHeadAttention",
                reason: format!("the width {dim} must be a multiple of the number of heads {heads}"),
            });
        }
        Ok(MultiHeadAttention {
            qkv: Linear::new(&scope.sub("qkv"), dim, 3 * dim, bias, rng)?,
            out: Linear::new(&scope.sub("out"), dim, dim, bias, rng)?,
            heads,
            dim,
            causal,
        })
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_last("MultiHeadAttention", x, 3, self.dim)?;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let head = self.dim / self.heads;
        // Each of q, k, v from its third of the projection ([B, T, D] → [B, H, T, hd], a view):
        // selecting from one [B, T, 3D] output would make each backward build a gradient of
        // the whole [B, T, 3D] from zeros and add the three.
        let part = |i: usize| -> Result<Tensor> {
            self.qkv
                .forward_features(x, i * self.dim, self.dim)?
                .reshape(&[b, t, self.heads, head])?
                .transpose(1, 2)
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let y = Tensor::scaled_dot_product_attention(&q, &k, &v, None, self.causal, None)?;
        // [B, H, T, hd] → [B, T, D]
        let y = y.transpose(1, 2)?.reshape(&[b, t, self.dim])?;
        self.out.forward(&y)
    }
}
