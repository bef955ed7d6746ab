//! LESSONS R25 on a real model: the same training run in f32, under bf16 autocast, and under
//! f16 autocast with a `GradScaler`: peak memory, time per step and final loss of each.
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run --release -p cartage-nn --features cuda --example mixed_precision
//! ```
//!
//! Master weights stay f32 in every mode; autocast runs the matmuls in half precision and the
//! loss in f32. On a GPU with tensor cores the half modes are faster and hold less; on the CPU
//! the casts cost more than they save, which the table shows too.

use std::time::Instant;

use cartage::prelude::*;
use cartage::{CrossEntropy, autocast_with, memory_stats, reset_peak_memory_stats, synchronize};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::AdamW;
use cartage_nn::{GradScaler, Module, ParamStore};

#[derive(Clone, Copy, Debug)]
enum Mode {
    F32,
    Bf16,
    F16Scaled,
}

fn run(device: &Device, mode: Mode, steps: usize, width: usize) -> anyhow::Result<(f64, f64, f32)> {
    let store = ParamStore::new(device);
    let mut rng = Generator::new(0);
    let model = Sequential::new()
        .push(Linear::new(&store.root().sub("0"), width, width, true, &mut rng)?)
        .push(Activation::Gelu)
        .push(Linear::new(&store.root().sub("2"), width, width, true, &mut rng)?)
        .push(Activation::Gelu)
        .push(Linear::new(&store.root().sub("4"), width, 10, true, &mut rng)?);
    let mut opt = AdamW::new(&store, 1e-3)?;
    let mut scaler = GradScaler::new();
    let x = Tensor::randn(&[512, width], DType::F32, 1, device)?;
    let y = x.narrow(1, 0, 10)?.argmax(1, false)?; // a learnable labelling
    synchronize(device)?;
    reset_peak_memory_stats(device)?;
    let base = memory_stats(device)?.allocated_bytes;
    let start = Instant::now();
    let mut last = Tensor::zeros(&[], DType::F32, device)?;
    let (half, enabled) = match mode {
        Mode::F32 => (DType::BF16, false),
        Mode::Bf16 => (DType::BF16, true),
        Mode::F16Scaled => (DType::F16, true),
    };
    for _ in 0..steps {
        let loss = {
            // PyTorch's `autocast(device, dtype, enabled=...)`: one code path for every mode.
            let _ac = autocast_with(device, half, enabled)?;
            model.forward(&x)?.cross_entropy(&y, CrossEntropy::default())?
        };
        match mode {
            Mode::F16Scaled => {
                scaler.scale(&loss)?.backward()?;
                scaler.step(&mut opt, &store)?;
                scaler.update();
            }
            _ => {
                loss.backward()?;
                cartage_nn::optim::Optimizer::step(&mut opt, &store)?;
            }
        }
        store.zero_grad();
        last = loss.detach();
    }
    synchronize(device)?;
    let per_step = start.elapsed().as_secs_f64() / steps as f64;
    let peak = memory_stats(device)?.peak_allocated_bytes.saturating_sub(base) as f64;
    Ok((per_step, peak, last.item::<f32>()?))
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let device = Device::pick()?;
    let steps: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(100);
    let width = if device.is_cpu() { 256 } else { 2048 };
    println!("device: {device}; MLP width {width}, batch 512, {steps} AdamW steps per mode\n");
    println!("| mode | time per step | peak memory above the start | final loss |");
    println!("| --- | --- | --- | --- |");
    for mode in [Mode::F32, Mode::Bf16, Mode::F16Scaled] {
        let (time, peak, loss) = run(&device, mode, steps, width)?;
        println!(
            "| {mode:?} | {:.3} ms | {} | {loss:.4} |",
            time * 1e3,
            cartage::format_bytes(peak as u64)
        );
    }
    Ok(())
}
