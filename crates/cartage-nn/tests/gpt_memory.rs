//! What a GPT training step keeps for backward. The blocks' MLPs keep their hidden layer once
//! (the GELU input, `[.., 4·dim]`), not its output as well: the down projection recomputes the
//! activation in its backward; neither norm's output is kept: the q/k/v and up projections
//! recompute them from the residual stream. An ignored report lists, per part of a block and for the whole
//! model, the bytes autograd saves and the allocator's peak over one step, at the benchmark's
//! two GPT shapes (batch scaled down for the CPU). Attention is one node over the packed q/k/v
//! projection: on the CPU it saves that projection alone and recomputes the probabilities
//! (`[B, H, T, T]`) in its backward; the fused GPU attention saves its output (the tensor the
//! output projection keeps anyway) and the log-sum-exp as well. The report lists attention apart. One test function per concern that
//! reads the CPU's counters: they are per device, and tests run on parallel threads.

use cartage::prelude::*;
use cartage::{CrossEntropy, Epilogue, graph_memory, memory_stats, reset_peak_memory_stats};
use cartage_nn::layers::{BlockOptions, LayerNorm, Linear, MultiHeadAttention, Recompute, TransformerBlock};
use cartage_nn::models::{Gpt, GptConfig};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{Module, ParamStore};

fn saved(device: &Device) -> usize {
    graph_memory(device).saved_bytes
}

/// Bytes autograd saves while `f` runs (its result is kept alive until measured).
fn saved_by(device: &Device, f: impl FnOnce() -> Result<Tensor>) -> Result<(usize, Tensor)> {
    let before = saved(device);
    let out = f()?;
    Ok((saved(device) - before, out))
}

/// The saved bytes of each part of one block on `x` `[B, T, dim]`: ln1, attention, ln2 alone,
/// ln2 and the MLP as the block runs them (the norm recomputed by up, the activation by down)
/// and composed (ln2, up with its activation, then down on the activation's output).
struct BlockParts {
    ln1: usize,
    attention: usize,
    ln2: usize,
    mlp: usize,
    mlp_composed: usize,
    block: usize,
}

fn block_parts(x: &Tensor, dim: usize, heads: usize, autocast: bool) -> Result<BlockParts> {
    let device = x.device();
    let store = ParamStore::new(&device);
    let mut rng = Generator::new(0);
    let root = store.root();
    let ln1 = LayerNorm::new(&root.sub("ln1"), dim, 1e-5)?;
    let attn = MultiHeadAttention::new(&root.sub("attn"), dim, heads, true, &mut rng)?;
    let ln2 = LayerNorm::new(&root.sub("ln2"), dim, 1e-5)?;
    let up = Linear::new(&root.sub("up"), dim, 4 * dim, true, &mut rng)?;
    let down = Linear::new(&root.sub("down"), 4 * dim, dim, true, &mut rng)?;
    let block = TransformerBlock::new(&root.sub("block"), dim, heads, true, &mut rng)?;
    let _autocast = autocast.then(|| cartage::autocast(&device, DType::BF16)).transpose()?;
    let (ln1_bytes, normed) = saved_by(&device, || ln1.forward(x))?;
    let (attention, attended) = saved_by(&device, || attn.forward(&normed))?;
    // The residual stream, as the block adds it (f32 under autocast: the add widens).
    let residual = x.add(&attended)?;
    let (ln2_bytes, normed2) = saved_by(&device, || ln2.forward(&residual))?;
    drop(normed2);
    let (mlp, _mlp_out) = saved_by(&device, || {
        down.forward_activated(&ln2.forward_linear(&residual, &up)?, Epilogue::Gelu)
    })?;
    let (mlp_composed, _composed_out) = saved_by(&device, || {
        down.forward(&up.forward_with(&ln2.forward(&residual)?, Epilogue::Gelu)?)
    })?;
    let (block_bytes, _block_out) = saved_by(&device, || block.forward(x))?;
    Ok(BlockParts {
        ln1: ln1_bytes,
        attention,
        ln2: ln2_bytes,
        mlp,
        mlp_composed,
        block: block_bytes,
    })
}

#[test]
fn a_block_keeps_neither_the_norms_nor_the_activations_output() -> Result<()> {
    let device = Device::cpu();
    let (b, t, dim, heads) = (2, 8, 16, 2);
    let x = Tensor::randn(&[b, t, dim], DType::F32, 1, &device)?;
    let parts = block_parts(&x, dim, heads, false)?;
    let rows = b * t;
    let f32_bytes = 4;
    // ln2 and up: the residual stream, the norm's weight and bias and up's weight; down: the
    // GELU's input and its weight.
    let mlp = (rows * dim + 2 * dim + 4 * dim * dim + rows * 4 * dim + dim * 4 * dim) * f32_bytes;
    assert_eq!(parts.mlp, mlp, "ln2 and the MLP keep their inputs and weights alone");
    assert_eq!(
        parts.mlp_composed + dim * f32_bytes - parts.mlp,
        (rows * dim + rows * 4 * dim) * f32_bytes,
        "composed, they also keep the norm's output and the activation's (less the norm's bias)"
    );
    // In the block ln1 goes into the q/k/v product as one node too: its output is recomputed
    // in backward, not kept (the node keeps ln1's bias, as ln2's above).
    assert_eq!(
        parts.block + rows * dim * f32_bytes,
        parts.ln1 + parts.attention + parts.mlp + dim * f32_bytes,
        "the block keeps what its parts keep, ln2 and the MLP as above, less ln1's output"
    );
    // The other recompute choices keep more, by exactly what they do not recompute.
    let saved_with = |recompute: Recompute| -> Result<usize> {
        let store = ParamStore::new(&device);
        let options = BlockOptions {
            recompute,
            ..BlockOptions::new(dim, heads)
        };
        let block = TransformerBlock::with_options(&store.root().sub("block"), options, &mut Generator::new(0))?;
        Ok(saved_by(&device, || block.forward(&x))?.0)
    };
    let [nothing, norms, both] = [Recompute::Nothing, Recompute::Norms, Recompute::NormsAndActivation].map(saved_with);
    let (nothing, norms, both) = (nothing?, norms?, both?);
    assert_eq!(both, parts.block, "the default recomputes the norms and the activation");
    assert_eq!(
        norms,
        both + rows * 4 * dim * f32_bytes,
        "recomputing the norms alone keeps the activation's output too"
    );
    assert_eq!(
        nothing + 2 * dim * f32_bytes,
        norms + 2 * rows * dim * f32_bytes,
        "recomputing nothing keeps both norms' outputs too (and neither norm's bias)"
    );
    Ok(())
}

/// The benchmark's GPT rows: (layers, dim, heads, context, batch, vocab).
const SHAPES: [(usize, usize, usize, usize, usize, usize); 2] = [(6, 384, 6, 256, 64, 128), (4, 512, 8, 512, 16, 8192)];

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// `GPT_MEMORY_BATCH_DIV` (default 16) divides each shape's batch; `GPT_MEMORY_SHAPE` (0 or
/// 1) runs one shape alone.
#[test]
#[ignore = "a report: run with --ignored --nocapture"]
fn report_what_a_gpt_step_keeps() -> Result<()> {
    let device = Device::cpu();
    let div: usize = std::env::var("GPT_MEMORY_BATCH_DIV")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let only: Option<usize> = std::env::var("GPT_MEMORY_SHAPE").ok().and_then(|v| v.parse().ok());
    for (i, &(layers, dim, heads, context, batch, vocab)) in SHAPES.iter().enumerate() {
        if only.is_some_and(|only| only != i) {
            continue;
        }
        let batch = (batch / div).max(1);
        for autocast in [false, true] {
            let x = Tensor::randn(&[batch, context, dim], DType::F32, 1, &device)?;
            let parts = block_parts(&x, dim, heads, autocast)?;
            drop(x);
            let store = ParamStore::new(&device);
            let model = Gpt::new(
                &store.root(),
                GptConfig::new(vocab, context, dim, heads, layers),
                &mut Generator::new(0),
            )?;
            let mut opt = AdamW::new(&store, 1e-3)?;
            let ids: Vec<i64> = (0..batch * context).map(|i| ((i * 7919) % vocab) as i64).collect();
            let ids = Tensor::from_vec(ids, &[batch, context], &device)?;
            let targets: Vec<i64> = (0..batch * context).map(|i| ((i * 7919 + 1) % vocab) as i64).collect();
            let targets = Tensor::from_vec(targets, &[batch * context], &device)?;
            let step = |measure: bool| -> Result<(usize, usize, usize, usize)> {
                let before = memory_stats(&device)?.allocated_bytes;
                reset_peak_memory_stats(&device)?;
                let loss = {
                    let _autocast = autocast.then(|| cartage::autocast(&device, DType::BF16)).transpose()?;
                    let logits = model.forward(&ids)?.reshape(&[batch * context, vocab])?;
                    logits.cross_entropy(&targets, CrossEntropy::default())?
                };
                let kept = saved(&device);
                let forward_peak = memory_stats(&device)?.peak_allocated_bytes - before;
                let held = memory_stats(&device)?.allocated_bytes - before;
                loss.backward()?;
                drop(loss);
                let peak = memory_stats(&device)?.peak_allocated_bytes - before;
                let _ = measure;
                Ok((kept, peak, forward_peak, held))
            };
            // The first step creates the gradients and the moments; the second is measured.
            step(false)?;
            opt.step(&store)?;
            store.zero_grad();
            let (kept, peak, forward_peak, held) = step(true)?;
            println!(
                "{layers} layers d {dim} h {heads} T {context} B {batch} vocab {vocab} {}: saved {:.1} MiB \
                 (attention {:.1} MiB of it), held after forward {:.1} MiB, forward peak {:.1} MiB, \
                 forward+backward peak {:.1} MiB; per block: ln1 {:.2}, \
                 attention {:.2}, ln2 alone {:.2}, ln2 and mlp {:.2} (composed {:.2}), block {:.2} MiB",
                if autocast { "bf16 autocast" } else { "f32" },
                mib(kept),
                mib(parts.attention * layers),
                mib(held),
                mib(forward_peak),
                mib(peak),
                mib(parts.ln1),
                mib(parts.attention),
                mib(parts.ln2),
                mib(parts.mlp),
                mib(parts.mlp_composed),
                mib(parts.block),
            );
        }
    }
    Ok(())
}
