//! An MLP classifier on the 8×8 handwritten digits (1797 images, `data/digits.safetensors`),
//! trained with AdamW on the device `--device` names (else whatever `Device::pick()` chooses),
//! with batches fed through `PrefetchLoader`. Every fifth image is held out; the test accuracy is
//! printed, and the run fails below 95%. `--save FILE` writes the trained parameters as a
//! safetensors state dict (PyTorch's names and layouts), loads them into a fresh model and checks
//! that it scores the same.
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run --release -p cartage-nn --features cuda --example digits_mlp
//! cargo run -p cartage-nn --example digits_mlp -- --epochs 10     # a shorter run
//! cargo run -p cartage-nn --example digits_mlp -- --device cpu --save /tmp/digits.safetensors
//! ```

use cartage::loader::{HostBatch, PrefetchLoader};
use cartage::prelude::*;
use cartage::runtime::pick_named;
use cartage::{CrossEntropy, SafetensorsFile};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, LrSchedule, Optimizer, WarmupCosine};
use cartage_nn::{LoadOptions, Module, ParamStore};

const BATCH: usize = 64;

/// One image's 64 pixels (scaled to [0, 1]) followed by its label.
type Row = [f32; 65];

/// The images as f32 rows `[64 pixels / 16, label]`, split into train and test.
fn load() -> anyhow::Result<(Vec<Row>, Vec<Row>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.safetensors");
    let file = SafetensorsFile::open(path)?;
    let cpu = Device::cpu();
    let tensors = file.load(&cpu)?;
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

/// Rows as host batches of `[n, 65]`, the training ones shuffled by `epoch`.
fn batches(rows: &[Row], epoch: u64) -> Vec<HostBatch> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    let mut state = epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
        .chunks(BATCH)
        .map(|chunk| {
            let values: Vec<f32> = chunk.iter().flat_map(|&i| rows[i]).collect();
            HostBatch::new(values, &[chunk.len(), 65])
        })
        .collect()
}

/// Split a device batch into inputs `[n, 64]` and i64 labels `[n]`.
fn split(batch: &Tensor) -> Result<(Tensor, Tensor)> {
    let x = batch.narrow(1, 0, 64)?;
    let y = batch.narrow(1, 64, 1)?.squeeze(1)?.to_dtype(DType::I64)?;
    Ok((x, y))
}

/// The MLP, its parameters named as PyTorch's `nn.Sequential` names them (`0.weight`, …).
fn mlp(store: &ParamStore, rng: &mut Generator) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 64, 128, true, rng)?)
        .push(Activation::Relu)
        .push(Linear::new(&store.root().sub("2"), 128, 10, true, rng)?))
}

/// The number of test images `model` classifies correctly (one read from the device).
fn correct(model: &Sequential, test: &[Row], device: &Device) -> Result<i64> {
    let _plain = cartage::no_grad();
    let mut correct = Tensor::zeros(&[], DType::I64, device)?;
    for batch in PrefetchLoader::new(batches(test, 0), device)? {
        let (x, y) = split(&batch?)?;
        let hits = model.forward(&x)?.argmax(1, false)?.eq(&y)?.to_dtype(DType::I64)?;
        correct = correct.add(&hits.sum_all()?)?;
    }
    correct.item::<i64>()
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let epochs: usize = match flag("--epochs") {
        Some(n) => n.parse()?,
        None => 40,
    };
    // `--device` wins over CARTAGE_DEVICE; a bad value's error names the flag.
    let device = match flag("--device") {
        Some(name) => pick_named(Some(&name), "--device")?,
        None => Device::pick()?,
    };
    let (train, test) = load()?;
    println!(
        "device: {device}; {} training and {} test images",
        train.len(),
        test.len()
    );

    let store = ParamStore::new(&device);
    let model = mlp(&store, &mut Generator::new(0))?;
    let mut opt = AdamW::new(&store, 3e-3)?;
    let steps_per_epoch = train.len().div_ceil(BATCH);
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
        for batch in PrefetchLoader::new(batches(&train, epoch as u64), &device)? {
            let (x, y) = split(&batch?)?;
            let loss = model.forward(&x)?.cross_entropy(&y, CrossEntropy::default())?;
            loss.backward()?;
            opt.set_learning_rate(schedule.lr(step));
            opt.step(&store)?;
            store.zero_grad();
            total = total.add(&loss.detach())?;
            step += 1;
        }
        if epoch % 10 == 9 || epoch + 1 == epochs {
            let mean = total.item::<f32>()? / steps_per_epoch as f32; // one read per epoch
            println!("epoch {:>3}: mean training loss {mean:.4}", epoch + 1);
        }
    }

    store.eval();
    let hits = correct(&model, &test, &device)?;
    let accuracy = hits as f64 / test.len() as f64;
    println!(
        "test accuracy: {:.2}% ({} parameters)",
        100.0 * accuracy,
        store.num_params()
    );
    anyhow::ensure!(accuracy >= 0.95, "test accuracy {:.2}% is below 95%", 100.0 * accuracy);

    if let Some(path) = flag("--save") {
        // PyTorch's `save_file(model.state_dict(), path)`, then a strict `load_state_dict`.
        store.save_state_dict(&path)?;
        let fresh = ParamStore::new(&device);
        let reloaded = mlp(&fresh, &mut Generator::new(1))?;
        fresh.load_state_dict_file(&path, LoadOptions::default())?;
        fresh.eval();
        let again = correct(&reloaded, &test, &device)?;
        println!(
            "saved the state dict to {path}; reloaded, it classifies {again} of {} test images",
            test.len()
        );
        anyhow::ensure!(
            again == hits,
            "the reloaded model scores {again}, the trained one {hits}"
        );
    }
    Ok(())
}
