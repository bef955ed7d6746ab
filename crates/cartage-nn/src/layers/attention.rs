//! [`MultiHeadAttention`]: self-attention over `[B, T, D]` on scaled dot-product attention.

use cartage::{Generator, Result, Tensor};

use super::{Linear, check_last};
use crate::{Module, Scope};

/// Multi-head self-attention: one projection to queries, keys and values (weight `[3D, D]`:
/// queries, then keys, then values, each head-major), `heads` heads of `D / heads` each through
/// `Tensor::scaled_dot_product_attention_packed` on that one `[B, T, 3D]` output (fused where the
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
        // One product for q, k and v ([B, T, 3D]), attention over it as one node whose backward
        // builds the [B, T, 3D] gradient once, so the projection's backward is one product each
        // for the input and the weight.
        let qkv = self.qkv.forward(x)?;
        let y = Tensor::scaled_dot_product_attention_packed(&qkv, self.heads, self.causal, None)?;
        self.out.forward(&y)
    }
}
