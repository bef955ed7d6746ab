//! A character-level GPT trained on two Jane Austen novels (`data/austen.txt`, 1.1 MB, 77
//! distinct characters), on the device `--device` names (else whatever `Device::pick()`
//! chooses): token and position embeddings, causal `TransformerBlock`s, a final `LayerNorm` and a
//! `Linear` head, trained with AdamW under a warm-up + cosine schedule, gradients clipped on the
//! device, batches of random (context, next character) windows fed through `PrefetchLoader`, and
//! bf16 autocast on CUDA.
//!
//! The last 10% of the text is held out. Every `--eval-every` steps the run prints the training
//! and validation losses, tokens per second and the peak device memory; at the end it samples
//! text from a prompt, and writes the loss curve (`loss.svg`) and the sample (`sample.txt`) to
//! `--out` (with `--save FILE`, the trained parameters too, as a safetensors state dict). It
//! fails unless the final validation loss is below the text's unigram entropy, the loss of a
//! model that learned nothing from context.
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run --release -p cartage-nn --features cuda --example gpt
//! cargo run -p cartage-nn --example gpt -- --layers 2 --dim 64 --heads 4 --context 64 --batch 16 --steps 200
//! cargo run -p cartage-nn --example gpt -- --help
//! ```

mod args;
mod corpus;
mod plot;
mod sample;
mod train;

use anyhow::ensure;
use cartage::prelude::*;
use cartage::runtime::pick_named;
use cartage::{format_bytes, memory_stats};
use cartage_nn::ParamStore;

use args::{Args, Precision, USAGE};
use cartage_nn::models::{Gpt, GptConfig};
use corpus::{Corpus, HostRng};
use sample::{Sampling, generate};
use train::Trainer;

/// The autocast dtype for `precision` on `device` (`auto`: bf16 on CUDA, f32 elsewhere).
// cartage: device-entry
fn autocast_dtype(precision: Precision, device: &Device) -> Option<DType> {
    match precision {
        Precision::Auto if device.kind() == cartage::DeviceKind::Cuda => Some(DType::BF16),
        Precision::Auto | Precision::Off => None,
        Precision::Bf16 => Some(DType::BF16),
        Precision::F16 => Some(DType::F16),
    }
}

/// The model's sizes in words.
fn shape(args: &Args) -> String {
    format!(
        "layers {}, width {}, heads {}, context {}",
        args.layers, args.dim, args.heads, args.context
    )
}

/// Sample `args.generate` characters after `args.prompt`, in eval mode.
fn sample_text(model: &Gpt, store: &ParamStore, corpus: &Corpus, args: &Args) -> anyhow::Result<String> {
    let prompt = corpus.encode(&args.prompt)?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
    };
    let mut rng = HostRng::new(args.seed.wrapping_add(1));
    store.eval();
    let ids = generate(model, &store.device(), &prompt, args.generate, sampling, &mut rng)?;
    store.train();
    Ok(corpus.decode(&ids))
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let Some(args) = Args::parse(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    // `--device` wins over CARTAGE_DEVICE; a bad value's error names the flag.
    let device = match &args.device {
        Some(name) => pick_named(Some(name), "--device")?,
        None => Device::pick()?,
    };
    let half = autocast_dtype(args.precision, &device);
    let corpus = Corpus::load()?;
    let unigram = corpus.unigram_entropy();
    println!(
        "device: {device}; {} training and {} validation characters, {} distinct; unigram entropy {unigram:.4} nats",
        corpus.train.len(),
        corpus.val.len(),
        corpus.vocab_size(),
    );

    let store = ParamStore::new(&device);
    let config = GptConfig::new(corpus.vocab_size(), args.context, args.dim, args.heads, args.layers);
    let model = Gpt::new(&store.root(), config, &mut Generator::new(args.seed))?;
    println!(
        "model: {}; {} parameters ({}); batch {}; autocast {}",
        shape(&args),
        store.num_params(),
        format_bytes(store.size_in_bytes() as u64),
        args.batch,
        half.map_or("off".to_string(), |d| format!("{d:?}")),
    );

    let trainer = Trainer {
        device,
        store: &store,
        model: &model,
        half,
    };
    let summary = trainer.run(&corpus, &args)?;
    let stats = memory_stats(&device)?;
    println!(
        "trained {} steps in {:.1} s: {:.0} tokens/s; peak device memory {} allocated, {} reserved",
        args.steps,
        summary.train_seconds,
        summary.tokens_per_second,
        format_bytes(stats.peak_allocated_bytes as u64),
        format_bytes(stats.peak_reserved_bytes as u64),
    );
    let runtime = cartage::stats();
    println!(
        "host syncs so far: {} (loss reads at each evaluation, plus one per step with a GradScaler); implicit copies: {} ({})",
        runtime.host_syncs,
        runtime.implicit_copies,
        format_bytes(runtime.implicit_copy_bytes),
    );

    let text = sample_text(&model, &store, &corpus, &args)?;
    println!("--- sample (temperature {}) ---\n{text}\n---", args.temperature);
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("sample.txt"), &text)?;
    let title = format!("char-level GPT on {device} ({})", shape(&args));
    plot::write_loss_svg(&args.out.join("loss.svg"), &title, &summary.points, unigram)?;
    println!("wrote {}", args.out.join("loss.svg").display());
    if let Some(path) = &args.save {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        store.save_state_dict(path)?; // PyTorch's `save_file(model.state_dict(), path)`
        println!("wrote the state dict to {}", path.display());
    }

    let final_val = summary.points.last().map_or(f64::INFINITY, |p| p.val);
    if let Some(best) = summary.points.iter().min_by(|a, b| a.val.total_cmp(&b.val)) {
        println!("best validation loss {:.4} at step {}", best.val, best.step);
    }
    println!("final validation loss {final_val:.4} against the unigram entropy {unigram:.4}");
    ensure!(
        final_val < unigram,
        "the validation loss {final_val:.4} is not below the unigram entropy {unigram:.4}: the model learned nothing from context"
    );
    Ok(())
}
