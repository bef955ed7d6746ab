//! The digits MLP of `digits_mlp.rs`, trained data-parallel: every rank builds the model,
//! `DataParallel` broadcasts rank 0's initial parameters, each rank trains on its shard of every
//! batch (`DistributedSampler`), gradients are averaged across ranks after each backward, and the
//! mean training loss is averaged across ranks once per epoch. Rank 0 reports the test accuracy;
//! the run fails below 95%.
//!
//! Here the ranks are threads of one process over cartage's in-process engine, which is for tests
//! and examples only (it moves every gradient through host memory). On the CPU that is the only
//! way: across processes on the CPU there is no collective engine, so when a launcher starts
//! several processes on the CPU, rank 0 runs every rank as a thread and the others exit at once.
//! One process per GPU needs NCCL (`cartage-cuda`'s `nccl` feature) through
//! `ProcessGroup::init`; this example does not link it, and says so when launched on a GPU.
//!
//! ```text
//! cargo run -p cartage-nn --example ddp_digits                          # 2 ranks as threads
//! cargo run -p cartage-nn --example ddp_digits -- --ranks 4 --epochs 10
//! cargo xtask launch --nproc 2 -- cargo run -p cartage-nn --example ddp_digits   # the same, on the CPU
//! ```

use std::sync::Arc;
use std::time::Duration;

use cartage::distributed::{DistEnv, InProcessCollective, ProcessGroup};
use cartage::prelude::*;
use cartage::{CrossEntropy, SafetensorsFile};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, LrSchedule, Optimizer, WarmupCosine};
use cartage_nn::{DataParallel, DistributedSampler, Module, ParamStore};

/// The global batch, split evenly among the ranks.
const BATCH: usize = 64;

/// One image's 64 pixels (scaled to [0, 1]) followed by its label.
type Row = [f32; 65];

/// The images as rows, split into train and test (every fifth image held out).
fn load(device: &Device) -> anyhow::Result<(Vec<Row>, Vec<Row>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.safetensors");
    let tensors = SafetensorsFile::open(path)?.load(device)?;
    let pixels = tensors["pixels"].to_dtype(DType::F32)?.to_vec::<f32>()?;
    let labels = tensors["labels"].to_dtype(DType::F32)?.to_vec::<f32>()?;
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (i, label) in labels.iter().enumerate() {
        let mut row = [0.0f32; 65];
        for (j, p) in pixels[i * 64..(i + 1) * 64].iter().enumerate() {
            row[j] = p / 16.0;
        }
        row[64] = *label;
        if i % 5 == 4 { test.push(row) } else { train.push(row) }
    }
    Ok((train, test))
}

/// Rows `indices` as inputs `[n, 64]` and i64 labels `[n]` on `device`.
fn batch(rows: &[Row], indices: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
    let values: Vec<f32> = indices.iter().flat_map(|&i| rows[i]).collect();
    let both = Tensor::from_slice(&values, &[indices.len(), 65], device)?;
    let x = both.narrow(1, 0, 64)?;
    let y = both.narrow(1, 64, 1)?.squeeze(1)?.to_dtype(DType::I64)?;
    Ok((x, y))
}

/// One rank's training; rank 0 returns the test accuracy.
fn train(group: ProcessGroup, train: &[Row], test: &[Row], epochs: usize) -> anyhow::Result<Option<f64>> {
    let device = group.device();
    let (rank, ranks) = (group.rank(), group.world_size());
    let store = ParamStore::new(&device);
    let mut rng = Generator::new(rank as u64); // different on purpose: the broadcast aligns them
    let model = Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 64, 128, true, &mut rng)?)
        .push(Activation::Relu)
        .push(Linear::new(&store.root().sub("2"), 128, 10, true, &mut rng)?);
    let ddp = DataParallel::new(&store, group)?;
    let mut opt = AdamW::new(&store, 3e-3)?;
    let per_rank = BATCH / ranks;
    let sampler = DistributedSampler::new(train.len(), rank, ranks);
    let steps_per_epoch = sampler.indices(0).len().div_ceil(per_rank);
    let schedule = WarmupCosine {
        base: 3e-3,
        min: 1e-4,
        warmup: steps_per_epoch,
        total: epochs * steps_per_epoch,
    };
    let mut step = 0;
    for epoch in 0..epochs {
        store.train();
        let mut total = Tensor::zeros(&[], DType::F32, &device)?;
        for chunk in sampler.indices(epoch as u64).chunks(per_rank) {
            let (x, y) = batch(train, chunk, &device)?;
            let loss = model.forward(&x)?.cross_entropy(&y, CrossEntropy::default())?;
            ddp.backward(&loss)?;
            opt.set_learning_rate(schedule.lr(step));
            opt.step(&store)?;
            store.zero_grad();
            total = total.add(&loss.detach())?;
            step += 1;
        }
        let mean = ddp.mean_across_ranks(&[&total])?[0] / steps_per_epoch as f64; // one read per epoch
        if rank == 0 && (epoch % 10 == 9 || epoch + 1 == epochs) {
            println!(
                "epoch {:>3}: mean training loss {mean:.4} (averaged over {ranks} ranks)",
                epoch + 1
            );
        }
    }
    if rank != 0 {
        return Ok(None);
    }
    store.eval();
    let _plain = cartage::no_grad();
    let all: Vec<usize> = (0..test.len()).collect();
    let (x, y) = batch(test, &all, &device)?;
    let hits = model
        .forward(&x)?
        .argmax(1, false)?
        .eq(&y)?
        .to_dtype(DType::I64)?
        .sum_all()?;
    Ok(Some(hits.item::<i64>()? as f64 / test.len() as f64))
}

fn flag(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::args().skip_while(|a| a != name).nth(1) {
        Some(n) => Ok(n.parse()?),
        None => Ok(default),
    }
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let env = DistEnv::from_env()?;
    let device = Device::pick()?;
    let mut ranks = flag("--ranks", 2)?;
    if env.world_size > 1 {
        // Started by a launcher, one process per rank.
        anyhow::ensure!(
            device.is_cpu(),
            "started as rank {} of {} on {device}: one process per GPU needs NCCL (cartage-cuda's `nccl` feature, \
             joined with `ProcessGroup::init`), which this example does not link; run it without the launcher \
             (its ranks are then threads over the in-process test engine)",
            env.rank,
            env.world_size
        );
        if !env.is_main() {
            println!(
                "rank {}: the CPU has no collective engine across processes; rank 0 runs every rank as a thread",
                env.rank
            );
            return Ok(());
        }
        println!(
            "the CPU has no collective engine across processes: rank 0 runs all {} ranks as threads",
            env.world_size
        );
        ranks = env.world_size;
    }
    let epochs = flag("--epochs", 40)?;
    anyhow::ensure!(
        ranks > 0 && BATCH.is_multiple_of(ranks),
        "--ranks must divide the batch of {BATCH}"
    );
    let (train_rows, test_rows) = load(&device)?;
    println!(
        "device: {device}; {ranks} ranks as threads (in-process test engine); {} training and {} test images",
        train_rows.len(),
        test_rows.len()
    );
    let members = InProcessCollective::group(&device, ranks, Duration::from_secs(120))?;
    let accuracy = std::thread::scope(|scope| -> anyhow::Result<f64> {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                let (train_rows, test_rows) = (&train_rows, &test_rows);
                scope.spawn(move || train(ProcessGroup::new(Arc::new(member)), train_rows, test_rows, epochs))
            })
            .collect();
        let mut accuracy = None;
        for handle in handles {
            let result = handle.join().map_err(|_| anyhow::anyhow!("a rank panicked"))??;
            accuracy = accuracy.or(result);
        }
        accuracy.ok_or_else(|| anyhow::anyhow!("rank 0 reported no accuracy"))
    })?;
    println!("test accuracy: {:.2}%", 100.0 * accuracy);
    anyhow::ensure!(accuracy >= 0.95, "test accuracy {:.2}% is below 95%", 100.0 * accuracy);
    Ok(())
}
