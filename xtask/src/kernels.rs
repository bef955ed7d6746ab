//! `cargo xtask kernels <backend> [MODE]`: one backend's kernel timings, printed as rows.
//!
//! Where `cargo xtask bench` measures every device through the frontend and writes a report,
//! this harness drives one backend directly (core's `Kernel` values, plus the backend's own
//! tuning knobs and raw-driver baselines) and prints plain rows that the scripts beside each
//! backend join with PyTorch's:
//!
//! - `cargo xtask kernels cuda [suite|strided|conv|ops|attention] [--quick]`: `cuda:0`, as
//!   `RESULT<TAB>case<TAB>value<TAB>unit` lines (`kernels/cuda.rs`).
//! - `cargo xtask kernels wgpu [suite|half|matmul-sweep|gpt-profile] [--quick] [--reps N] [--dtype D]
//!   [--variant NAME]`: `wgpu:0`, as a table and JSON lines (`kernels/wgpu.rs`); `gpt-profile`
//!   prints where a GPT training step's device time goes, per op.
//!
//! Each mode is the same word on both backends where it means the same thing: `suite` (the
//! default) is the backend's headline rows, the others one family each.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "wgpu")]
mod wgpu;

use clap::{Subcommand, ValueEnum};

/// The arguments that start the CUDA suite's second cold-start process (after the program name).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const CUDA_COLD_CHILD_ARGS: [&str; 3] = ["kernels", "cuda", "--cold-child"];

/// Arguments of `cargo xtask kernels`.
#[derive(clap::Args, Debug)]
pub struct KernelsArgs {
    #[command(subcommand)]
    backend: KernelsBackend,
}

/// The backend whose kernels are timed.
#[derive(Subcommand, Debug)]
enum KernelsBackend {
    /// The CUDA backend on cuda:0: tab-separated "RESULT, case, value, unit" lines on stdout
    /// (needs the `cuda` feature, on by default).
    Cuda(CudaArgs),
    /// The wgpu backend on wgpu:0: a table and JSON lines on stdout (needs the `wgpu` feature,
    /// on by default).
    Wgpu(WgpuArgs),
}

/// Arguments of `cargo xtask kernels cuda`.
#[derive(clap::Args, Debug)]
pub struct CudaArgs {
    /// What to time.
    #[arg(value_enum, default_value_t = CudaMode::Suite)]
    mode: CudaMode,
    /// Fewer sizes (the suite only): a smoke run.
    #[arg(long)]
    quick: bool,
    /// The second process of the suite's cold-start measurement (started by the suite itself).
    #[arg(long, hide = true)]
    cold_child: bool,
}

/// The modes of `cargo xtask kernels cuda`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CudaMode {
    /// Cold start and first calls (an empty, then a warm kernel cache), tiny-op overhead against
    /// a raw cuLaunchKernel, matmul (f32, TF32, f16, bf16), add, reductions, and copies against
    /// raw cuMemcpy from pinned and pageable memory.
    Suite,
    /// `contiguous()` of 1 GiB transposed and permuted views, and reads into a fresh vector.
    Strided,
    /// cuDNN conv2d on ResNet-like 3×3 convolutions (f32, TF32, bf16, f16, channels-last bf16).
    Conv,
    /// Row-wise model ops (softmax, log-softmax, layer/RMS norm, cross-entropy) in GB/s.
    Ops,
    /// The fused flash-attention kernel (B·H = 128, L = S = 1024) in TFLOP/s.
    Attention,
}

/// Arguments of `cargo xtask kernels wgpu`.
#[derive(clap::Args, Debug)]
pub struct WgpuArgs {
    /// What to time.
    #[arg(value_enum, default_value_t = WgpuMode::Suite)]
    mode: WgpuMode,
    /// Fewer and smaller sizes (suite and half): a smoke run.
    #[arg(long)]
    quick: bool,
    /// Timed runs per row (the median is printed); 10 with --quick or matmul-sweep, else 20.
    #[arg(long)]
    reps: Option<usize>,
    /// matmul-sweep: only this dtype (f16, f32 or bf16).
    #[arg(long)]
    dtype: Option<String>,
    /// matmul-sweep: only this variant (one of `WgpuBackend::matmul_variant_names`).
    #[arg(long)]
    variant: Option<String>,
}

/// The modes of `cargo xtask kernels wgpu`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum WgpuMode {
    /// f32 add and sum (GB/s), matmul per tiling after tuning (TFLOP/s), a chain of 1000 small
    /// adds between two syncs (µs per op) and the read-back round trip (µs).
    Suite,
    /// f16/bf16 add and copy on every load/store path, f16/bf16/f32 matmul (f16 on cooperative
    /// matrices and tiled), and 256 MiB host↔device copies from pinned and pageable memory.
    Half,
    /// Every matmul variant for f16, f32 and bf16 at n = 1024, 2048, 4096 and [4096, 512] ×
    /// [512, 4096], each checked against an f64 product on sampled rows: one JSON line each.
    MatmulSweep,
    /// One training step of the benchmark's GPT, per op, dtype and operand shapes, from the
    /// backend's op profile (`--dtype bf16`: under bf16 autocast; `--reps`: steps profiled).
    GptProfile,
}

/// Run the chosen backend's mode.
pub fn run(args: KernelsArgs) -> anyhow::Result<()> {
    match args.backend {
        KernelsBackend::Cuda(args) => run_cuda(args),
        KernelsBackend::Wgpu(args) => run_wgpu(args),
    }
}

#[cfg(feature = "cuda")]
fn run_cuda(args: CudaArgs) -> anyhow::Result<()> {
    cuda::run(args)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: CudaArgs) -> anyhow::Result<()> {
    anyhow::bail!("xtask was built without the `cuda` feature: build it with `--features cuda` (on by default)")
}

#[cfg(feature = "wgpu")]
fn run_wgpu(args: WgpuArgs) -> anyhow::Result<()> {
    wgpu::run(args)
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu(_: WgpuArgs) -> anyhow::Result<()> {
    anyhow::bail!("xtask was built without the `wgpu` feature: build it with `--features wgpu` (on by default)")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        backend: KernelsBackend,
    }

    fn parse(args: &[&str]) -> Result<KernelsBackend, clap::Error> {
        Cli::try_parse_from(std::iter::once("kernels").chain(args.iter().copied())).map(|cli| cli.backend)
    }

    #[test]
    fn modes_default_to_the_suite_and_parse_by_name() {
        let KernelsBackend::Cuda(cuda) = parse(&["cuda"]).unwrap() else {
            panic!("not cuda")
        };
        assert_eq!((cuda.mode, cuda.quick), (CudaMode::Suite, false));
        let KernelsBackend::Cuda(cuda) = parse(&["cuda", "attention"]).unwrap() else {
            panic!("not cuda")
        };
        assert_eq!(cuda.mode, CudaMode::Attention);
        // The arguments the suite's cold start gives its second process.
        assert_eq!(CUDA_COLD_CHILD_ARGS[0], "kernels");
        let KernelsBackend::Cuda(cuda) = parse(&CUDA_COLD_CHILD_ARGS[1..]).unwrap() else {
            panic!("not cuda")
        };
        assert!(cuda.cold_child);
        let KernelsBackend::Wgpu(wgpu) = parse(&[
            "wgpu",
            "matmul-sweep",
            "--reps",
            "3",
            "--dtype",
            "f16",
            "--variant",
            "coop",
        ])
        .unwrap() else {
            panic!("not wgpu")
        };
        assert_eq!(wgpu.mode, WgpuMode::MatmulSweep);
        assert_eq!(wgpu.reps, Some(3));
        assert_eq!(wgpu.dtype.as_deref(), Some("f16"));
        assert_eq!(wgpu.variant.as_deref(), Some("coop"));
        let KernelsBackend::Wgpu(wgpu) = parse(&["wgpu", "half", "--quick"]).unwrap() else {
            panic!("not wgpu")
        };
        assert_eq!((wgpu.mode, wgpu.quick), (WgpuMode::Half, true));
    }

    #[test]
    fn unknown_modes_are_refused() {
        assert!(parse(&["cuda", "sweep"]).is_err());
        assert!(parse(&["wgpu", "conv"]).is_err());
        assert!(parse(&["metal"]).is_err());
    }
}
