//! Text generation: one forward pass per character over the last `context` characters, the
//! next character's probabilities read back (one host read per character) and sampled on the
//! host with a temperature and an optional top-k cut.

use cartage::prelude::*;
use cartage_nn::Module;

use crate::corpus::HostRng;
use cartage_nn::models::Gpt;

/// How to pick each next character.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Logits are divided by it before the softmax (below 1: more conservative).
    pub temperature: f64,
    /// Keep only the `top_k` likeliest characters (0: all).
    pub top_k: usize,
}

/// `prompt` followed by `count` sampled ids. Run with the store in eval mode.
pub fn generate(
    model: &Gpt,
    device: &Device,
    prompt: &[u8],
    count: usize,
    sampling: Sampling,
    rng: &mut HostRng,
) -> anyhow::Result<Vec<u8>> {
    let _plain = no_grad();
    let mut ids = prompt.to_vec();
    for _ in 0..count {
        let window = &ids[ids.len().saturating_sub(model.context())..];
        let probs = next_probabilities(model, device, window, sampling.temperature)?;
        ids.push(pick(&probs, sampling.top_k, rng));
    }
    Ok(ids)
}

/// The softmax of the last position's logits over `temperature`, read back to the host.
fn next_probabilities(model: &Gpt, device: &Device, window: &[u8], temperature: f64) -> Result<Vec<f32>> {
    let t = window.len();
    let values: Vec<i32> = window.iter().map(|&id| i32::from(id)).collect();
    let ids = Tensor::from_slice(&values, &[1, t], device)?;
    let logits = model.forward(&ids)?; // [1, t, vocab]
    let last = logits.narrow(1, t - 1, 1)?.flatten()?.to_dtype(DType::F32)?;
    last.mul_scalar(1.0 / temperature)?.softmax(-1)?.to_vec::<f32>()
}

/// A draw from `probs`, restricted to the `top_k` largest when `top_k > 0`.
fn pick(probs: &[f32], top_k: usize, rng: &mut HostRng) -> u8 {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let total: f64 = order.iter().map(|&i| f64::from(probs[i])).sum();
    let mut target = rng.unit() * total;
    for &i in &order {
        target -= f64::from(probs[i]);
        if target <= 0.0 {
            return i as u8;
        }
    }
    order.last().map_or(0, |&i| i as u8)
}
