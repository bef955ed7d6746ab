//! Pick the device once, at the entry point, and pass it down (LESSONS R6, R14, R15).
//!
//! ```text
//! cargo run -p cartage --example pick_device
//! CARTAGE_DEVICE=cpu cargo run -p cartage --example pick_device
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --example pick_device
//! cargo run -p cartage --example pick_device -- --device cpu
//! ```
//!
//! `Device::pick()` reads `CARTAGE_DEVICE` (the only place that does), else takes the best device
//! this machine has (`cuda:0`, then a hardware `wgpu:0`, then the CPU); a `--device` flag goes
//! through `runtime::pick_named`, whose errors name the flag. Everything below `main` takes
//! `&Device`: the same code runs on a laptop, a GPU server and a machine without a GPU.

use cartage::prelude::*;
use cartage::runtime::pick_named;

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

    // The one place the device is chosen: the flag, else CARTAGE_DEVICE, else the best found.
    let flag = std::env::args().skip_while(|a| a != "--device").nth(1);
    let device = match flag {
        Some(value) => pick_named(Some(&value), "--device")?,
        None => Device::pick()?,
    };
    println!("\npicked {device} (from --device, else CARTAGE_DEVICE when it is set, else the best device found)");

    // ... and passed down as a value.
    let loss = train_step(&device)?;
    println!("one step on {device}: loss {loss:.4}");

    // What a wrong setting gives: a typed error at the entry, not a crash deep inside.
    println!("\nwhat --device values would give:");
    for setting in ["cuda", "cuda:7", "tpu:0"] {
        match pick_named(Some(setting), "--device") {
            Ok(d) => println!("  {setting:>7} -> {d}"),
            Err(e) => println!("  {setting:>7} -> error: {e}"),
        }
    }

    // A device named in code opens on its first op; `ensure` moves that check to the entry.
    println!("\nwhat opening devices named in code gives (`Device::ensure`):");
    for named in [Device::cuda(0), Device::wgpu(0)] {
        match named.ensure() {
            Ok(()) => println!("  {:>7} -> opens", named.to_string()),
            Err(e) => println!("  {:>7} -> error: {e}", named.to_string()),
        }
    }
    Ok(())
}
