//! Create at the destination instead of creating on the host and moving (LESSONS R7, R11).
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --example create_at_destination
//! ```
//!
//! Building a tensor on the host and then moving it holds two full copies at once (plus pinned
//! staging); a constructor that takes `&Device` fills memory on the device and never makes a host
//! copy. A combined move + cast picks the order with the lower peak: casting f32 down to f16
//! before the move ships and lands half the bytes.

use cartage::prelude::*;
use cartage::{format_bytes, memory_stats, pinned_bytes_peak, reset_peak_memory_stats};

const ELEMENTS: usize = 8 << 20; // 32 MiB of f32

/// Peak allocated bytes on `device` above what was live when the closure started, and the
/// host bytes the closure reports it held.
fn measure(
    device: &Device,
    run: impl FnOnce() -> cartage::Result<(Tensor, usize)>,
) -> cartage::Result<(Tensor, usize, usize)> {
    reset_peak_memory_stats(device)?;
    let base = memory_stats(device)?.allocated_bytes;
    let (tensor, host_bytes) = run()?;
    cartage::synchronize(device)?;
    let peak = memory_stats(device)?.peak_allocated_bytes - base;
    Ok((tensor, peak, host_bytes))
}

fn report(what: &str, device_peak: usize, host_bytes: usize) {
    println!(
        "  {what:<44} device peak {:>10}   host copies {:>10}",
        format_bytes(device_peak as u64),
        format_bytes(host_bytes as u64)
    );
}

fn compare(device: &Device, host: &Device) -> cartage::Result<()> {
    println!("{ELEMENTS} f32 values onto {device}:");
    let (on_device, peak, host_bytes) = measure(device, || Ok((Tensor::rand(&[ELEMENTS], DType::F32, 7, device)?, 0)))?;
    report("Tensor::rand(.., &device)", peak, host_bytes);
    drop(on_device);

    let pinned_before = pinned_bytes_peak();
    let (moved, peak, host_bytes) = measure(device, || {
        let values: Vec<f32> = (0..ELEMENTS).map(|i| (i % 1000) as f32 / 1000.0).collect();
        let on_host = Tensor::from_slice(&values, &[ELEMENTS], host)?;
        let held = values.len() * 4 + on_host.size_in_bytes();
        let moved = on_host.to(device)?;
        Ok((moved, held))
    })?;
    report("Vec -> Tensor on the host -> .to(&device)", peak, host_bytes);
    println!(
        "  (host path: the Vec and the host tensor are both alive during the move; pinned staging peak rose by {})",
        format_bytes(pinned_bytes_peak().saturating_sub(pinned_before))
    );
    drop(moved);

    println!("\nf32 on the host to f16 on {device} (R11):");
    let source = Tensor::rand(&[ELEMENTS], DType::F32, 9, host)?;
    let (combined, peak, _) = measure(device, || Ok((source.to_device_dtype(device, DType::F16)?, 0)))?;
    report("to_device_dtype(&device, F16): cast, then move", peak, 0);
    drop(combined);
    let (two_steps, peak, _) = measure(device, || Ok((source.to(device)?.to_dtype(DType::F16)?, 0)))?;
    report(".to(&device) then .to_dtype(F16)", peak, 0);
    drop(two_steps);
    if device == host {
        println!("  (on the CPU host and device share one allocator, so both paths count the same memory)");
    }
    Ok(())
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let device = Device::pick()?;
    let host = Device::cpu();
    compare(&device, &host)?;
    Ok(())
}
