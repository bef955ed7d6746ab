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

impl MultiHeadAttention {
    /// The attention of `x` `[B, T, D]` with `mask` as well (and the causal mask where the layer
    /// has it): a mask broadcasting to the scores `[B, heads, T, T]`, bool (true where a query
    /// may attend to a key, PyTorch's `attn_mask` convention for bools) or float (added to the
    /// scores; −inf removes a key). A key padding mask is `[B, 1, 1, T]`: true for real tokens.
    /// A query that may attend to no key gives 0 before the output projection.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::layers::MultiHeadAttention;
    /// use cartage_nn::{Module, ParamStore};
    /// let cpu = Device::cpu();
    /// let store = ParamStore::new(&cpu);
    /// let attn = MultiHeadAttention::new(&store.root().sub("attn"), 8, 2, false, &mut Generator::new(0))?;
    /// let x = Tensor::randn(&[2, 3, 8], DType::F32, 1, &cpu)?;
    /// // The second sequence's last token is padding: no query attends to it.
    /// let real = Tensor::from_slice(&[true, true, true, true, true, false], &[2, 1, 1, 3], &cpu)?;
    /// assert_eq!(attn.forward_masked(&x, &real)?.shape(), &[2, 3, 8]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn forward_masked(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.attend(x, Some(mask))
    }

    fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.check_input(x)?;
        // One product for q, k and v ([B, T, 3D]), attention over it as one node whose backward
        // builds the [B, T, 3D] gradient once, so the projection's backward is one product each
        // for the input and the weight.
        self.attend_projected(&self.qkv.forward(x)?, mask)
    }

    /// Refuse an input that is not `[B, T, D]` with this layer's `D`.
    pub(crate) fn check_input(&self, x: &Tensor) -> Result<()> {
        check_last("MultiHeadAttention", x, 3, self.dim)
    }

    /// The q/k/v projection, for a caller that computes it itself (a block that fuses the norm
    /// before it into the product: [`crate::layers::LayerNorm::forward_linear`]).
    pub(crate) fn qkv_projection(&self) -> &Linear {
        &self.qkv
    }

    /// The attention and the output projection from the q/k/v projection `qkv` `[B, T, 3D]`.
    pub(crate) fn attend_projected(&self, qkv: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let y = Tensor::scaled_dot_product_attention_packed(qkv, self.heads, mask, self.causal, None)?;
        self.out.forward(&y)
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, None)
    }
}
