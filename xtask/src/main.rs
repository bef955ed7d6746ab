//! `cargo xtask`: cartage's developer commands.
//!
//! - `bench`: the cross-backend benchmark report (the README's main job).
//! - `devices`: every device found, with its capabilities.
//! - `lint-devices [PATH]`: hard-coded device literals outside the entry point (R17).

mod bench;
mod devices;
mod lint_devices;

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
    /// List devices with their capabilities.
    Devices,
    /// Report hard-coded devices in Rust sources.
    LintDevices(lint_devices::LintArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Devices => devices::run(),
        Command::LintDevices(args) => {
            let findings = lint_devices::run(args)?;
            if findings > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}
