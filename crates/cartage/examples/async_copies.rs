//! Pinned memory, asynchronous copies and the prefetching loader (LESSONS R9, R10).
//!
//! ```text
//! CARTAGE_DEVICE=cuda:0 cargo run -p cartage --features cuda --release --example async_copies
//! ```
//!
//! An asynchronous copy takes a `PinnedBuffer` (page-locked host memory) and returns a handle that
//! borrows the buffer until `wait()`: writing the buffer while the copy runs does not compile.
//! `PrefetchLoader` uses two such buffers and a worker so that batch N+1 travels while batch N
//! computes; on the CPU it is a plain iterator.

use std::time::{Duration, Instant};

use cartage::loader::{HostBatch, PrefetchLoader};
use cartage::prelude::*;
use cartage::{Element, alloc_staging, format_bytes, pinned_bytes_in_use, synchronize};

const ROWS: usize = 256;
const COLS: usize = 1024;
const BATCHES: usize = 16;

fn pinned_round_trip(device: &Device) -> anyhow::Result<()> {
    let bytes = ROWS * COLS * 4;
    let mut pinned = alloc_staging(device, bytes)?; // pinned where the driver can lock memory
    for (i, chunk) in pinned.as_mut_slice().chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as f32).to_le_bytes());
    }
    println!("pinned host memory in use: {}", format_bytes(pinned_bytes_in_use()));

    let on_device = Tensor::empty(&[ROWS, COLS], DType::F32, device)?;
    let copy = on_device.copy_from_pinned_async(&pinned)?;
    // pinned.as_mut_slice()[0] = 1;  // would not compile: `pinned` is borrowed by the copy in flight
    let busy = copy.is_done();
    copy.wait()?;
    println!(
        "host -> {device}: asynchronous copy of {} (done at once: {busy})",
        format_bytes(bytes as u64)
    );

    let doubled = on_device.mul_scalar(2.0)?;
    let mut back = alloc_staging(device, bytes)?;
    doubled.copy_to_pinned_async(&mut back)?.wait()?;
    let last = f32::from_le_bytes(back.as_slice()[bytes - 4..].try_into()?);
    println!(
        "{device} -> host: asynchronous copy back, last element {last} (expected {})",
        2.0 * (ROWS * COLS - 1) as f32
    );
    Ok(())
}

/// The host side of a data pipeline: batches made on the CPU.
fn host_batches() -> impl Iterator<Item = HostBatch> + Send + 'static {
    (0..BATCHES).map(|b| {
        HostBatch::new(
            (0..ROWS * COLS).map(|i| ((b + i) % 97) as f32 / 97.0).collect(),
            &[ROWS, COLS],
        )
    })
}

/// The "model": one matmul and a reduction per batch, accumulated on the device.
fn train(device: &Device, batches: impl Iterator<Item = cartage::Result<Tensor>>) -> anyhow::Result<(f32, Duration)> {
    let weights = Tensor::randn(&[COLS, 64], DType::F32, 3, device)?;
    let mut total = Tensor::zeros(&[], DType::F32, device)?;
    let start = Instant::now();
    for batch in batches {
        let activations = batch?.matmul(&weights)?;
        total = total.add(&activations.mean_all()?)?;
    }
    let value = total.item::<f32>()?;
    synchronize(device)?;
    Ok((value, start.elapsed()))
}

// cartage: device-entry
fn main() -> anyhow::Result<()> {
    let device = Device::pick()?;
    println!("device: {device}\n");
    pinned_round_trip(&device)?;

    println!("\n{BATCHES} batches of {ROWS}x{COLS} f32, one matmul each:");
    let serial = host_batches().map(|b| Tensor::from_slice(&f32::from_le_bytes_slice(b.bytes()), b.shape(), &device));
    let (serial_total, serial_time) = train(&device, serial)?;
    println!("  serial (copy, then compute):      {serial_time:>10.2?}  total {serial_total:.3}");

    let loader = PrefetchLoader::new(host_batches(), &device)?;
    let pipelined = loader.is_pipelined();
    let (loaded_total, loaded_time) = train(&device, loader)?;
    println!("  PrefetchLoader (pipelined: {pipelined:<5}): {loaded_time:>10.2?}  total {loaded_total:.3}");
    if !pipelined {
        println!("  (on {device} the loader is a plain iterator: there is no copy to overlap)");
    }
    println!(
        "pinned host memory in use at the end: {}",
        format_bytes(pinned_bytes_in_use())
    );
    Ok(())
}
