//! `cargo xtask devices`: every device found, with capabilities (built by the frontend work).

/// List devices.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("device listing is not built yet")
}
