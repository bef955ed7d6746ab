//! A planted leak caught by `MemoryTracker`, then the fix (LESSONS R5, R20, R21, R23).
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --example memory_leak [OUT_DIR]
//! ```
//!
//! The leak of R23 (docs/LESSONS.md): every step's loss kept in a list with its whole graph (the weights
//! are a `Var`, so each loss records the ops that made it and holds the batch and activations
//! they saved), and read back with `.item()` every step. Allocated memory grows step after step;
//! the tracker fits a line over the last steps, flags it and says the autograd graph is what
//! grows. The fix accumulates `loss.detach()` on the device and reads once at the end: allocated
//! memory stays flat and the host syncs once. The curves are written as
//! SVG files to OUT_DIR (default: the system's temporary folder).

use std::path::PathBuf;

use cartage::memory::{MemoryTracker, memory_summary};
use cartage::prelude::*;
use cartage::{reset_stats, stats};

const STEPS: u64 = 48;

/// One step of a toy regression: a batch, a prediction, a loss on the device.
fn step_loss(device: &Device, weights: &Tensor, step: u64) -> cartage::Result<Tensor> {
    let inputs = Tensor::randn(&[256, 64], DType::F32, step, device)?;
    let error = inputs.matmul(weights)?.sub_scalar(1.0)?;
    error.mul(&error)?.mean_all()
}

fn leaky(device: &Device, weights: &Tensor, svg: &PathBuf) -> anyhow::Result<()> {
    let mut tracker = MemoryTracker::new(device);
    let mut losses = Vec::new(); // the leak: every step's loss is kept
    let mut printed = 0.0;
    for step in 0..STEPS {
        let loss = step_loss(device, weights, step)?;
        printed = loss.item::<f32>()?; // and a host sync every step
        losses.push(loss); // with its graph
        tracker.record()?;
    }
    let check = tracker.leak_check().expect("a full window");
    println!(
        "leaky loop (keeps {} losses, last {printed:.4}):\n  {check}",
        losses.len()
    );
    tracker.write_svg(svg)?;
    println!("  curve: {}", svg.display());
    Ok(())
}

fn fixed(device: &Device, weights: &Tensor, svg: &PathBuf) -> anyhow::Result<()> {
    let mut tracker = MemoryTracker::new(device);
    let mut total = Tensor::zeros(&[], DType::F32, device)?;
    for step in 0..STEPS {
        let loss = step_loss(device, weights, step)?;
        total = total.add(&loss.detach())?; // accumulate on the device, without the graph
        tracker.record()?;
    }
    let mean = total.item::<f32>()? / STEPS as f32; // read once
    let check = tracker.leak_check().expect("a full window");
    println!("fixed loop (accumulates on the device, mean loss {mean:.4}):\n  {check}");
    tracker.write_svg(svg)?;
    println!("  curve: {}", svg.display());
    Ok(())
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let device = Device::pick()?;
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&out)?;
    println!("device: {device}\n");
    // A leaf that gradients are computed for (PyTorch's `requires_grad_()`).
    let weights = Tensor::randn(&[64, 1], DType::F32, 0, &device)?.requires_grad_()?;

    reset_stats();
    leaky(&device, &weights, &out.join("cartage-leak.svg"))?;
    let syncs_leaky = stats().host_syncs;
    reset_stats();
    fixed(&device, &weights, &out.join("cartage-fixed.svg"))?;
    let syncs_fixed = stats().host_syncs;
    println!("\nhost syncs: leaky loop {syncs_leaky}, fixed loop {syncs_fixed}");

    println!("\n{}", memory_summary(&device)?);
    let released = cartage::empty_cache(&device)?;
    println!(
        "empty_cache() returned {} of cached free segments to {device} (between phases, not every step: R21)",
        cartage::format_bytes(released as u64)
    );
    Ok(())
}
