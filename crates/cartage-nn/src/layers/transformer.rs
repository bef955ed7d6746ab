//! [`TransformerBlock`]: a pre-norm transformer layer.

use cartage::{Epilogue, Generator, Result, Tensor};

use super::{Dropout, LayerNorm, Linear, MultiHeadAttention, dropout_layer};
use crate::{Module, Scope};

/// The shape and options of a [`TransformerBlock`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockOptions {
    /// The width of the block's input and output.
    pub dim: usize,
    /// Attention heads (`dim` divides by it).
    pub heads: usize,
    /// Whether each position attends to itself and earlier ones only.
    pub causal: bool,
    /// Biases on the projections and norms (GPT-2 has them).
    pub bias: bool,
    /// The MLP's activation: [`Epilogue::Gelu`] (exact) or [`Epilogue::GeluTanh`] (GPT-2's
    /// `gelu_new`).
    pub activation: Epilogue,
    /// The layer norms' epsilon.
    pub norm_eps: f64,
    /// Dropout on each residual branch (attention output and MLP output), in training mode.
    pub dropout: f64,
    /// What backward recomputes instead of keeping from the forward pass.
    pub recompute: Recompute,
}

/// What a recording [`TransformerBlock`] recomputes in backward instead of keeping from the
/// forward pass: memory traded for time, a selective form of activation checkpointing. Each
/// choice gives the same values and gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    /// Keep the norms' outputs and the MLP's activation output, as PyTorch eager does.
    Nothing,
    /// Recompute the two norms' outputs in the backward of the products they feed: per layer,
    /// two activations of the model's width fewer, and two norms again in backward.
    Norms,
    /// The norms and the MLP's activation (its output, four times the model's width): the
    /// least memory, and the activation again in backward.
    #[default]
    NormsAndActivation,
}

impl Recompute {
    /// Its name: `nothing`, `norms` or `norms_and_activation`.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::Nothing => "nothing",
            Recompute::Norms => "norms",
            Recompute::NormsAndActivation => "norms_and_activation",
        }
    }

    /// The choice named `name` (as [`Recompute::name`] gives it), if any.
    pub fn from_name(name: &str) -> Option<Recompute> {
        [Recompute::Nothing, Recompute::Norms, Recompute::NormsAndActivation]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

impl BlockOptions {
    /// A causal block of width `dim` with `heads` heads: biases, exact GELU, eps 1e-5, no
    /// dropout, the norms and the activation recomputed in backward.
    pub fn new(dim: usize, heads: usize) -> BlockOptions {
        BlockOptions {
            dim,
            heads,
            causal: true,
            bias: true,
            activation: Epilogue::Gelu,
            norm_eps: 1e-5,
            dropout: 0.0,
            recompute: Recompute::default(),
        }
    }
}

/// `x + drop(attn(ln1(x)))`, then `+ drop(mlp(ln2(x)))` with an MLP four times as wide
/// (GPT-2's layout). Parameters: `ln1`, `attn.qkv`, `attn.out`, `ln2`, `mlp_up`, `mlp_down`.
pub struct TransformerBlock {
    ln1: LayerNorm,
    attn: MultiHeadAttention,
    ln2: LayerNorm,
    up: Linear,
    down: Linear,
    activation: Epilogue,
    dropout: Option<Dropout>,
    recompute: Recompute,
}

impl TransformerBlock {
    /// A block of width `dim` with `heads` heads (biases, exact GELU, no dropout).
    pub fn new(scope: &Scope, dim: usize, heads: usize, causal: bool, rng: &mut Generator) -> Result<Self> {
        TransformerBlock::with_options(
            scope,
            BlockOptions {
                causal,
                ..BlockOptions::new(dim, heads)
            },
            rng,
        )
    }

    /// A block built as `options` say.
    pub fn with_options(scope: &Scope, options: BlockOptions, rng: &mut Generator) -> Result<Self> {
        let BlockOptions {
            dim,
            heads,
            causal,
            bias,
            activation,
            norm_eps,
            dropout,
            recompute,
        } = options;
        if !matches!(activation, Epilogue::Gelu | Epilogue::GeluTanh | Epilogue::Relu) {
            return Err(cartage::Error::InvalidArgument {
                op: "TransformerBlock",
                reason: format!(
                    "the MLP activation must be gelu, gelu_tanh or relu, not {}",
                    activation.name()
                ),
            });
        }
        let dropout = dropout_layer(scope, "TransformerBlock", dropout, rng)?;
        Ok(TransformerBlock {
            ln1: LayerNorm::with_bias(&scope.sub("ln1"), dim, norm_eps, bias)?,
            attn: MultiHeadAttention::with_bias(&scope.sub("attn"), dim, heads, causal, bias, rng)?,
            ln2: LayerNorm::with_bias(&scope.sub("ln2"), dim, norm_eps, bias)?,
            up: Linear::new(&scope.sub("mlp_up"), dim, 4 * dim, bias, rng)?,
            down: Linear::new(&scope.sub("mlp_down"), 4 * dim, dim, bias, rng)?,
            activation,
            dropout,
            recompute,
        })
    }

    fn drop(&self, x: Tensor) -> Result<Tensor> {
        match &self.dropout {
            Some(d) => d.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Nothing is kept without autograd: the plain path, the activation fused into the up
        // projection where the backend can.
        let recompute = match cartage::is_grad_enabled() {
            true => self.recompute,
            false => Recompute::Nothing,
        };
        let norms = recompute != Recompute::Nothing;
        let attended = if norms {
            // The first norm is recomputed in the q/k/v projection's backward: backward keeps
            // the residual stream, not the normalised copy of it as well.
            self.attn.check_input(x)?;
            let qkv = self.ln1.forward_linear(x, self.attn.qkv_projection())?;
            self.attn.attend_projected(&qkv, None)?
        } else {
            self.attn.forward(&self.ln1.forward(x)?)?
        };
        let x = x.add(&self.drop(attended)?)?;
        let mlp = match recompute {
            // The norm is recomputed in the up projection's backward and the activation in the
            // down projection's, so backward keeps their inputs alone: the residual stream and
            // the hidden layer's pre-activation (`[.., 4·dim]`).
            Recompute::NormsAndActivation => {
                let hidden = self.ln2.forward_linear(&x, &self.up)?;
                self.down.forward_activated(&hidden, self.activation)?
            }
            Recompute::Norms => {
                let hidden = self.ln2.forward_linear(&x, &self.up)?;
                self.down.forward(&hidden.activate(self.activation)?)?
            }
            Recompute::Nothing => {
                let normed = self.ln2.forward(&x)?;
                self.down.forward(&self.up.forward_with(&normed, self.activation)?)?
            }
        };
        x.add(&self.drop(mlp)?)
    }
}
