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
    /// Vocabulary size.
    vocab: usize,
    /// Where it all lives.
    device: Device,
}

impl GptFixture {
    /// Build the model of `config`, its optimizer and a batch of `batch` sequences on `device`.
    pub fn new(config: GptConfig, batch: usize, device: &Device) -> Result<Self> {
        let GptConfig { vocab, context, .. } = config;
        let store = ParamStore::new(device);
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
        let rows = self.y.numel();
        let logits = self.model.forward(&self.x)?.reshape(&[rows, self.vocab])?;
        logits.cross_entropy(&self.y, CrossEntropy::default())
    }
}
