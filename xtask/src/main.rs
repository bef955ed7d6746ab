//! `cargo xtask`: cartage's developer commands.
//!
//! - `bench`: the cross-backend benchmark report (the README's main job).
//! - `devices`: every device found, with its capabilities.
//! - `docs [--check]`: writes the figures README.md and docs/GUIDE.md quote from the committed reports.
//! - `kernels cuda|wgpu [MODE]`: one backend's kernel timings as plain rows, beside its raw-API
//!   baselines and tuning knobs (`kernels cuda [suite|strided|conv|ops|attention]`,
//!   `kernels wgpu [suite|half|matmul-sweep]`).
//! - `launch --nproc N -- <program>`: N local ranks of a program, with torchrun's variables.
//! - `lint-devices [PATH]`: hard-coded device literals outside the entry point (R17).
//! - `ops-table`: writes `docs/OPS.md`, every op × backend × dtype from the capabilities.
//! - `ptx [--check]`: compiles the CUDA kernels to PTX beside their sources.

mod bench;
mod devices;
mod docs;
mod gpt_fixture;
mod kernels;
mod launch;
mod lint_devices;
mod ops_table;
#[cfg(feature = "cuda")]
mod ptx;

use clap::{Parser, Subcommand};

/// cartage developer commands.
#[derive(Parser)]
#[command(name = "cargo xtask", about = "cartage developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmark report on every device found.
    Bench(bench::BenchArgs),
    /// Render a report again from its report.json (no measuring).
    Report(bench::RenderArgs),
    /// List devices with their capabilities.
    Devices,
    /// Write the figures README.md and docs/GUIDE.md quote from the committed reports.
    Docs(docs::DocsArgs),
    /// Time one backend's kernels directly, as plain rows (`kernels cuda|wgpu [MODE]`).
    Kernels(kernels::KernelsArgs),
    /// Start N local ranks of a program with torchrun's variables (`-- <program> [args]`).
    Launch(launch::LaunchArgs),
    /// Report hard-coded devices in Rust sources.
    LintDevices(lint_devices::LintArgs),
    /// Write docs/OPS.md: every op × backend × dtype, from the backends' capabilities.
    OpsTable(ops_table::OpsTableArgs),
    /// Compile the CUDA kernels to PTX beside their sources (NVRTC, no GPU needed).
    #[cfg(feature = "cuda")]
    Ptx(ptx::PtxArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Report(args) => bench::render(args),
        Command::Devices => devices::run(),
        Command::Docs(args) => docs::run(args),
        Command::Kernels(args) => kernels::run(args),
        Command::Launch(args) => launch::run(args),
        Command::LintDevices(args) => {
            let findings = lint_devices::run(args)?;
            if findings > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::OpsTable(args) => ops_table::run(args),
        #[cfg(feature = "cuda")]
        Command::Ptx(args) => ptx::run(args),
    }
}
