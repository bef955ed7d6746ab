//! Kernel modules compiled ahead of time: one PTX file beside each `.cu` source
//! (`kernels/<name>.ptx`), embedded in the binary, so that a fresh machine loads its first kernel
//! in milliseconds instead of waiting for NVRTC.
//!
//! - The PTX is built for the virtual architecture [`PTX_ARCH`] by `cargo xtask ptx`, which
//!   needs NVRTC but no GPU. Every device of compute capability [`MIN_CAPABILITY`] or later can
//!   run it; older devices compile the source with NVRTC as before.
//! - The driver's JIT compiles PTX at roughly a second per few hundred KiB, and a module holds
//!   up to a hundred kernels, so kernels are built one at a time: [`entry_ptx`] cuts a module's
//!   PTX down to the one entry asked for (plus the module's declarations and device functions),
//!   and only that is compiled for the device on its first launch.
//! - Each file starts with a header of `//` comments naming its source's SHA-256
//!   ([`source_digest`]). A PTX file whose header does not match the source compiled into this
//!   binary is stale: it is never loaded (NVRTC compiles the source instead), and a test fails
//!   so that it is rebuilt before it is committed.

use std::collections::HashMap;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::modules::SourceFile;
use crate::nvrtc::{self, ImageKind};

/// The virtual architecture the committed PTX targets (Ampere: `mma.sync` and `cp.async`, which
/// the attention kernel uses, exist from here on).
pub const PTX_ARCH: &str = "compute_80";

/// The oldest compute capability the committed PTX runs on.
pub const MIN_CAPABILITY: (i32, i32) = (8, 0);

/// The header line that carries the source digest.
const DIGEST_LINE: &str = "// source-sha256: ";

/// The SHA-256 (hex) of the full text NVRTC compiles for `file` (see [`SourceFile::source`]).
pub fn source_digest(file: SourceFile) -> String {
    Sha256::digest(file.source().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The committed PTX of `file`, header included, as embedded in this binary.
pub fn embedded(file: SourceFile) -> &'static str {
    match file {
        SourceFile::Unary => include_str!("../kernels/unary.ptx"),
        SourceFile::Binary => include_str!("../kernels/binary.ptx"),
        SourceFile::Compare => include_str!("../kernels/compare.ptx"),
        SourceFile::Construct => include_str!("../kernels/construct.ptx"),
        SourceFile::Cast => include_str!("../kernels/cast.ptx"),
        SourceFile::Reduce => include_str!("../kernels/reduce.ptx"),
        SourceFile::Extreme => include_str!("../kernels/extreme.ptx"),
        SourceFile::Softmax => include_str!("../kernels/softmax.ptx"),
        SourceFile::Index => include_str!("../kernels/index.ptx"),
        SourceFile::Scan => include_str!("../kernels/scan.ptx"),
        SourceFile::Sort => include_str!("../kernels/sort.ptx"),
        SourceFile::SortRadix => include_str!("../kernels/sort_radix.ptx"),
        SourceFile::Norm => include_str!("../kernels/norm.ptx"),
        SourceFile::Attention => include_str!("../kernels/attention.ptx"),
        SourceFile::AttentionBackward => include_str!("../kernels/attention_backward.ptx"),
        SourceFile::AttentionFlashBackward => include_str!("../kernels/attention_flash_backward.ptx"),
        SourceFile::AttentionF32 => include_str!("../kernels/attention_f32.ptx"),
        SourceFile::AttentionF32Backward => include_str!("../kernels/attention_f32_backward.ptx"),
        SourceFile::Backward => include_str!("../kernels/backward.ptx"),
        SourceFile::Update => include_str!("../kernels/update.ptx"),
        SourceFile::Pool => include_str!("../kernels/pool.ptx"),
    }
}

/// The file name of `file`'s PTX, beside its source in `kernels/`.
pub fn ptx_file_name(file: SourceFile) -> String {
    format!("{}.ptx", file.file_name().trim_end_matches(".cu"))
}

/// The source digest recorded in a PTX file's header, if it has one.
pub fn recorded_digest(ptx: &str) -> Option<&str> {
    ptx.lines()
        .take_while(|line| line.starts_with("//"))
        .find_map(|line| line.strip_prefix(DIGEST_LINE))
        .map(str::trim)
}

/// True when the embedded PTX of `file` was built from the source compiled into this binary.
pub fn is_fresh(file: SourceFile) -> bool {
    recorded_digest(embedded(file)) == Some(source_digest(file).as_str())
}

/// True when a device of compute capability `cc` can run the committed PTX.
pub fn covers(cc: (i32, i32)) -> bool {
    cc >= MIN_CAPABILITY
}

/// A module's PTX cut into its entries and everything else.
struct Split {
    /// The `.version`/`.target`/`.address_size` lines, declarations, variables and device
    /// functions, in their order.
    common: String,
    /// Each entry's text (`.visible .entry name(...) {...}`) by its name.
    entries: HashMap<&'static str, &'static str>,
}

/// The name of the entry `item` declares, if it is one.
fn entry_name(item: &str) -> Option<&str> {
    let head = &item[..item.find('(')?];
    let name = head.split(".entry").nth(1)?.trim();
    (!name.is_empty()).then_some(name)
}

/// Cut `ptx` into top-level items: directive lines, then declarations and definitions, each
/// ending where its braces close on a line ending in `}` or `;`. Comments are dropped.
fn split(ptx: &'static str) -> Split {
    let mut common = String::new();
    let mut entries = HashMap::new();
    let mut start: Option<usize> = None;
    let mut depth = 0i64;
    let mut offset = 0;
    for line in ptx.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        let code = line.split("//").next().unwrap_or_default();
        let trimmed = code.trim();
        if start.is_none() {
            if trimmed.is_empty() {
                continue;
            }
            if [".version", ".target", ".address_size"]
                .iter()
                .any(|d| trimmed.starts_with(d))
            {
                common.push_str(code.trim_end());
                common.push('\n');
                continue;
            }
            start = Some(line_start);
        }
        depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
        if depth == 0
            && (trimmed.ends_with('}') || trimmed.ends_with(';'))
            && let Some(from) = start.take()
        {
            let item = &ptx[from..offset];
            match entry_name(item) {
                Some(name) => {
                    entries.insert(name, item);
                }
                None => common.push_str(item),
            }
        }
    }
    Split { common, entries }
}

/// The split PTX of `file`, made once per process.
fn split_of(file: SourceFile) -> &'static Split {
    static SPLITS: OnceLock<Vec<OnceLock<Split>>> = OnceLock::new();
    let splits = SPLITS.get_or_init(|| SourceFile::ALL.iter().map(|_| OnceLock::new()).collect());
    splits[file as usize].get_or_init(|| split(embedded(file)))
}

/// A PTX module holding only the entry `symbol` of `file`'s committed PTX, with the module's
/// directives, declarations and device functions; `None` when the PTX has no such entry.
pub fn entry_ptx(file: SourceFile, symbol: &str) -> Option<String> {
    let split = split_of(file);
    let entry = split.entries.get(symbol)?;
    Some(format!("{}{entry}", split.common))
}

/// The names of the entries in `file`'s committed PTX.
pub fn entry_names(file: SourceFile) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = split_of(file).entries.keys().copied().collect();
    names.sort_unstable();
    names
}

/// The PTX file for `file`, header included: compiled with NVRTC for [`PTX_ARCH`] (no GPU
/// needed). `Err` carries NVRTC's log, or why NVRTC is unavailable.
pub fn build(file: SourceFile) -> Result<String, String> {
    crate::loader::nvrtc()?;
    let (major, minor) = nvrtc::version().ok_or("NVRTC does not report its version")?;
    let image = nvrtc::compile(file.file_name(), &file.source(), PTX_ARCH, ImageKind::Ptx)?;
    let body = String::from_utf8_lossy(image.strip_suffix(&[0]).unwrap_or(&image)).into_owned();
    Ok(format!(
        "// cartage kernel module {name}, compiled ahead of time. Do not edit: rebuild it with\n\
         // `cargo xtask ptx` whenever kernels/{name} or a header it includes changes.\n\
         {DIGEST_LINE}{digest}\n\
         // arch: {PTX_ARCH}\n\
         // nvrtc: {major}.{minor}\n\
         // options: {options}\n\
         {body}",
        name = file.file_name(),
        digest = source_digest(file),
        options = nvrtc::options(PTX_ARCH).join(" "),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when a `.cu` (or a header it includes) changed and its PTX was not rebuilt: run
    /// `cargo xtask ptx` and commit the PTX files.
    #[test]
    fn every_ptx_file_matches_its_source() {
        let stale: Vec<String> = SourceFile::ALL
            .into_iter()
            .filter(|&file| !is_fresh(file))
            .map(|file| {
                format!(
                    "kernels/{} (records {:?}, the source is {})",
                    ptx_file_name(file),
                    recorded_digest(embedded(file)),
                    source_digest(file)
                )
            })
            .collect();
        assert!(
            stale.is_empty(),
            "stale PTX, rebuild with `cargo xtask ptx`: {}",
            stale.join("; ")
        );
    }

    #[test]
    fn every_ptx_file_targets_the_declared_architecture() {
        let target = format!(".target {}", PTX_ARCH.replace("compute_", "sm_"));
        for file in SourceFile::ALL {
            let ptx = embedded(file);
            assert!(
                ptx.lines().any(|line| line.trim() == target),
                "{} lacks `{target}`",
                ptx_file_name(file)
            );
            assert!(ptx.contains(".visible .entry"), "{} has no kernel", ptx_file_name(file));
        }
    }

    #[test]
    fn a_changed_source_is_detected() {
        let ptx = embedded(SourceFile::Unary);
        let recorded = recorded_digest(ptx).expect("a digest line");
        assert_eq!(recorded.len(), 64);
        assert_ne!(Some(recorded), Some(source_digest(SourceFile::Binary).as_str()));
        assert_eq!(recorded_digest("// other\n.version 9.0\n"), None);
        assert_eq!(recorded_digest("// source-sha256: ab\n"), Some("ab"));
        // A digest below the header (in the PTX body) does not count.
        assert_eq!(recorded_digest(".version 9.0\n// source-sha256: ab\n"), None);
    }

    /// Every entry of every module is found, and its single-entry PTX keeps the directives and
    /// the module's device functions and declares exactly that entry.
    #[test]
    fn modules_split_into_single_entries() {
        for file in SourceFile::ALL {
            let ptx = embedded(file);
            let declared = ptx.matches(".entry ").count();
            let names = entry_names(file);
            assert_eq!(names.len(), declared, "{}", file.file_name());
            let common = &split_of(file).common;
            for directive in [".version", ".target", ".address_size"] {
                assert!(common.contains(directive), "{} lacks {directive}", file.file_name());
            }
            assert!(
                !common.contains(".entry"),
                "{}: an entry left in the common part",
                file.file_name()
            );
            for name in names {
                let one = entry_ptx(file, name).expect("an entry");
                assert_eq!(one.matches(".entry ").count(), 1);
                assert!(one.contains(&format!(".entry {name}(")));
                assert_eq!(one.matches('{').count(), one.matches('}').count(), "{name}");
            }
        }
        assert!(entry_ptx(SourceFile::Unary, "no_such_kernel").is_none());
        let funcs = split_of(SourceFile::Unary).common.matches(".func").count();
        assert!(funcs > 0, "unary.cu's device functions are kept with every entry");
    }

    #[test]
    fn items_end_where_their_braces_close() {
        let ptx = ".version 9.0\n.target sm_80\n.address_size 64\n\n// c\n.global .align 4 .b8 t[2] = {1, 2};\n\
                   .func f(\n.param .b32 p\n)\n{\n ret;\n}\n.visible .entry k1(\n.param .u64 a\n)\n.maxntid 256, 1, 1\n{\n{\n}\n ret;\n}\n\
                   .visible .entry k2()\n{\n ret; // }\n}\n";
        let split = split(ptx);
        assert_eq!(split.entries.len(), 2);
        assert!(split.entries["k1"].contains(".maxntid") && split.entries["k1"].trim_end().ends_with('}'));
        assert!(split.entries["k2"].starts_with(".visible .entry k2()"));
        assert!(split.common.contains("t[2] = {1, 2};") && split.common.contains(".func f("));
        assert!(
            split
                .common
                .starts_with(".version 9.0\n.target sm_80\n.address_size 64\n")
        );
    }

    #[test]
    fn coverage_starts_at_ampere() {
        assert!(covers((8, 0)) && covers((9, 0)) && covers((12, 0)));
        assert!(!covers((7, 5)));
    }
}
