//! Peak memory of construction and moves, read from the allocator's statistics:
//! - R7: `zeros`, `full`, `arange`, `rand`, `randn` on a device allocate only their output
//!   there (peak allocated grows by exactly what stays allocated, which is the output);
//! - R11: `to_device_dtype` casts down before a move and up after it, so the destination never
//!   holds the wider intermediate; the naive order is shown to cost more.
//!
//! The tests of this binary share devices, so each takes `SERIAL` before measuring.

mod common;

use std::sync::Mutex;

use cartage::prelude::*;
use cartage::{MemoryStats, memory_stats, reset_peak_memory_stats};

static SERIAL: Mutex<()> = Mutex::new(());

/// Growth of peak allocated, growth of allocated and growth of requested bytes while `f` runs.
fn measure<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, usize, usize, usize)> {
    cartage::synchronize(device)?;
    reset_peak_memory_stats(device)?;
    let before: MemoryStats = memory_stats(device)?;
    let value = f()?;
    cartage::synchronize(device)?;
    let after = memory_stats(device)?;
    Ok((
        value,
        after.peak_allocated_bytes - before.allocated_bytes,
        after.allocated_bytes - before.allocated_bytes,
        after.requested_bytes - before.requested_bytes,
    ))
}

fn constructors_allocate_only_their_output(device: &Device) -> Result<()> {
    let shape = [256, 1024];
    type Build = fn(&[usize], &Device) -> Result<Tensor>;
    let builders: [(&str, Build); 6] = [
        ("zeros", |s, d| Tensor::zeros(s, DType::F32, d)),
        ("full", |s, d| Tensor::full(s, 2.5, DType::F32, d)),
        ("empty", |s, d| Tensor::empty(s, DType::F32, d)),
        ("arange", |s, d| {
            Tensor::arange(0.0, (s[0] * s[1]) as f64, 1.0, DType::F32, d)
        }),
        ("rand", |s, d| Tensor::rand(s, DType::F32, 1, d)),
        ("randn", |s, d| Tensor::randn(s, DType::F32, 1, d)),
    ];
    for (name, build) in builders {
        let (tensor, peak_growth, live_growth, requested_growth) = measure(device, || build(&shape, device))?;
        assert_eq!(tensor.device(), *device);
        assert_eq!(
            requested_growth,
            tensor.size_in_bytes(),
            "{name} on {device}: only the output is live"
        );
        assert_eq!(
            peak_growth, live_growth,
            "{name} on {device}: nothing but the output was allocated on the way (peak +{peak_growth}, live +{live_growth})"
        );
        assert_eq!(tensor.size_in_bytes(), 256 * 1024 * 4);
    }
    Ok(())
}

#[test]
fn construction_on_the_cpu_allocates_only_the_output() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    constructors_allocate_only_their_output(&Device::cpu())
}

#[test]
fn construction_on_a_gpu_allocates_only_the_output() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = common::second_device("construction_on_a_gpu_allocates_only_the_output") else {
        return Ok(());
    };
    constructors_allocate_only_their_output(&device)
}

#[test]
fn to_device_dtype_picks_the_order_with_the_lower_peak() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(gpu) = common::second_device("to_device_dtype_picks_the_order_with_the_lower_peak") else {
        return Ok(());
    };
    let cpu = Device::cpu();
    let n = 1 << 20;
    let wide = Tensor::rand(&[n], DType::F32, 7, &cpu)?;

    // Down-cast on the way to the GPU: only the f16 tensor lands there.
    let (narrow_on_gpu, peak, _, requested) = measure(&gpu, || wide.to_device_dtype(&gpu, DType::F16))?;
    assert_eq!(narrow_on_gpu.dtype(), DType::F16);
    assert_eq!(requested, n * 2);
    assert!(
        peak < n * 4,
        "the f32 tensor must not land on {gpu}: peak grew by {peak} bytes"
    );
    // The naive order moves the f32 tensor first: its peak holds both.
    let (_, naive_peak, _, _) = measure(&gpu, || wide.to(&gpu)?.to_dtype(DType::F16))?;
    assert!(naive_peak >= n * 6, "naive peak {naive_peak}");
    assert!(peak < naive_peak);

    // Up-cast on the way back: the GPU never holds an f32 copy.
    let (back, gpu_peak, _, _) = measure(&gpu, || narrow_on_gpu.to_device_dtype(&cpu, DType::F32))?;
    assert_eq!(back.device(), cpu);
    assert_eq!(gpu_peak, 0, "the up-cast must happen on the CPU, after the move");
    let expected: Vec<f64> = wide.to_dtype(DType::F16)?.to_vec_f64()?;
    assert_eq!(back.to_vec_f64()?, expected);
    Ok(())
}
