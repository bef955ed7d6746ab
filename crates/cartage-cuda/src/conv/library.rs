//! Finding cuDNN at run time and naming its errors.
//!
//! cudarc loads cuDNN lazily and panics when the library or a symbol is missing, so this module
//! asks first, once per process ([`available`]): cudarc's own candidate names on the loader's
//! path, else `libcudnn.so.9` opened by full path from `$CUDNN_PATH`, `$CUDNN_HOME`,
//! `$CUDA_PATH`, `$CUDA_HOME` (each's `lib64`, `lib` or itself) or `/usr/local/cuda/lib64`;
//! then every entry point the forward convolution calls, and version 9 or later. The backward
//! passes' entry points are checked apart ([`backward_available`]), so a library without them
//! still convolves forward and only the backward ops go unlisted; so are the algorithm search's
//! ([`search_available`]): without them every plan keeps cuDNN's heuristic choice; and the
//! graph API's ([`graph_available`]): without them every convolution takes the legacy API.
//!
//! cuDNN 9's main library opens its sub-libraries (`libcudnn_cnn.so.9`, …) by name when first
//! used, so another cuDNN earlier on the loader's path would be mixed in
//! (`CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`): [`load_sublibraries`] opens them first by full
//! path from the main library's own folder.

use std::ffi::{CStr, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cartage_core::{Device, Error};
use cudarc::cudnn::result::CudnnError;
use cudarc::cudnn::sys;

/// cuDNN entry points the forward convolution calls; a library without one of them is refused
/// at probe time.
const SYMBOLS: &[&str] = &[
    "cudnnGetVersion",
    "cudnnGetErrorString",
    "cudnnCnnVersionCheck",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensorNdDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionMathType",
    "cudnnSetConvolutionGroupCount",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnConvolutionForward",
];

/// The entry points the backward passes call besides [`SYMBOLS`].
const BACKWARD_SYMBOLS: &[&str] = &[
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnConvolutionBackwardData",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnConvolutionBackwardFilter",
];

/// The entry points of the algorithm search (`cudnnFind…AlgorithmEx`).
const SEARCH_SYMBOLS: &[&str] = &[
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
];

/// The entry points of the graph (backend) API.
const GRAPH_SYMBOLS: &[&str] = &[
    "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendGetAttribute",
    "cudnnBackendFinalize",
    "cudnnBackendExecute",
];

/// Libraries opened by full path from a folder off the loader's path, kept for the process.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

fn present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on cuDNN's candidate names.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Folders tried when cuDNN is not on the loader's path.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDNN_PATH", "CUDNN_HOME", "CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.extend([root.join("lib64"), root.join("lib"), root]);
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// Open `libcudnn.so.9` by full path from the first search folder that has it (cudarc's later
/// `dlopen` of the plain name then finds the loaded library).
fn preload() -> bool {
    for dir in search_dirs() {
        for name in ["libcudnn.so.9", "libcudnn.so"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            // SAFETY: loading the vendor's cuDNN library; its initialisers have no
            // preconditions, and the handle is kept for the process's life so that symbols
            // resolved from it stay valid.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    tracing::debug!(path = %path.display(), "preloaded cuDNN");
                    PRELOADED.lock().unwrap_or_else(|p| p.into_inner()).push(lib);
                    return present();
                }
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "could not preload cuDNN"),
            }
        }
    }
    false
}

fn probe() -> std::result::Result<(), String> {
    if !present() && !preload() {
        return Err(
            "cuDNN (libcudnn.so.9) could not be loaded. Install cuDNN 9 (or the `nvidia-cudnn-cu13` wheel) \
             and put its lib folder on LD_LIBRARY_PATH or set CUDNN_PATH to its root; without it conv2d runs as \
             im2col and a matmul"
                .into(),
        );
    }
    lacking(SYMBOLS)?;
    // SAFETY: the symbol exists (checked above); the call takes no arguments.
    let version = unsafe { sys::cudnnGetVersion() };
    if version < 90000 {
        return Err(format!(
            "cuDNN (libcudnn.so) is version {version}; cartage needs cuDNN 9 (9.0.0 or later)"
        ));
    }
    tracing::debug!(version, "cuDNN loaded");
    Ok(())
}

/// `Err` naming the entry points of `symbols` the loaded cuDNN lacks.
///
/// Call only once cuDNN is present (`probe` checked it).
fn lacking(symbols: &[&str]) -> std::result::Result<(), String> {
    // SAFETY: the library is present (the caller checked), so `culib` finds it and does not
    // panic; `get` only looks up symbol addresses.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = symbols
        .iter()
        .copied()
        // SAFETY: looking up a symbol's address; the pointer is not called here.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "cuDNN (libcudnn.so) lacks {}: cartage needs cuDNN 9",
            missing.join(", ")
        ))
    }
}

/// cuDNN loaded with every entry point the forward convolution needs, or why not (computed
/// once per process).
pub(crate) fn available() -> std::result::Result<(), String> {
    static ANSWER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    ANSWER.get_or_init(probe).clone()
}

/// [`available`], and the backward passes' entry points present too, or why not (computed once
/// per process).
pub(crate) fn backward_available() -> std::result::Result<(), String> {
    static ANSWER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| available().and_then(|()| lacking(BACKWARD_SYMBOLS)))
        .clone()
}

/// [`available`], and the algorithm search's entry points present too, or why not (computed once
/// per process).
pub(crate) fn search_available() -> std::result::Result<(), String> {
    static ANSWER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| available().and_then(|()| lacking(SEARCH_SYMBOLS)))
        .clone()
}

/// [`available`], and the graph API's entry points present too, or why not (computed once per
/// process). Without them every convolution runs through the legacy API.
pub(crate) fn graph_available() -> std::result::Result<(), String> {
    static ANSWER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| available().and_then(|()| lacking(GRAPH_SYMBOLS)))
        .clone()
}

/// A cuDNN error as core's driver error, with cuDNN's own words.
pub(super) fn cudnn_error(device: Device, op: &'static str) -> impl Fn(CudnnError) -> Error {
    move |e| {
        // SAFETY: `cudnnGetErrorString` returns a static NUL-terminated string for any status.
        let text = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(e.0)) };
        Error::Driver {
            device,
            op,
            message: format!("{:?}: {}", e.0, text.to_string_lossy()),
        }
    }
}

/// cuDNN 9's sub-libraries, each after those it depends on.
const SUBLIBRARIES: &[&str] = &[
    "libcudnn_graph.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
];

/// The folder of the cuDNN library cudarc loaded (from the address of one of its symbols).
#[cfg(unix)]
fn main_library_dir() -> Option<PathBuf> {
    // SAFETY: called after `available` succeeded, so `culib` returns the loaded library; the
    // symbol's address is only passed to `dladdr`, which reads the loader's tables.
    let addr = unsafe { *sys::culib().get::<*const c_void>(b"cudnnGetVersion").ok()? };
    // SAFETY: `Dl_info` is plain C data, valid zeroed; `dladdr` fills it for a loaded address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` lies in a loaded library and `info` is a valid out-pointer.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated path owned by the loader, non-null (checked).
    let path = Path::new(unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?);
    // Through a symbolic link, to the folder that holds the real library and its siblings.
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    real.parent().map(Path::to_path_buf)
}

#[cfg(not(unix))]
fn main_library_dir() -> Option<PathBuf> {
    None
}

/// Open cuDNN's sub-libraries from the main library's folder (once per process), so that its
/// own lookups by name find these; returns that folder when known.
pub(super) fn load_sublibraries() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = main_library_dir()?;
        for name in SUBLIBRARIES {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            // SAFETY: loading a vendor cuDNN library beside the main one; its initialisers
            // have no preconditions, and the handle is kept for the process's life.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => PRELOADED.lock().unwrap_or_else(|p| p.into_inner()).push(lib),
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "could not preload a cuDNN sub-library"),
            }
        }
        tracing::debug!(dir = %dir.display(), "cuDNN sub-libraries opened from the main library's folder");
        Some(dir)
    })
    .clone()
}
