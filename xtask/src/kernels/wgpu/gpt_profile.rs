//! `cargo xtask kernels wgpu gpt-profile`: where one training step of the benchmark's GPT
//! (6 layers, width 384, 6 heads, context 256, batch 64, AdamW) spends its device time on
//! `wgpu:0`, per op, dtype and operand shapes, from the backend's op profile (a timestamp
//! pair around every launch).
//!
//! It prints the step's time without profiling (host clock between two synchronisations), the
//! profiled kernels' sum, then the labels that took the most time, per step.

use std::time::Instant;

use anyhow::{Context, Result};
use cartage::Device;
use cartage_nn::models::GptConfig;
use cartage_nn::optim::Optimizer;
use cartage_wgpu::WgpuBackend;

use crate::gpt_fixture::GptFixture;

/// Rows of the printed table.
const TOP: usize = 40;

/// Profile `steps` steps (after two warm ones), under bf16 autocast when `autocast`; `quick`
/// shrinks the model for a smoke run.
pub fn run(backend: &WgpuBackend, autocast: bool, quick: bool, steps: usize) -> Result<()> {
    let device = Device::wgpu(0);
    let (config, batch) = if quick {
        let config = GptConfig::new(128, 64, 64, 4, 2);
        (config, 8)
    } else {
        let config = GptConfig::new(128, 256, 384, 6, 6);
        (config, 64)
    };
    let GptConfig {
        context,
        dim,
        heads,
        layers,
        ..
    } = config;
    let mut gpt = GptFixture::new(config, batch, &device)?;
    let mut step = || -> cartage::Result<()> {
        let loss = gpt.loss(autocast)?;
        loss.backward()?;
        gpt.opt.step(&gpt.store)?;
        gpt.store.zero_grad();
        Ok(())
    };
    for _ in 0..2 {
        step()?;
    }
    cartage::synchronize(&device)?;
    let started = Instant::now();
    for _ in 0..steps {
        step()?;
    }
    cartage::synchronize(&device)?;
    let unprofiled = started.elapsed().as_secs_f64() / steps as f64;

    backend.start_op_profile().context("starting the op profile")?;
    for _ in 0..steps {
        step()?;
    }
    let rows = backend.finish_op_profile().context("reading the op profile")?;
    let per_step = |seconds: f64| seconds * 1e3 / steps as f64;
    let profiled: f64 = rows.iter().map(|r| r.total.as_secs_f64()).sum();
    println!(
        "# GPT step on {device} ({layers} layers, width {dim}, {heads} heads, context {context}, batch {batch}, {}): \
         {:.2} ms per step unprofiled, {:.2} ms of kernels per step profiled, {} labels",
        if autocast { "bf16 autocast" } else { "f32" },
        unprofiled * 1e3,
        per_step(profiled),
        rows.len()
    );
    println!(
        "{:>10} {:>6} {:>7}  op dtype [operand shapes] (* strided)",
        "ms/step", "share", "calls"
    );
    for row in rows.iter().take(TOP) {
        let seconds = row.total.as_secs_f64();
        println!(
            "{:>10.3} {:>5.1}% {:>7.1}  {}",
            per_step(seconds),
            100.0 * seconds / profiled.max(f64::MIN_POSITIVE),
            row.calls as f64 / steps as f64,
            row.label
        );
    }
    Ok(())
}
