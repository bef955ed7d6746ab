//! `cargo xtask lint-devices [PATH]`: hard-coded devices outside the entry point (LESSONS R17).
//!
//! A code-review rule, automated: count hard-coded device literals; outside the one
//! place that picks the device there should be none. Scans every `.rs` file under PATH (default:
//! the current directory; `target*` folders and hidden folders such as `.git` are skipped) for
//! device strings (`"cuda:0"`, `"wgpu:1"`, `"cpu"`, a bare `"cuda"`), device constructions
//! (`Device::cuda(..)`, `Device::cpu()`, `Device::Cuda`…) and `.cuda()`-style moves. Comments and
//! doc examples are not code and are not reported. Mark the entry point with a comment
//! `// cartage: device-entry`, at the end of a line (that line) or above or inside an item such as
//! the `fn` that calls `Device::pick()` (that whole item). Prints `file:line: code` and a hint for
//! each finding; the command exits non-zero when there is any.

mod scan;
mod tokens;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

pub use scan::{ENTRY_MARKER, Finding, scan_source};

/// Arguments of `cargo xtask lint-devices`.
#[derive(clap::Args)]
pub struct LintArgs {
    /// A Rust file or a folder to scan (default: the current directory).
    #[arg(default_value = ".")]
    pub path: PathBuf,
}

/// A finding with where it is and the line of code it is on.
#[derive(Clone, Debug)]
pub struct Located {
    /// The file.
    pub path: PathBuf,
    /// The finding.
    pub finding: Finding,
    /// The trimmed source line.
    pub snippet: String,
}

/// The result of scanning a path.
#[derive(Clone, Debug, Default)]
pub struct LintReport {
    /// Rust files read.
    pub files_scanned: usize,
    /// Every finding, by file then line.
    pub findings: Vec<Located>,
}

/// Scan a file or folder.
pub fn lint_path(root: &Path) -> anyhow::Result<LintReport> {
    let mut files = Vec::new();
    collect_rust_files(root, &mut files).with_context(|| format!("cannot scan {}", root.display()))?;
    files.sort();
    let mut report = LintReport::default();
    for path in files {
        let source = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        report.files_scanned += 1;
        let lines: Vec<&str> = source.lines().collect();
        for finding in scan_source(&source) {
            let snippet = lines.get(finding.line - 1).map_or("", |l| l.trim()).to_string();
            report.findings.push(Located {
                path: path.clone(),
                finding,
                snippet,
            });
        }
    }
    Ok(report)
}

fn skipped_dir(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("target") || (n.starts_with('.') && n != "." && n != ".."))
}

fn collect_rust_files(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let meta = fs::metadata(path)?;
    if meta.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
        return Ok(());
    }
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let child = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if !skipped_dir(&child) {
                collect_rust_files(&child, out)?;
            }
        } else if kind.is_file() && child.extension().is_some_and(|e| e == "rs") {
            out.push(child);
        }
    }
    Ok(())
}

fn display_path(path: &Path) -> String {
    let text = path.display().to_string();
    text.strip_prefix("./").map(str::to_string).unwrap_or(text)
}

/// Render a report as the command prints it.
pub fn render(report: &LintReport) -> String {
    let mut out = String::new();
    for located in &report.findings {
        out.push_str(&format!(
            "{}:{}: {}\n    hint: {}\n",
            display_path(&located.path),
            located.finding.line,
            located.snippet,
            located.finding.rule.hint()
        ));
    }
    let files_with: std::collections::BTreeSet<&Path> = report.findings.iter().map(|l| l.path.as_path()).collect();
    if report.findings.is_empty() {
        out.push_str(&format!(
            "lint-devices: no hard-coded devices in {} Rust file(s)\n",
            report.files_scanned
        ));
    } else {
        out.push_str(&format!(
            "lint-devices: {} hard-coded device(s) in {} of {} Rust file(s). Pick the device once \
             (`Device::pick()`), pass `&Device` down, and mark that entry point with `// {ENTRY_MARKER}`\n",
            report.findings.len(),
            files_with.len(),
            report.files_scanned
        ));
    }
    out
}

/// Scan and print; returns the number of findings.
pub fn run(args: LintArgs) -> anyhow::Result<usize> {
    let report = lint_path(&args.path)?;
    print!("{}", render(&report));
    Ok(report.findings.len())
}

#[cfg(test)]
mod tests {
    use super::scan::Rule;
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lint_devices")
    }

    #[test]
    fn hard_coded_fixture_is_reported_line_by_line() {
        let report = lint_path(&fixtures().join("hard_coded.rs")).unwrap();
        let got: Vec<(usize, Rule)> = report
            .findings
            .iter()
            .map(|l| (l.finding.line, l.finding.rule))
            .collect();
        assert_eq!(
            got,
            vec![
                (9, Rule::DeviceString),
                (10, Rule::BareDeviceString),
                (11, Rule::Construction),
                (12, Rule::MethodMove),
                (16, Rule::Construction),
                (17, Rule::DeviceString),
            ]
        );
        assert!(report.findings[0].snippet.contains("\"cuda:0\""));
        let text = render(&report);
        assert!(text.contains("hard_coded.rs:9: "), "{text}");
        assert!(text.contains("hint: "), "{text}");
        assert!(text.contains("6 hard-coded device(s) in 1 of 1"), "{text}");
    }

    #[test]
    fn entry_point_fixture_is_clean() {
        let report = lint_path(&fixtures().join("picked_once.rs")).unwrap();
        assert!(report.findings.is_empty(), "{}", render(&report));
        assert!(render(&report).contains("no hard-coded devices in 1"));
    }

    #[test]
    fn folders_are_walked_and_target_and_hidden_dirs_skipped() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path();
        for dir in ["src/nested", "target/debug", "target-mem", ".git"] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        let hard = "fn f() { let d = \"cuda:1\"; }\n";
        for file in ["src/nested/a.rs", "target/debug/b.rs", "target-mem/c.rs", ".git/d.rs"] {
            fs::write(root.join(file), hard).unwrap();
        }
        fs::write(root.join("src/notes.txt"), hard).unwrap();
        let report = lint_path(root).unwrap();
        drop(scratch);
        assert_eq!(report.files_scanned, 1, "only src/nested/a.rs is scanned");
        assert_eq!(report.findings.len(), 1);
        assert!(report.findings[0].path.ends_with("src/nested/a.rs"));
        let whole = lint_path(&fixtures()).unwrap();
        assert_eq!(whole.files_scanned, 2);
        assert!(whole.findings.iter().all(|l| l.path.ends_with("hard_coded.rs")));
    }

    #[test]
    fn cartage_examples_lint_clean() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/cartage/examples");
        let report = lint_path(&examples).unwrap();
        assert!(report.files_scanned >= 5, "examples missing: {}", examples.display());
        assert!(report.findings.is_empty(), "{}", render(&report));
    }

    #[test]
    fn missing_path_is_an_error() {
        assert!(lint_path(Path::new("/no/such/place")).is_err());
    }
}
