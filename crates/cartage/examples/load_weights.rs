//! Write a safetensors file, then load it straight onto the picked device (LESSONS R2, R18, R19).
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --example load_weights [FILE]
//! ```
//!
//! Loading streams each tensor from the file through a pinned staging buffer into memory on the
//! target device (PyTorch's `map_location`): no second host copy of the file, no detour through
//! another device. One log line reports device, dtypes and parameter count. Before loading, the
//! training-memory estimate says whether training this model would fit the device.

use std::path::PathBuf;

use cartage::memory::{Optimizer, TrainingEstimate};
use cartage::prelude::*;
use cartage::{Epilogue, load_safetensors, save_safetensors};

/// A small model's weights, created on `device`: two f32 layers (weights `[out, in]`, as PyTorch
/// and `cartage_nn::layers::Linear` store them), a bf16 embedding, an i64 vocabulary index and a
/// bool mask.
fn build_model(device: &Device) -> cartage::Result<Vec<(String, Tensor)>> {
    Ok(vec![
        (
            "embed.weight".into(),
            Tensor::randn(&[1000, 64], DType::F32, 1, device)?.to_dtype(DType::BF16)?,
        ),
        ("fc1.weight".into(), Tensor::randn(&[256, 64], DType::F32, 2, device)?),
        ("fc1.bias".into(), Tensor::zeros(&[256], DType::F32, device)?),
        ("fc2.weight".into(), Tensor::randn(&[10, 256], DType::F32, 3, device)?),
        ("fc2.bias".into(), Tensor::zeros(&[10], DType::F32, device)?),
        (
            "vocab.ids".into(),
            Tensor::arange(0.0, 1000.0, 1.0, DType::I64, device)?,
        ),
        ("mask".into(), Tensor::ones(&[64], DType::Bool, device)?),
    ])
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let device = Device::pick()?;
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cartage-example.safetensors"));

    // Write the file from the CPU (any device can save).
    let model = build_model(&Device::cpu())?;
    let named: Vec<(&str, &Tensor)> = model.iter().map(|(n, t)| (n.as_str(), t)).collect();
    save_safetensors(&path, &named)?;
    println!("wrote {} ({} bytes)", path.display(), std::fs::metadata(&path)?.len());

    // Capacity first: would training these parameters with Adam fit?
    let shapes: Vec<&[usize]> = model.iter().map(|(_, t)| t.shape()).collect();
    let estimate = TrainingEstimate::for_shapes(&shapes, DType::F32, Optimizer::Adam)?;
    println!("estimate: {estimate}");
    match estimate.check(&device) {
        Ok(fit) => println!("          {fit}"),
        Err(why) => println!("          (no fit check: {why})"),
    }

    // Load straight onto the device.
    let weights = load_safetensors(&path, &device)?;
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    for name in names {
        let t = &weights[name];
        println!("  {name:<14} {:?} {} on {}", t.shape(), t.dtype(), t.device());
    }
    let x = Tensor::randn(&[4, 64], DType::F32, 9, &device)?;
    // y = x·Wᵀ + b, with the activation fused where the backend can.
    let hidden = x.linear(&weights["fc1.weight"], Some(&weights["fc1.bias"]), Epilogue::Relu)?;
    let logits = hidden.linear(&weights["fc2.weight"], Some(&weights["fc2.bias"]), Epilogue::Identity)?;
    println!("forward pass on {device}: logits {:?}", logits.shape());
    Ok(())
}
