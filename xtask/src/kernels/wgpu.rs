//! `cargo xtask kernels wgpu [MODE]`: the wgpu backend's kernel timings on `wgpu:0`, printed as a
//! table and as JSON lines; `crates/cartage-wgpu/bench/torch_bench.py` prints PyTorch's for the
//! same ops and sizes.
//!
//! - `suite` (`suite.rs`): element-wise add (GB/s), sum (GB/s), matmul (TFLOP/s, per tiling
//!   after tuning), a chain of small ops between two syncs (µs per op, end to end on the host
//!   clock), and the read-back round trip (µs).
//! - `half` (`half.rs`): f16/bf16 add and copy (f16 native and packed, one or four groups per
//!   invocation), f16/bf16/f32 matmul (f16 on cooperative matrices and tiled), and 256 MiB copies
//!   host↔device from pinned and pageable memory (GB/s).
//! - `matmul-sweep` (`sweep.rs`): every matmul variant (`WgpuBackend::matmul_variant_names`) for
//!   f16, f32 and bf16 at n = 1024, 2048 and 4096 and on a [4096, 512] × [512, 4096] product,
//!   each checked against an f64 product on the host on sampled rows: one JSON line per variant
//!   and problem.
//! - `gpt-profile` (`gpt_profile.rs`): one training step of the benchmark's GPT, per op, dtype
//!   and operand shapes, from the backend's op profile (`--dtype bf16` for bf16 autocast).
//!
//! Device-side figures use timestamp queries where the adapter has them (else the host clock
//! after a synchronisation); each row is the median of `--reps` runs after warm-up.

mod gpt_profile;
mod half;
mod suite;
mod sweep;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cartage_core::{Backend, DType, DeviceBuffer, Distribution, Kernel, Layout, TensorArg};
use cartage_wgpu::WgpuBackend;

use super::{WgpuArgs, WgpuMode};

/// One printed row, kept for the suite's closing JSON lines.
struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    median: Duration,
}

/// `wgpu:0` and the rows printed so far.
struct Bench {
    backend: Arc<WgpuBackend>,
    /// The same backend as a trait object, which device buffers hold.
    device: Arc<dyn Backend>,
    /// Timed runs per row.
    reps: usize,
    /// The adapter's name with spaces as underscores, the middle part of every row name.
    device_name: String,
    rows: Vec<Row>,
}

/// The median of `times` (the upper one of an even count).
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

impl Bench {
    /// A contiguous f32 tensor of `shape`, uniform in [-1, 1).
    fn tensor(&self, shape: &[usize]) -> Result<(DeviceBuffer, TensorArg)> {
        self.tensor_of(shape, DType::F32)
    }

    /// A contiguous tensor of `shape` in `dtype`, uniform in [-1, 1).
    fn tensor_of(&self, shape: &[usize], dtype: DType) -> Result<(DeviceBuffer, TensorArg)> {
        let layout = Layout::contiguous(shape)?;
        let buffer = DeviceBuffer::new(&self.device, layout.numel() * dtype.size_in_bytes())?;
        let arg = buffer.arg(layout, dtype);
        Kernel::Random {
            out: arg.clone(),
            distribution: Distribution::Uniform { low: -1.0, high: 1.0 },
            seed: 7,
            offset: 0,
        }
        .run(&[&buffer])?;
        Ok((buffer, arg))
    }

    /// Device time of `f` (median of `reps` after 3 warm-ups).
    fn time(&self, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
        for _ in 0..3 {
            f()?;
        }
        self.backend.synchronize()?;
        let mut times = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let start = self.backend.record_event()?;
            f()?;
            let end = self.backend.record_event()?;
            times.push(self.backend.elapsed(&start, &end)?);
        }
        Ok(median(times))
    }

    /// Print one row (`wgpu/<device>/<op>`, value, unit, median) and keep it.
    fn push(&mut self, op: &str, value: f64, unit: &'static str, median: Duration) {
        let name = format!("wgpu/{}/{op}", self.device_name);
        println!("{name:<60} {value:>10.3} {unit:<8} (median {median:?})");
        self.rows.push(Row {
            name,
            value,
            unit,
            median,
        });
    }
}

/// Run one mode of `cargo xtask kernels wgpu`.
pub fn run(args: WgpuArgs) -> Result<()> {
    let sweep = args.mode == WgpuMode::MatmulSweep;
    let reps = args.reps.unwrap_or(if args.quick || sweep { 10 } else { 20 });
    let backend = cartage_wgpu::open_wgpu(0).context("opening wgpu:0")?;
    let info = backend.info();
    let timing = if backend.capabilities().device_timing {
        "timestamp queries"
    } else {
        "host clock after synchronisation"
    };
    println!("# {} — {}; timing: {timing}; median of {reps}", info.device, info.name);
    let device: Arc<dyn Backend> = backend.clone();
    let mut bench = Bench {
        backend,
        device,
        reps,
        device_name: info.name.replace(' ', "_"),
        rows: Vec::new(),
    };
    match args.mode {
        WgpuMode::Suite => suite::run(&mut bench, args.quick),
        WgpuMode::Half => half::run(&mut bench, args.quick),
        WgpuMode::MatmulSweep => sweep::run(&bench, args.dtype.as_deref(), args.variant.as_deref()),
        WgpuMode::GptProfile => {
            let autocast = match args.dtype.as_deref() {
                None | Some("f32") => false,
                Some("bf16") => true,
                Some(other) => anyhow::bail!("gpt-profile: `--dtype {other}`: expected f32 or bf16 (autocast)"),
            };
            gpt_profile::run(&bench.backend, autocast, args.quick, args.reps.unwrap_or(3))
        }
    }
}
