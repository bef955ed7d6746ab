//! The benchmark's GPT, shared by the training section of `cargo xtask bench` and by
//! `cargo xtask kernels wgpu gpt-profile`: a character-level GPT from `cartage-nn` initialised
//! from seed 0, AdamW at 1e-3, and one fixed batch of token ids (`i · 7919 mod vocab`, the
//! targets shifted by one).

use cartage::{CrossEntropy, DType, Device, Result, Tensor};
use cartage_nn::models::{Gpt, GptConfig};
use cartage_nn::optim::AdamW;
use cartage_nn::{Module, ParamStore};

/// The model, its optimizer and one batch on one device.
pub struct GptFixture {
    /// The parameters.
    pub store: ParamStore,
    /// The model.
    pub model: Gpt,
    /// AdamW over `store`.
    pub opt: AdamW,
    /// Token ids `[batch, context]`.
    pub x: Tensor,
    /// Next-token targets `[batch · context]`.
    pub y: Tensor,
    /// Rows of logits per step (`batch · context`).
    rows: usize,
    /// Vocabulary size.
    vocab: usize,
    /// Where it all lives.
    device: Device,
}

/// The shape of a [`GptFixture`].
#[derive(Clone, Copy, Debug)]
pub struct GptShape {
    /// Transformer blocks.
    pub layers: usize,
    /// Width.
    pub dim: usize,
    /// Attention heads.
    pub heads: usize,
    /// Tokens per sequence.
    pub context: usize,
    /// Sequences per batch.
    pub batch: usize,
    /// Token ids run over `0..vocab`.
    pub vocab: usize,
}

impl GptFixture {
    /// Build the model, its optimizer and the batch on `device`.
    pub fn new(shape: GptShape, device: &Device) -> Result<Self> {
        let GptShape {
            layers,
            dim,
            heads,
            context,
            batch,
            vocab,
        } = shape;
        let store = ParamStore::new(device);
        let config = GptConfig {
            vocab,
            context,
            dim,
            heads,
            layers,
        };
        let model = Gpt::new(&store.root(), config, &mut cartage::Generator::new(0))?;
        let opt = AdamW::new(&store, 1e-3)?;
        let ids = |offset: usize| -> Result<Tensor> {
            let v: Vec<i64> = (0..batch * context)
                .map(|i| ((i * 7919 + offset) % vocab) as i64)
                .collect();
            Tensor::from_vec(v, &[batch, context], device)
        };
        let (x, y) = (ids(0)?, ids(1)?.reshape(&[batch * context])?);
        Ok(GptFixture {
            store,
            model,
            opt,
            x,
            y,
            rows: batch * context,
            vocab,
            device: *device,
        })
    }

    /// The mean cross-entropy of the batch's next-token predictions, recorded for backward;
    /// the forward pass under bf16 autocast when `autocast`.
    pub fn loss(&self, autocast: bool) -> Result<Tensor> {
        let _autocast = if autocast {
            Some(cartage::autocast(&self.device, DType::BF16)?)
        } else {
            None
        };
        let logits = self.model.forward(&self.x)?.reshape(&[self.rows, self.vocab])?;
        logits.cross_entropy(&self.y, CrossEntropy::default())
    }
}
