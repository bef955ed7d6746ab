//! `cargo xtask ptx [--check]`: compile every CUDA kernel file to PTX with NVRTC (no GPU needed)
//! and write it beside its source as `crates/cartage-cuda/kernels/<name>.ptx`, with a header
//! recording the source's SHA-256. `--check` writes nothing and fails when a committed file
//! differs from what NVRTC builds now.
//!
//! NVRTC comes from the CUDA toolkit or PyPI's `nvidia-cuda-nvrtc` wheel (a release no newer than
//! the oldest driver that should load the PTX): put its `lib` folder on `LD_LIBRARY_PATH`, or set
//! `CUDA_PATH` to the folder above it.

use std::path::PathBuf;

use anyhow::{Context, bail};
use cartage_cuda::modules::SourceFile;
use cartage_cuda::precompiled;

/// Arguments of `cargo xtask ptx`.
#[derive(clap::Args)]
pub struct PtxArgs {
    /// Compare instead of writing; fail when a committed PTX file is out of date.
    #[arg(long)]
    check: bool,
}

/// The kernels folder of the CUDA backend.
fn kernels_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates/cartage-cuda/kernels")
}

/// Build every module's PTX (in parallel) and write or compare it.
pub fn run(args: PtxArgs) -> anyhow::Result<()> {
    cartage_cuda::loader::nvrtc().map_err(anyhow::Error::msg)?;
    let built: Vec<(SourceFile, Result<String, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = SourceFile::ALL
            .into_iter()
            .map(|file| scope.spawn(move || (file, precompiled::build(file))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a PTX build thread panicked"))
            .collect()
    });
    let dir = kernels_dir();
    let mut stale = Vec::new();
    for (file, ptx) in built {
        let ptx = ptx.map_err(anyhow::Error::msg)?;
        let path = dir.join(precompiled::ptx_file_name(file));
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        if old == ptx {
            println!("{:<16} up to date ({} KiB)", file.file_name(), ptx.len() >> 10);
            continue;
        }
        if args.check {
            stale.push(path.display().to_string());
            continue;
        }
        std::fs::write(&path, &ptx).with_context(|| format!("writing {}", path.display()))?;
        println!("{:<16} written ({} KiB)", file.file_name(), ptx.len() >> 10);
    }
    if !stale.is_empty() {
        bail!("out of date (run `cargo xtask ptx`): {}", stale.join(", "));
    }
    Ok(())
}
