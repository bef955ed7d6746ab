//! [`Gpt`]: a decoder-only transformer — token and position embeddings, pre-norm transformer
//! blocks with causal attention, a final LayerNorm and a linear head (GPT-2's layout). The
//! `gpt` example trains it on characters; the bench's training section runs the same model
//! against PyTorch's.

use cartage::prelude::*;

use crate::layers::{Embedding, LayerNorm, Linear, TransformerBlock};
use crate::{Module, Scope};

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Token ids run over `0..vocab`.
    pub vocab: usize,
    /// The longest window the model reads.
    pub context: usize,
    /// The width of every layer.
    pub dim: usize,
    /// Attention heads (`dim` divides by it).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
}

/// A decoder-only transformer over token ids.
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::models::{Gpt, GptConfig};
/// use cartage_nn::{Module, ParamStore};
/// # fn main() -> cartage::Result<()> {
/// let store = ParamStore::new(&Device::cpu());
/// let config = GptConfig { vocab: 11, context: 8, dim: 16, heads: 2, layers: 1 };
/// let model = Gpt::new(&store.root(), config, &mut Generator::new(0))?;
/// let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3], &Device::cpu())?;
/// assert_eq!(model.forward(&ids)?.shape(), &[2, 3, 11]);
/// # Ok(())
/// # }
/// ```
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
    pub fn new(scope: &Scope, config: GptConfig, rng: &mut Generator) -> Result<Gpt> {
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
