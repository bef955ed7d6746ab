//! `cargo xtask ops-table`: writes `docs/OPS.md`, the table of every kernel op × backend × dtype
//! generated from each backend's capabilities, and the table of the frontend ops composed from
//! those kernels.
//!
//! The columns come from [`columns`], the frontend ops and the kernels they need from
//! [`composed`], the Markdown from [`render`]. A test compares the committed file with what the
//! generator produces now, so a backend that gains or loses a kernel also updates the docs.

mod columns;
mod composed;
mod render;

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `cargo xtask ops-table`.
#[derive(clap::Args, Debug)]
pub struct OpsTableArgs {
    /// Where to write the table.
    #[arg(long, default_value = "docs/OPS.md")]
    out: PathBuf,
    /// Only compare the file with a fresh table; exit with an error when they differ.
    #[arg(long)]
    check: bool,
}

/// The command that regenerates the committed table.
pub const REGENERATE: &str = "cargo xtask ops-table";

/// Write (or with `--check`, compare) the table.
pub fn run(args: OpsTableArgs) -> anyhow::Result<()> {
    let text = generate()?;
    if args.check {
        let committed = std::fs::read_to_string(&args.out).unwrap_or_default();
        anyhow::ensure!(
            committed == text,
            "{} is out of date with the backends' capabilities; run `{REGENERATE}` and commit it",
            args.out.display()
        );
        eprintln!("ops-table: {} is current", args.out.display());
        return Ok(());
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, &text).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("ops-table: wrote {}", args.out.display());
    Ok(())
}

/// The whole of `docs/OPS.md`.
pub fn generate() -> anyhow::Result<String> {
    let columns = columns::all()?;
    Ok(render::document(&columns, &composed::all()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// `docs/OPS.md` in this checkout.
    fn committed_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/OPS.md")
    }

    #[test]
    fn the_committed_ops_table_is_current() {
        let fresh = generate().expect("the table generates");
        let path = committed_path();
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != fresh {
            let first = committed
                .lines()
                .zip(fresh.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
            panic!(
                "{} differs from the generated table (first at line {}: committed {:?}, generated {:?}); \
                 run `{REGENERATE}` and commit the result",
                path.display(),
                first + 1,
                committed.lines().nth(first).unwrap_or("<end of file>"),
                fresh.lines().nth(first).unwrap_or("<end of file>"),
            );
        }
    }
}
