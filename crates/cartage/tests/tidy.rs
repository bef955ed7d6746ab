//! The workspace's tidy checks, run as a test (docs/ARCHITECTURE.md names each invariant):
//! - every `.rs` file starts with a `//!` module doc;
//! - backend crates (cartage-cpu, cartage-cuda, cartage-wgpu) depend on core only, never on each
//!   other or on the frontend;
//! - cartage-core depends on no GPU crate (no cudarc, no wgpu);
//! - only the frontend's runtime (`crates/cartage/src/runtime*`, where `Device::pick` lives)
//!   reads `CARTAGE_DEVICE`;
//! - every `unsafe` block has a `// SAFETY:` comment on its line, within the 3 lines above, or
//!   in the comment block directly above it.

use std::fs;
use std::path::{Path, PathBuf};

const BACKENDS: [&str; 3] = ["cartage-cpu", "cartage-cuda", "cartage-wgpu"];
const GPU_CRATES: [&str; 4] = ["cudarc", "wgpu", "wgpu-core", "wgpu-hal"];
// Spelled in pieces so that this file does not match its own checks.
const UNSAFE_BLOCK: &str = concat!("unsafe", " {");
const SAFETY_MARK: &str = concat!("// SAFETY", ":");
const DEVICE_VAR: &str = concat!("CARTAGE", "_DEVICE");

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Every `.rs` file of the workspace, skipping build outputs, VCS data and staged GPU bundles.
fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("readable directory").flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                let skip = name.starts_with("target") || name.starts_with('.') || name == "node_modules";
                if !skip {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(
        files.len() > 20,
        "found only {} .rs files under {}",
        files.len(),
        root.display()
    );
    files
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// The dependency names declared in a Cargo.toml's dependency tables.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = fs::read_to_string(manifest).expect("readable Cargo.toml");
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line
                .trim_matches(['[', ']'])
                .split('.')
                .any(|part| part.ends_with("dependencies"));
            if let Some(name) = line
                .strip_prefix("[dependencies.")
                .or(line.strip_prefix("[dev-dependencies."))
            {
                deps.push(name.trim_end_matches(']').to_string());
            }
            continue;
        }
        if in_deps && let Some((key, _)) = line.split_once('=') {
            let key = key.trim().trim_matches('"');
            if !key.is_empty() && !key.starts_with('#') {
                deps.push(key.split('.').next().unwrap_or(key).to_string());
            }
        }
    }
    deps
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let root = workspace_root();
    let missing: Vec<String> = rust_files(&root)
        .into_iter()
        .filter(|p| !fs::read_to_string(p).unwrap_or_default().starts_with("//!"))
        .map(|p| relative(&root, &p))
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading `//!` module doc: {missing:#?}"
    );
}

#[test]
fn backend_crates_depend_on_core_only() {
    let root = workspace_root();
    for backend in BACKENDS {
        let deps = dependencies(&root.join("crates").join(backend).join("Cargo.toml"));
        assert!(
            deps.iter().any(|d| d == "cartage-core"),
            "{backend} should depend on cartage-core: {deps:?}"
        );
        for other in BACKENDS.iter().filter(|&&o| o != backend).chain(&["cartage"]) {
            assert!(
                !deps.iter().any(|d| d == other),
                "{backend} depends on {other}: {deps:?}"
            );
        }
    }
}

#[test]
fn core_depends_on_no_gpu_crate() {
    let root = workspace_root();
    let deps = dependencies(&root.join("crates/cartage-core/Cargo.toml"));
    assert!(
        deps.iter().any(|d| d == "half"),
        "the dependency parser found nothing: {deps:?}"
    );
    for gpu in GPU_CRATES.iter().chain(&BACKENDS) {
        assert!(!deps.iter().any(|d| d == gpu), "cartage-core depends on {gpu}");
    }
}

/// True when `line` reads an environment variable named by `DEVICE_VAR` (directly or through
/// the runtime's `DEVICE_ENV` constant).
fn reads_device_variable(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    // `env_text(` is the runtime's reader of one variable as UTF-8 (non-UTF-8 is an error).
    let reads = ["env::var(", "env::var_os(", "env!(", "vars()", "vars_os()", "env_text("]
        .iter()
        .any(|r| code.contains(r));
    reads && (code.contains(DEVICE_VAR) || code.contains("DEVICE_ENV"))
}

#[test]
fn only_the_runtime_reads_the_device_variable() {
    let root = workspace_root();
    let mut offenders = Vec::new();
    let mut readers = Vec::new();
    for path in rust_files(&root) {
        let rel = relative(&root, &path);
        let text = fs::read_to_string(&path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if reads_device_variable(line) {
                if rel.starts_with("crates/cartage/src/runtime") {
                    readers.push(format!("{rel}:{}", n + 1));
                } else {
                    offenders.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "{DEVICE_VAR} read outside the runtime: {offenders:#?}"
    );
    assert_eq!(readers.len(), 1, "exactly one read, in Device::pick: {readers:?}");
}

/// The run of comment lines directly above line `n` (however long).
fn comment_block_above<'a>(lines: &'a [&'a str], n: usize) -> impl Iterator<Item = &'a str> + 'a {
    lines[..n]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with("//"))
        .copied()
}

#[test]
fn every_unsafe_block_has_a_safety_comment() {
    let root = workspace_root();
    let mut undocumented = Vec::new();
    for path in rust_files(&root) {
        let text = fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !code.contains(UNSAFE_BLOCK) || code.trim_start().starts_with("//") {
                continue;
            }
            let documented = lines[n.saturating_sub(3)..=n].iter().any(|l| l.contains(SAFETY_MARK))
                || comment_block_above(&lines, n).any(|l| l.contains(SAFETY_MARK));
            if !documented {
                undocumented.push(format!("{}:{}: {}", relative(&root, &path), n + 1, line.trim()));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "unsafe blocks without `{SAFETY_MARK}` above: {undocumented:#?}"
    );
}

#[test]
fn the_checks_catch_what_they_look_for() {
    assert!(reads_device_variable(&format!(
        "let v = std::env::var(\"{DEVICE_VAR}\");"
    )));
    assert!(reads_device_variable(&format!(
        "let v = std::env::{}(DEVICE_ENV).ok();",
        "var"
    )));
    assert!(!reads_device_variable(&format!(
        "// mention {DEVICE_VAR} in a comment, env::var("
    )));
    assert!(!reads_device_variable(&format!(
        "{UNSAFE_BLOCK} std::env::set_var(DEVICE_ENV, 1) }};"
    )));
    let dir = std::env::temp_dir().join(format!("cartage-tidy-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("temp dir");
    let manifest = dir.join("Cargo.toml");
    fs::write(
        &manifest,
        "[package]\nname = \"x\"\n[dependencies]\ncartage-core.workspace = true\n\"wgpu\" = { version = \"30\" }\n\
         [target.'cfg(unix)'.dependencies]\ncudarc = \"0.19\"\n[features]\ncuda = []\n",
    )
    .expect("write");
    assert_eq!(dependencies(&manifest), vec!["cartage-core", "wgpu", "cudarc"]);
    let _ = fs::remove_dir_all(&dir);
}

/// Source files of `crate_dir` (its `src/`), relative to the workspace root.
fn sources_of(root: &Path, crate_dir: &str) -> Vec<PathBuf> {
    rust_files(root)
        .into_iter()
        .filter(|p| relative(root, p).starts_with(&format!("crates/{crate_dir}/src/")))
        .collect()
}

/// Shape and dtype rules live in core's `Kernel::validate`; a backend that builds one of these
/// errors is repeating a structural rule.
#[test]
fn no_backend_crate_repeats_a_structural_rule() {
    let root = workspace_root();
    let forbidden = [concat!("Error::Shape", "Mismatch"), concat!("Error::Wrong", "DType")];
    let mut offenders = Vec::new();
    for backend in BACKENDS {
        let files = sources_of(&root, backend);
        assert!(!files.is_empty(), "no sources found for {backend}");
        for file in files {
            let text = fs::read_to_string(&file).expect("readable source");
            for (n, line) in text.lines().enumerate() {
                // Construction, not a pattern (`Error::WrongDType { .. }` in a match is fine).
                let builds = forbidden
                    .iter()
                    .any(|f| line.contains(f) && !line.contains(&format!("{f} {{ .. }}")));
                if builds {
                    offenders.push(format!("{}:{}: {}", relative(&root, &file), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "backend crates build structural errors (move the rule into Kernel::validate):\n{}",
        offenders.join("\n")
    );
}

/// The frontend names backend crates in one place only: the runtime registry, which opens them.
#[test]
fn only_the_registry_names_backend_crates() {
    let root = workspace_root();
    let names = [
        concat!("cartage", "_cpu"),
        concat!("cartage", "_cuda"),
        concat!("cartage", "_wgpu"),
    ];
    let mut offenders = Vec::new();
    for file in sources_of(&root, "cartage") {
        let rel = relative(&root, &file);
        if rel == "crates/cartage/src/runtime/registry.rs" {
            continue;
        }
        let text = fs::read_to_string(&file).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            if names.iter().any(|name| line.contains(name)) {
                offenders.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "the frontend names backend crates outside runtime/registry.rs:\n{}",
        offenders.join("\n")
    );
}
