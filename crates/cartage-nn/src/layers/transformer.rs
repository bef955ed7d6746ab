//! [`TransformerBlock`]: a pre-norm transformer layer.

use cartage::{Generator, Result, Tensor};

use super::{LayerNorm, Linear, MultiHeadAttention};
use crate::{Module, Scope};

/// `x + attn(ln1(x))`, then `+ mlp(ln2(x))` with a GELU MLP four times as wide (GPT-2's
/// layout).
pub struct TransformerBlock {
    ln1: LayerNorm,
    attn: MultiHeadAttention,
    ln2: LayerNorm,
    up: Linear,
    down: Linear,
}

impl TransformerBlock {
    /// A block of width `dim` with `heads` heads.
    pub fn new(scope: &Scope, dim: usize, heads: usize, causal: bool, rng: &mut Generator) -> Result<Self> {
        Ok(TransformerBlock {
            ln1: LayerNorm::new(&scope.sub("ln1"), dim, 1e-5)?,
            attn: MultiHeadAttention::new(&scope.sub("attn"), dim, heads, causal, rng)?,
            ln2: LayerNorm::new(&scope.sub("ln2"), dim, 1e-5)?,
            up: Linear::new(&scope.sub("mlp_up"), dim, 4 * dim, true, rng)?,
            down: Linear::new(&scope.sub("mlp_down"), 4 * dim, dim, true, rng)?,
        })
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        let hidden = self.up.forward(&self.ln2.forward(&x)?)?.gelu()?;
        x.add(&self.down.forward(&hidden)?)
    }
}
