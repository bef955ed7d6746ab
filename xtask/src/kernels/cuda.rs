//! `cargo xtask kernels cuda [MODE]`: the CUDA backend's performance figures on `cuda:0`, as
//! `RESULT<TAB>case<TAB>value<TAB>unit` lines that `crates/cartage-cuda/bench/compare.py` joins
//! with `crates/cartage-cuda/bench/torch_bench.py`'s (same case names).
//!
//! Device time comes from CUDA events around each call (median of ≥ 20 after warm-up); host
//! time per call from a loop ended by a synchronisation. Raw-driver baselines (cuLaunchKernel,
//! cuMemcpy from pinned and pageable memory) are measured here too (`suite.rs`). The suite's cold
//! start runs a second process, `kernels cuda --cold-child`, that finds the kernels in the
//! on-disk cache the first one filled (`cold_start.rs`).
//!
//! The other modes time one family each (`families.rs`):
//! - `ops`: the row-wise model ops (layer/RMS norm, softmax, log-softmax, cross-entropy) over
//!   2^26 elements, in GB/s of the bytes each must move (`crates/cartage-cuda/bench/ops_torch.py`
//!   prints the same rows for PyTorch);
//! - `strided`: `contiguous()` of 1 GiB transposed and permuted views, and reading back into a
//!   fresh vector (as `to_vec` does);
//! - `attention`: the fused flash-attention kernels (bf16, f16, f32; B·H = 128, L = S = 1024) in TFLOP/s;
//! - `conv`: `Kernel::Conv2d` (cuDNN) on ResNet-like 3×3 convolutions (batch 32, 64→64 channels,
//!   56×56, padding 1) in f32 (true f32 and TF32), bf16 and f16, and bf16 read from a
//!   channels-last buffer, in TFLOP/s of `2·N·O·OH·OW·C/g·kh·kw`.

mod cold_start;
mod families;
mod suite;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use cartage_core::{Backend, DType, DeviceBuffer, Distribution, Kernel, Layout, TensorArg};
use cartage_cuda::CudaBackend;

use super::{CudaArgs, CudaMode};

/// The backend as core's trait object, which [`DeviceBuffer`] holds.
type Dyn = Arc<dyn Backend>;

const MIB: usize = 1 << 20;

/// Run one mode of `cargo xtask kernels cuda`.
pub fn run(args: CudaArgs) -> Result<()> {
    if args.cold_child {
        return cold_start::cold_child();
    }
    match args.mode {
        CudaMode::Suite => run_suite(args.quick),
        CudaMode::Strided => {
            let (b, d) = open("strided")?;
            families::strided(&d, &b)
        }
        CudaMode::Conv => families::conv(&open("conv")?.1),
        CudaMode::Ops => families::ops(&open("ops")?.1),
        CudaMode::Attention => families::attention(&open("attention")?.1),
    }
}

/// The suite: cold start first (it must open the device itself, in a fresh kernel cache), then
/// tiny ops, matmul, add, reductions and copies.
fn run_suite(quick: bool) -> Result<()> {
    let b = cold_start::cold_start()?;
    eprintln!("kernels cuda suite on {}", b.info());
    let d: Dyn = b.clone();
    suite::tiny_ops(&d, &b)?;
    suite::matmul(&d, quick)?;
    suite::elementwise(&d, quick)?;
    suite::reductions(&d, quick)?;
    suite::copies(&d, &b, quick)
}

/// `cuda:0`, as the backend and as core's trait object, named on stderr with the mode.
fn open(mode: &str) -> Result<(Arc<CudaBackend>, Dyn)> {
    let b = cartage_cuda::open_cuda(0)?;
    eprintln!("kernels cuda {mode} on {}", b.info());
    let d: Dyn = b.clone();
    Ok((b, d))
}

/// One row: `RESULT<TAB>case<TAB>value<TAB>unit` on stdout.
fn result(case: &str, value: f64, unit: &str) {
    println!("RESULT\t{case}\t{value:.4}\t{unit}");
}

/// A contiguous `shape` view of `a` in `dtype`.
fn tensor(a: &DeviceBuffer, shape: &[usize], dtype: DType) -> TensorArg {
    a.arg(Layout::contiguous(shape).expect("layout"), dtype)
}

/// The median of `v` (the upper one of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median device seconds of `f` over `reps` runs after `warmup`.
fn device_time(b: &Dyn, warmup: usize, reps: usize, mut f: impl FnMut()) -> Result<f64> {
    for _ in 0..warmup {
        f();
    }
    b.synchronize()?;
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = b.record_event()?;
        f();
        events.push((start, b.record_event()?));
    }
    let mut times = Vec::with_capacity(reps);
    for (start, end) in &events {
        times.push(b.elapsed(start, end)?.as_secs_f64());
    }
    Ok(median(times))
}

/// Host seconds per call of `f`, over `iters` calls ended by a synchronisation.
fn host_time(b: &Dyn, iters: usize, mut f: impl FnMut()) -> Result<f64> {
    for _ in 0..iters.min(100) {
        f();
    }
    b.synchronize()?;
    let started = Instant::now();
    for _ in 0..iters {
        f();
    }
    b.synchronize()?;
    Ok(started.elapsed().as_secs_f64() / iters as f64)
}

/// Median wall seconds of `f` (which waits for its own completion).
fn wall_time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        f()?;
        times.push(started.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// A fresh buffer of `shape` in `dtype`, filled from N(0, 1) with `seed`.
fn alloc_random(b: &Dyn, shape: &[usize], dtype: DType, seed: u64) -> Result<DeviceBuffer> {
    let n: usize = shape.iter().product();
    let a = DeviceBuffer::new(b, n * dtype.size_in_bytes())?;
    Kernel::Random {
        out: tensor(&a, shape, dtype),
        distribution: Distribution::Normal { mean: 0.0, std: 1.0 },
        seed,
        offset: 0,
    }
    .run(&[&a])?;
    Ok(a)
}
