//! `cargo xtask bench`: the cross-backend benchmark report (built by the bench work).

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Run the report.
pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("the benchmark report is not built yet")
}
