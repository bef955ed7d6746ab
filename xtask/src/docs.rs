//! `cargo xtask docs`: writes every figure that README.md and docs/GUIDE.md quote from the
//! committed benchmark reports (`docs/bench/h200/report.json`, `docs/bench/cpu-lavapipe/report.json`).
//!
//! A figure lives between two markers in the Markdown, `<!-- figures:NAME -->` and
//! `<!-- /figures -->`; everything between them is replaced by what [`figures::render`] produces
//! for NAME. The prose around the markers is never touched. `--check` compares instead of
//! writing, and a test does the same, so a regenerated report without regenerated docs fails
//! `cargo test --workspace`.

mod figures;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bench::report::Report;

/// Arguments of `cargo xtask docs`.
#[derive(clap::Args, Debug)]
pub struct DocsArgs {
    /// Only compare the documents with fresh figures; exit with an error when they differ.
    #[arg(long)]
    check: bool,
}

/// The command that regenerates the figures.
pub const REGENERATE: &str = "cargo xtask docs";

/// The documents that quote figures, relative to the workspace root.
pub const DOCUMENTS: [&str; 2] = ["README.md", "docs/GUIDE.md"];

/// The committed reports the figures come from, relative to the workspace root.
pub const H200_REPORT: &str = "docs/bench/h200/report.json";
/// The CPU and lavapipe report of the 2-core VM.
pub const VM_REPORT: &str = "docs/bench/cpu-lavapipe/report.json";

const OPEN: &str = "<!-- figures:";
const CLOSE: &str = "<!-- /figures -->";

/// The two committed reports.
pub struct Reports {
    /// Measured on a machine with an NVIDIA H200, PyTorch beside it.
    pub h200: Report,
    /// Measured on the 2-core VM: the CPU and lavapipe, numpy beside the CPU.
    pub vm: Report,
}

impl Reports {
    /// Read both reports below `root`.
    pub fn load(root: &Path) -> anyhow::Result<Reports> {
        let read = |path: &str| -> anyhow::Result<Report> {
            let path = root.join(path);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a cartage report.json", path.display()))
        };
        Ok(Reports {
            h200: read(H200_REPORT)?,
            vm: read(VM_REPORT)?,
        })
    }
}

/// The workspace root: the directory above this crate's.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Write (or with `--check`, compare) the figures of every document.
pub fn run(args: DocsArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    let reports = Reports::load(&root)?;
    let mut stale = Vec::new();
    for doc in DOCUMENTS {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let fresh = fill(&text, &reports).with_context(|| format!("in {doc}"))?;
        if fresh == text {
            continue;
        }
        if args.check {
            stale.push(format!("{doc}: {}", differing(&text, &fresh).join(", ")));
        } else {
            std::fs::write(&path, &fresh).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("docs: wrote the figures of {doc}");
        }
    }
    anyhow::ensure!(
        stale.is_empty(),
        "figures out of date with the committed reports ({}); run `{REGENERATE}` and commit the result",
        stale.join("; ")
    );
    if args.check {
        eprintln!("docs: every figure matches the committed reports");
    }
    Ok(())
}

/// `text` with the inside of every figure block replaced by its figure. An unknown name, an
/// unclosed block or a nested one is an error naming the line.
pub fn fill(text: &str, reports: &Reports) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split_inclusive('\n').enumerate();
    while let Some((number, line)) = lines.next() {
        out.push_str(line);
        let Some(name) = opening(line) else {
            anyhow::ensure!(
                !line.trim_start().starts_with(CLOSE),
                "line {}: `{CLOSE}` without an opening `{OPEN}NAME -->`",
                number + 1
            );
            continue;
        };
        let figure = figures::render(name, reports).with_context(|| format!("line {}: figure `{name}`", number + 1))?;
        let closed = loop {
            match lines.next() {
                Some((_, inner)) if inner.trim_start().starts_with(CLOSE) => break Some(inner),
                Some((n, inner)) if opening(inner).is_some() => {
                    anyhow::bail!("line {}: a figure block opens inside `{name}`", n + 1)
                }
                Some(_) => {}
                None => break None,
            }
        };
        let close =
            closed.with_context(|| format!("line {}: figure `{name}` is never closed by `{CLOSE}`", number + 1))?;
        out.push_str(figure.trim_end());
        out.push('\n');
        out.push_str(close);
    }
    Ok(out)
}

/// The name of a figure block this line opens.
fn opening(line: &str) -> Option<&str> {
    line.trim().strip_prefix(OPEN)?.strip_suffix("-->").map(str::trim)
}

/// The names of the blocks whose content differs between two versions of a document.
fn differing(old: &str, new: &str) -> Vec<String> {
    let blocks = |text: &str| -> Vec<(String, String)> {
        let mut found = Vec::new();
        let mut current: Option<(String, String)> = None;
        for line in text.lines() {
            if let Some(name) = opening(line) {
                current = Some((name.to_string(), String::new()));
            } else if line.trim_start().starts_with(CLOSE) {
                found.extend(current.take());
            } else if let Some((_, body)) = current.as_mut() {
                body.push_str(line);
                body.push('\n');
            }
        }
        found
    };
    let (old, new) = (blocks(old), blocks(new));
    let names: Vec<String> = new
        .iter()
        .filter(|(name, body)| !old.iter().any(|(n, b)| n == name && b == body))
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    if names.is_empty() {
        vec!["text outside the figure blocks".into()]
    } else {
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports() -> Reports {
        Reports::load(&workspace_root()).expect("the committed reports load")
    }

    #[test]
    fn the_committed_docs_quote_the_committed_reports() {
        let root = workspace_root();
        let reports = reports();
        for doc in DOCUMENTS {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            let fresh = fill(&text, &reports).unwrap();
            assert!(
                fresh == text,
                "{doc}: figures {} differ from what the committed reports give; run `{REGENERATE}`",
                differing(&text, &fresh).join(", ")
            );
            assert!(text.contains(OPEN), "{doc} quotes no generated figure");
        }
    }

    #[test]
    fn every_figure_renders_from_the_committed_reports() {
        let reports = reports();
        for name in figures::NAMES {
            let text = figures::render(name, &reports).unwrap();
            assert!(
                text.contains('|') && !text.contains("NaN") && !text.contains("inf"),
                "{name}: {text}"
            );
        }
    }

    #[test]
    fn a_block_is_replaced_and_the_prose_kept() {
        let reports = reports();
        let doc = "Before.\n<!-- figures:h200-vs-pytorch -->\nan old 33× at 4096\n<!-- /figures -->\nAfter.\n";
        let filled = fill(doc, &reports).unwrap();
        assert!(
            filled.starts_with("Before.\n<!-- figures:h200-vs-pytorch -->\n"),
            "{filled}"
        );
        assert!(filled.ends_with("<!-- /figures -->\nAfter.\n"), "{filled}");
        assert!(!filled.contains("33× at 4096"), "the stale figure is gone: {filled}");
        assert!(filled.contains("PyTorch"), "{filled}");
        assert_eq!(fill(&filled, &reports).unwrap(), filled, "filling is idempotent");
        assert_eq!(differing(doc, &filled), ["`h200-vs-pytorch`"]);
    }

    #[test]
    fn malformed_blocks_are_errors_naming_the_line() {
        let reports = reports();
        let unknown = fill("a\n<!-- figures:no-such -->\n<!-- /figures -->\n", &reports).unwrap_err();
        assert!(
            format!("{unknown:#}").contains("line 2: figure `no-such`"),
            "{unknown:#}"
        );
        let open = fill("<!-- figures:cpu-vs-numpy -->\ntext\n", &reports).unwrap_err();
        assert!(format!("{open:#}").contains("never closed"), "{open:#}");
        let stray = fill("x\n<!-- /figures -->\n", &reports).unwrap_err();
        assert!(format!("{stray:#}").contains("line 2"), "{stray:#}");
    }
}
