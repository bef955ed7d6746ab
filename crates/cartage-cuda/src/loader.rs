//! Finding the CUDA libraries at run time, before cudarc touches them.
//!
//! cudarc loads each library lazily and panics when it is missing. This module asks first, with
//! cudarc's own `is_culib_present` (the same candidate names its loader tries), and checks that
//! the driver exports the entry points cartage calls. When a library is not on the loader's path,
//! the usual toolkit folders (`$CUDA_PATH/lib64`, `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`)
//! are tried: a library found there is opened by full path and stays loaded, so that cudarc's
//! later `dlopen` of its plain name finds it. Each answer is computed once per process.
//!
//! The result is a reason string a user can act on, turned into `Error::BackendUnavailable`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Driver entry points cartage needs; a driver without one of them is too old.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuPointerGetAttributes",
    "cuModuleLoadData",
    "cuLinkCreate_v2",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkDestroy",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuStreamCreate",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventElapsedTime",
];

/// Libraries opened by full path from a toolkit folder, kept loaded for the process's life.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// Folders searched when a library is not on the dynamic loader's path.
fn toolkit_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs
}

/// Open every file in `dir` whose name starts with one of `prefixes` (dependencies first, as
/// listed), keeping them loaded. Returns true when at least one opened.
fn preload_from(dir: &Path, prefixes: &[&str]) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let mut any = false;
    for prefix in prefixes {
        let mut matches: Vec<&PathBuf> = names
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.contains(".so"))
            })
            .collect();
        // Prefer the most specific (longest) name, the real file behind the symlinks.
        matches.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        if let Some(path) = matches.first() {
            // SAFETY: loading a vendor CUDA library from the toolkit folder; its initialisers
            // have no preconditions, and the handle is kept for the life of the process so that
            // symbols resolved from it stay valid.
            match unsafe { libloading::Library::new(path.as_os_str()) } {
                Ok(lib) => {
                    tracing::debug!(path = %path.display(), "preloaded CUDA library");
                    PRELOADED.lock().unwrap_or_else(|p| p.into_inner()).push(lib);
                    any = true;
                }
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "could not preload"),
            }
        }
    }
    any
}

/// Run `present`; when it fails, preload `prefixes` from the toolkit folders and ask again.
fn probe(what: &str, hint: &str, prefixes: &[&str], present: fn() -> bool) -> Result<(), String> {
    let ask = || std::panic::catch_unwind(present).unwrap_or(false);
    if ask() {
        return Ok(());
    }
    for dir in toolkit_dirs() {
        if preload_from(&dir, prefixes) && ask() {
            return Ok(());
        }
    }
    Err(format!("{what} could not be loaded. {hint}"))
}

fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on the driver's candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn nvrtc_present() -> bool {
    // SAFETY: as for the driver: a `dlopen` probe of NVRTC's candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn cublas_present() -> bool {
    // SAFETY: `dlopen` probes of cuBLAS and cuBLASLt's candidate names.
    unsafe { cudarc::cublas::sys::is_culib_present() && cudarc::cublaslt::sys::is_culib_present() }
}

/// The driver (`libcuda.so`) and every entry point cartage calls, or why not.
pub fn driver() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            probe(
                "The NVIDIA driver library (libcuda.so)",
                "Is an NVIDIA driver installed? `nvidia-smi` should list the GPU; in a container, the driver must be mounted in (e.g. `--gpus all`).",
                &["libcuda.so"],
                driver_present,
            )?;
            // SAFETY: the library is present (checked above), so `culib` finds it and does not
            // panic; `get` only looks up symbol addresses.
            let lib = unsafe { cudarc::driver::sys::culib() };
            let missing: Vec<&str> = DRIVER_SYMBOLS
                .iter()
                .copied()
                // SAFETY: looking up a symbol's address; the pointer is not called here.
                .filter(|name| unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_err())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "the NVIDIA driver is too old: it lacks {}. Update the driver (cartage is built against CUDA 13.0 bindings)",
                    missing.join(", ")
                ))
            }
        })
        .clone()
}

/// NVRTC (`libnvrtc.so`), which compiles cartage's kernels at run time, or why not.
pub fn nvrtc() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            probe(
                "NVRTC (libnvrtc.so), which compiles cartage's CUDA kernels at run time,",
                "Install the CUDA toolkit's NVRTC (or the `nvidia-cuda-nvrtc` wheel) and put its lib folder on LD_LIBRARY_PATH.",
                &["libnvrtc-builtins.so", "libnvrtc.so"],
                nvrtc_present,
            )
        })
        .clone()
}

/// cuBLAS and cuBLASLt, which run matrix products, or why not.
pub fn cublas() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            probe(
                "cuBLAS (libcublas.so and libcublasLt.so)",
                "Install the CUDA toolkit's cuBLAS (or the `nvidia-cublas` wheel) and put its lib folder on LD_LIBRARY_PATH.",
                &["libcublasLt.so", "libcublas.so"],
                cublas_present,
            )
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_without_panicking() {
        // On a machine without CUDA these are errors with a reason; with CUDA they succeed.
        for (name, answer) in [("driver", driver()), ("nvrtc", nvrtc()), ("cublas", cublas())] {
            match answer {
                Ok(()) => eprintln!("loader: {name} present"),
                Err(reason) => {
                    assert!(
                        reason.contains("could not be loaded") || reason.contains("too old"),
                        "{reason}"
                    );
                    eprintln!("loader: {name} absent: {reason}");
                }
            }
        }
    }
}
