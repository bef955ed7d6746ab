//! Pick the device once, at the entry point, and pass it down (LESSONS R6, R14, R15).
//!
//! ```text
//! cargo run -p cartage --example pick_device
//! CARTAGE_DEVICE=cpu cargo run -p cartage --example pick_device
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --example pick_device
//! ```
//!
//! `Device::pick()` reads `CARTAGE_DEVICE` (the only place that does), else takes the best device
//! this machine has (`cuda:0`, then a hardware `wgpu:0`, then the CPU). Everything below `main`
//! takes `&Device`: the same code runs on a laptop, a GPU server and a machine without a GPU.

use cartage::prelude::*;
use cartage::runtime::pick_from;

/// Everything the program does, on whichever device it is given.
fn train_step(device: &Device) -> cartage::Result<f32> {
    let inputs = Tensor::randn(&[64, 128], DType::F32, 1, device)?;
    let weights = Tensor::randn(&[128, 10], DType::F32, 2, device)?;
    let logits = inputs.matmul(&weights)?;
    let loss = logits.mul(&logits)?.mean_all()?;
    loss.item::<f32>()
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    println!("devices this build can open:");
    for info in cartage::devices() {
        println!("  {info}");
    }

    // The one place the device is chosen.
    let device = Device::pick()?;
    println!("\npicked {device} (from CARTAGE_DEVICE when it is set, else the best device found)");

    // ... and passed down as a value.
    let loss = train_step(&device)?;
    println!("one step on {device}: loss {loss:.4}");

    // What a wrong setting gives: a typed error at the entry, not a crash deep inside.
    println!("\nwhat CARTAGE_DEVICE values would give:");
    for setting in ["cuda", "cuda:7", "tpu:0"] {
        match pick_from(Some(setting)) {
            Ok(d) => println!("  {setting:>7} -> {d}"),
            Err(e) => println!("  {setting:>7} -> error: {e}"),
        }
    }
    Ok(())
}
