//! `cargo xtask lint-devices [PATH]`: hard-coded device literals (built by the memory work).

/// Arguments of `cargo xtask lint-devices`.
#[derive(clap::Args)]
pub struct LintArgs {}

/// Scan; returns the number of findings.
pub fn run(_args: LintArgs) -> anyhow::Result<usize> {
    anyhow::bail!("lint-devices is not built yet")
}
