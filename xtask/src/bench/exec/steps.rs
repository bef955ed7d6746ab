//! Step loops: reading the loss back every step against accumulating it on the device (R5), and
//! `empty_cache` every step against keeping the cache (R21). Each also counts what it costs in
//! one extra, untimed pass: host syncs, or segment allocations.

use std::collections::BTreeMap;

use cartage::bench::Bench;
use cartage::{DType, Device, Result, Tensor};

use super::Outcome;

/// One pass of the training-like loop: `loss = sum(x × w)` per step.
fn loss_pass(x: &Tensor, w: &Tensor, steps: usize, read_every_step: bool) -> Result<f32> {
    if read_every_step {
        let mut total = 0.0f32;
        for _ in 0..steps {
            let loss = x.matmul(w)?.sum_all()?;
            total += loss.item::<f32>()?;
        }
        Ok(total)
    } else {
        let mut total = Tensor::zeros(&[], DType::F32, &x.device())?;
        for _ in 0..steps {
            let loss = x.matmul(w)?.sum_all()?;
            total = total.add(&loss)?;
        }
        total.item::<f32>()
    }
}

/// The loss loop, timed, with the host syncs of one pass.
pub fn loss_loop(steps: usize, n: usize, read_every_step: bool, device: &Device, bench: &Bench) -> Result<Outcome> {
    let x = super::random(&[n, n], DType::F32, 6, device)?;
    let w = super::random(&[n, n], DType::F32, 7, device)?.mul_scalar(1.0 / n as f64)?;
    let measurement = bench.run_on(device, || loss_pass(&x, &w, steps, read_every_step).map(drop))?;
    cartage::reset_stats();
    loss_pass(&x, &w, steps, read_every_step)?;
    let syncs = cartage::stats().host_syncs;
    Ok(Outcome {
        measurement,
        counters: BTreeMap::from([("host_syncs".to_string(), syncs as f64)]),
        memory_curve: Vec::new(),
        implementation: None,
    })
}

/// One pass of the allocation loop: temporaries of mixed sizes each step.
fn alloc_pass(steps: usize, numel: usize, empty_cache: bool, device: &Device) -> Result<()> {
    for step in 0..steps {
        let a = Tensor::full(&[numel], 1.0, DType::F32, device)?;
        let b = Tensor::full(&[numel / 3 + 129 * (step % 4)], 2.0, DType::F32, device)?;
        let c = a.narrow(0, 0, b.numel())?.add(&b)?;
        drop((a, b, c));
        if empty_cache {
            cartage::empty_cache(device)?;
        }
    }
    Ok(())
}

/// The allocation loop, timed, with the segment allocations per step of one pass.
pub fn alloc_loop(steps: usize, numel: usize, empty_cache: bool, device: &Device, bench: &Bench) -> Result<Outcome> {
    let measurement = bench.run_on(device, || alloc_pass(steps, numel, empty_cache, device))?;
    let before = cartage::memory_stats(device)?;
    alloc_pass(steps, numel, empty_cache, device)?;
    let after = cartage::memory_stats(device)?;
    let per_step = (after.segment_allocs - before.segment_allocs) as f64 / steps.max(1) as f64;
    Ok(Outcome {
        measurement,
        counters: BTreeMap::from([
            ("segment_allocs_per_step".to_string(), per_step),
            ("reserved_bytes_after".to_string(), after.reserved_bytes as f64),
        ]),
        memory_curve: Vec::new(),
        implementation: None,
    })
}
