//! [`Gpt`]: a decoder-only transformer — token and position embeddings, pre-norm transformer
//! blocks with causal attention, a final LayerNorm and a linear head (GPT-2's layout). The
//! `gpt` example trains it on characters; the bench's training section runs the same model
//! against PyTorch's; [`Gpt::from_transformers`] loads a GPT-2 checkpoint written by the
//! `transformers` library.

use cartage::prelude::*;
use cartage::{Epilogue, Error};

use crate::layers::{BlockOptions, Dropout, Embedding, LayerNorm, Linear, Recompute, TransformerBlock, dropout_layer};
use crate::{Module, Scope};

/// The model's sizes and options. [`GptConfig::new`] gives the sizes with cartage's defaults
/// (an untied head with a bias, exact GELU, eps 1e-5, no dropout); [`GptConfig::gpt2`] GPT-2's
/// options.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// The head reads the token embedding's table (`logits = x · wteᵀ`, no head bias), as GPT-2
    /// does; otherwise the head is a `Linear` of its own.
    pub tied_embeddings: bool,
    /// Biases on every projection and layer norm (and on an untied head).
    pub bias: bool,
    /// Dropout after the embeddings and on each residual branch, in training mode.
    pub dropout: f64,
    /// The MLPs' activation: [`Epilogue::Gelu`] or GPT-2's [`Epilogue::GeluTanh`].
    pub activation: Epilogue,
    /// The layer norms' epsilon.
    pub norm_eps: f64,
    /// What the blocks recompute in backward instead of keeping ([`Recompute`]).
    pub recompute: Recompute,
}

impl GptConfig {
    /// A model of these sizes with cartage's defaults: untied head with a bias, biases, exact
    /// GELU, eps 1e-5, no dropout.
    pub fn new(vocab: usize, context: usize, dim: usize, heads: usize, layers: usize) -> GptConfig {
        GptConfig {
            vocab,
            context,
            dim,
            heads,
            layers,
            tied_embeddings: false,
            bias: true,
            dropout: 0.0,
            activation: Epilogue::Gelu,
            norm_eps: 1e-5,
            recompute: Recompute::default(),
        }
    }

    /// GPT-2's options at these sizes: tied embeddings, biases, the tanh GELU, eps 1e-5 and
    /// dropout 0.1 (what `transformers`' `GPT2Config` defaults to).
    pub fn gpt2(vocab: usize, context: usize, dim: usize, heads: usize, layers: usize) -> GptConfig {
        GptConfig {
            tied_embeddings: true,
            dropout: 0.1,
            activation: Epilogue::GeluTanh,
            ..GptConfig::new(vocab, context, dim, heads, layers)
        }
    }

    fn check(&self) -> Result<()> {
        let sizes = [self.vocab, self.context, self.dim, self.heads];
        let bad = if sizes.contains(&0) {
            Some("vocab, context, dim and heads must all be at least 1".to_string())
        } else if !self.dim.is_multiple_of(self.heads) {
            Some(format!("dim {} must be a multiple of heads {}", self.dim, self.heads))
        } else if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            Some(format!("norm_eps is {}; it must be finite and > 0", self.norm_eps))
        } else {
            None
        };
        match bad {
            Some(reason) => Err(Error::InvalidArgument { op: "Gpt::new", reason }),
            None => Ok(()),
        }
    }
}

/// The head: a `Linear` of its own, or the token table read transposed.
enum Head {
    Own(Linear),
    Tied,
}

/// A decoder-only transformer over token ids.
///
/// Parameter names: `tokens.weight`, `positions.weight`, `block{i}.{ln1, attn.qkv, attn.out,
/// ln2, mlp_up, mlp_down}.{weight, bias}`, `norm.{weight, bias}` and, untied, `head.{weight,
/// bias}` (weights `[out, in]`).
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::models::{Gpt, GptConfig};
/// use cartage_nn::{Module, ParamStore};
/// # fn main() -> cartage::Result<()> {
/// let store = ParamStore::new(&Device::cpu());
/// let config = GptConfig::new(11, 8, 16, 2, 1); // vocab, context, dim, heads, layers
/// let model = Gpt::new(&store.root(), config, &mut Generator::new(0))?;
/// let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3], &Device::cpu())?;
/// assert_eq!(model.forward(&ids)?.shape(), &[2, 3, 11]);
/// # Ok(())
/// # }
/// ```
pub struct Gpt {
    tokens: Embedding,
    positions: Embedding,
    dropout: Option<Dropout>,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Head,
    /// `0..context` as i32 on the model's device: the position ids of a full window.
    position_ids: Tensor,
    config: GptConfig,
}

impl Gpt {
    /// A model of `config`'s sizes whose parameters live in `scope`, initialised from `rng`.
    pub fn new(scope: &Scope, config: GptConfig, rng: &mut Generator) -> Result<Gpt> {
        config.check()?;
        let block = BlockOptions {
            bias: config.bias,
            activation: config.activation,
            norm_eps: config.norm_eps,
            dropout: config.dropout,
            recompute: config.recompute,
            ..BlockOptions::new(config.dim, config.heads)
        };
        // Blocks first, then the embeddings, the norm and the head: the order the draws from
        // `rng` have always had, so a seed gives the same model as before.
        let blocks = (0..config.layers)
            .map(|i| TransformerBlock::with_options(&scope.sub(format!("block{i}")), block, rng))
            .collect::<Result<Vec<_>>>()?;
        let tokens = Embedding::new(&scope.sub("tokens"), config.vocab, config.dim, rng)?;
        let positions = Embedding::new(&scope.sub("positions"), config.context, config.dim, rng)?;
        let dropout = dropout_layer(scope, "Gpt::new", config.dropout, rng)?;
        let norm = LayerNorm::with_bias(&scope.sub("norm"), config.dim, config.norm_eps, config.bias)?;
        let head = match config.tied_embeddings {
            true => Head::Tied,
            false => Head::Own(Linear::new(
                &scope.sub("head"),
                config.dim,
                config.vocab,
                config.bias,
                rng,
            )?),
        };
        let position_ids = Tensor::arange(0.0, config.context as f64, 1.0, DType::I32, &scope.device())?;
        Ok(Gpt {
            tokens,
            positions,
            dropout,
            blocks,
            norm,
            head,
            position_ids,
            config,
        })
    }

    /// The longest window the model reads.
    pub fn context(&self) -> usize {
        self.config.context
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> GptConfig {
        self.config
    }

    /// Extend each row of `ids` `[B, T]` by `new_tokens` tokens, each the most likely next one
    /// given the last `context` tokens (greedy decoding), and return `[B, T + new_tokens]` as
    /// i64. Call it with the store in evaluation mode ([`crate::ParamStore::eval`]) and under
    /// [`cartage::no_grad`] to skip dropout and autograd.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::models::{Gpt, GptConfig};
    /// use cartage_nn::ParamStore;
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// let model = Gpt::new(&store.root(), GptConfig::new(11, 8, 16, 2, 1), &mut Generator::new(0))?;
    /// let prompt = Tensor::from_slice(&[1i64, 2, 3], &[1, 3], &Device::cpu())?;
    /// let out = model.generate(&prompt, 4)?;
    /// assert_eq!(out.shape(), &[1, 7]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn generate(&self, ids: &Tensor, new_tokens: usize) -> Result<Tensor> {
        let mut ids = ids.to_dtype(DType::I64)?;
        for _ in 0..new_tokens {
            let t = ids.shape().get(1).copied().unwrap_or(0);
            let start = t.saturating_sub(self.config.context);
            let window = ids.narrow(1, start, t - start)?;
            let logits = self.forward(&window)?; // [B, T', vocab]
            let last = logits.narrow(1, t - start - 1, 1)?; // [B, 1, vocab]
            let next = last.argmax(-1, false)?.to_dtype(DType::I64)?; // [B, 1]
            ids = Tensor::cat(&[&ids, &next], 1)?;
        }
        Ok(ids)
    }
}

impl Module for Gpt {
    /// Ids `[B, T]` (i32 or i64, `T ≤ context`) → next-token logits `[B, T, vocab]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.shape().get(1).copied().unwrap_or(0);
        if ids.rank() != 2 || t == 0 || t > self.config.context {
            return Err(Error::InvalidArgument {
                op: "Gpt::forward",
                reason: format!(
                    "the ids have shape {:?}; the model needs [batch, T] with 1 ≤ T ≤ {} (its context)",
                    ids.shape(),
                    self.config.context
                ),
            });
        }
        let positions = self.positions.forward(&self.position_ids.narrow(0, 0, t)?)?; // [T, D]
        let mut x = self.tokens.forward(ids)?.add(&positions)?; // [B, T, D]
        if let Some(d) = &self.dropout {
            x = d.forward(&x)?;
        }
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        match &self.head {
            // The norm recomputed in the head's backward: its output is not kept.
            Head::Own(linear) if cartage::is_grad_enabled() => self.norm.forward_linear(&x, linear),
            Head::Own(linear) => linear.forward(&self.norm.forward(&x)?),
            Head::Tied => self
                .norm
                .forward(&x)?
                .linear(&self.tokens.weight().tensor(), None, Epilogue::Identity),
        }
    }
}
