//! The model: token and position embeddings, pre-norm transformer blocks with causal
//! attention, a final LayerNorm and a linear head over the characters (GPT-2's layout).

use cartage::prelude::*;
use cartage_nn::layers::{Embedding, LayerNorm, Linear, TransformerBlock};
use cartage_nn::{Module, Scope};

/// The model's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub vocab: usize,
    pub context: usize,
    pub dim: usize,
    pub heads: usize,
    pub layers: usize,
}

/// A decoder-only transformer over character ids.
pub struct Gpt {
    tokens: Embedding,
    positions: Embedding,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Linear,
    /// `0..context` as i32 on the model's device: the position ids of a full window.
    position_ids: Tensor,
    context: usize,
}

impl Gpt {
    /// A model of `config`'s sizes whose parameters live in `scope`, initialised from `rng`.
    pub fn new(scope: &Scope, config: Config, rng: &mut Generator) -> Result<Gpt> {
        let blocks = (0..config.layers)
            .map(|i| TransformerBlock::new(&scope.sub(format!("block{i}")), config.dim, config.heads, true, rng))
            .collect::<Result<Vec<_>>>()?;
        let position_ids = Tensor::arange(0.0, config.context as f64, 1.0, DType::I32, &scope.device())?;
        Ok(Gpt {
            tokens: Embedding::new(&scope.sub("tokens"), config.vocab, config.dim, rng)?,
            positions: Embedding::new(&scope.sub("positions"), config.context, config.dim, rng)?,
            blocks,
            norm: LayerNorm::new(&scope.sub("norm"), config.dim, 1e-5)?,
            head: Linear::new(&scope.sub("head"), config.dim, config.vocab, true, rng)?,
            position_ids,
            context: config.context,
        })
    }

    /// The longest window the model reads.
    pub fn context(&self) -> usize {
        self.context
    }
}

impl Module for Gpt {
    /// Ids `[B, T]` (i32 or i64, `T ≤ context`) → next-character logits `[B, T, vocab]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.shape().get(1).copied().unwrap_or(0);
        if ids.rank() != 2 || t == 0 || t > self.context {
            return Err(cartage::Error::InvalidArgument {
                op: "Gpt::forward",
                reason: format!(
                    "the ids have shape {:?}; the model needs [batch, T] with 1 ≤ T ≤ {} (its context)",
                    ids.shape(),
                    self.context
                ),
            });
        }
        let positions = self.positions.forward(&self.position_ids.narrow(0, 0, t)?)?; // [T, D]
        let mut x = self.tokens.forward(ids)?.add(&positions)?; // [B, T, D]
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}
