//! Kernels: CUDA C files embedded in the binary, compiled by NVRTC for the device's own
//! architecture on first use, cached per device and on disk.
//!
//! Each file in `kernels/` is one module, compiled as a whole the first time one of its kernels
//! is launched (`common.cuh` is prepended; no CUDA header is needed). The machine code is written
//! to `$XDG_CACHE_HOME/cartage/kernels` (else `~/.cache/cartage/kernels`) under a name holding
//! the file, a hash of the cache key, the architecture and the NVRTC version, so a second process
//! loads it instead of compiling. Each entry carries a magic, a format version, the SHA-256 of
//! its key (source, architecture, image kind, NVRTC options and version) and a SHA-256 over the
//! key and the image, all checked before the image reaches the driver; a changed source or
//! toolkit, a damaged file or one not private to this user is a miss and is recompiled
//! ([`crate::disk_cache`]). Functions are looked up once per device and kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cartage_core::{Device, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::disk_cache::{CacheKey, DiskCache};
use crate::nvrtc::{self, ImageKind};

const COMMON: &str = include_str!("../kernels/common.cuh");
const REDUCE_COMMON: &str = include_str!("../kernels/reduce_common.cuh");
const ROWS_COMMON: &str = include_str!("../kernels/rows_common.cuh");

/// One kernel source file (one module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceFile {
    /// `unary.cu`.
    Unary,
    /// `binary.cu`.
    Binary,
    /// `compare.cu` (comparisons and where).
    Compare,
    /// `construct.cu` (fill, arange, random, strided copy).
    Construct,
    /// `cast.cu`.
    Cast,
    /// `reduce.cu` (sum, mean, logsumexp).
    Reduce,
    /// `extreme.cu` (max, min, argmax, argmin).
    Extreme,
    /// `softmax.cu`.
    Softmax,
    /// `index.cu` (gather, index_select and scatter).
    Index,
    /// `scan.cu` (cumsum, cumprod).
    Scan,
    /// `sort.cu` (stable sort).
    Sort,
    /// `norm.cu` (layer norm, RMS norm, cross-entropy).
    Norm,
    /// `attention.cu` (fused flash-attention forward).
    Attention,
}

impl SourceFile {
    /// Every source file.
    pub const ALL: [SourceFile; 13] = [
        SourceFile::Unary,
        SourceFile::Binary,
        SourceFile::Compare,
        SourceFile::Construct,
        SourceFile::Cast,
        SourceFile::Reduce,
        SourceFile::Extreme,
        SourceFile::Softmax,
        SourceFile::Index,
        SourceFile::Scan,
        SourceFile::Sort,
        SourceFile::Norm,
        SourceFile::Attention,
    ];

    /// The file name.
    pub const fn file_name(self) -> &'static str {
        match self {
            SourceFile::Unary => "unary.cu",
            SourceFile::Binary => "binary.cu",
            SourceFile::Compare => "compare.cu",
            SourceFile::Construct => "construct.cu",
            SourceFile::Cast => "cast.cu",
            SourceFile::Reduce => "reduce.cu",
            SourceFile::Extreme => "extreme.cu",
            SourceFile::Softmax => "softmax.cu",
            SourceFile::Index => "index.cu",
            SourceFile::Scan => "scan.cu",
            SourceFile::Sort => "sort.cu",
            SourceFile::Norm => "norm.cu",
            SourceFile::Attention => "attention.cu",
        }
    }

    fn body(self) -> &'static str {
        match self {
            SourceFile::Unary => include_str!("../kernels/unary.cu"),
            SourceFile::Binary => include_str!("../kernels/binary.cu"),
            SourceFile::Compare => include_str!("../kernels/compare.cu"),
            SourceFile::Construct => include_str!("../kernels/construct.cu"),
            SourceFile::Cast => include_str!("../kernels/cast.cu"),
            SourceFile::Reduce => include_str!("../kernels/reduce.cu"),
            SourceFile::Extreme => include_str!("../kernels/extreme.cu"),
            SourceFile::Softmax => include_str!("../kernels/softmax.cu"),
            SourceFile::Index => include_str!("../kernels/index.cu"),
            SourceFile::Scan => include_str!("../kernels/scan.cu"),
            SourceFile::Sort => include_str!("../kernels/sort.cu"),
            SourceFile::Norm => include_str!("../kernels/norm.cu"),
            SourceFile::Attention => include_str!("../kernels/attention.cu"),
        }
    }

    /// The full text NVRTC compiles: `common.cuh` (then `reduce_common.cuh` for the reduction
    /// files and `rows_common.cuh` for the row-wise ones), then the file.
    pub fn source(self) -> String {
        let reduce = match self {
            SourceFile::Reduce | SourceFile::Extreme | SourceFile::Softmax => REDUCE_COMMON,
            _ => "",
        };
        let rows = match self {
            SourceFile::Softmax | SourceFile::Norm | SourceFile::Scan => ROWS_COMMON,
            _ => "",
        };
        format!(
            "{COMMON}\n{reduce}\n{rows}\n#line 1 \"{}\"\n{}",
            self.file_name(),
            self.body()
        )
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A kernel's name, `<part>_<part>_…` (e.g. `unary_neg_f32_contig`), built from static parts so
/// that looking one up allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelName {
    /// The module holding it.
    pub file: SourceFile,
    parts: [&'static str; 4],
}

impl KernelName {
    /// A name from up to four parts (empty parts are skipped).
    pub const fn new(file: SourceFile, parts: [&'static str; 4]) -> Self {
        KernelName { file, parts }
    }

    /// The symbol in the module.
    pub fn symbol(&self) -> String {
        self.parts
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("_")
    }
}

/// How the modules of a device were obtained so far (for tests and the cold-start benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// Modules compiled by NVRTC in this process.
    pub compiled: u32,
    /// Modules loaded from the disk cache.
    pub disk_hits: u32,
    /// Time spent compiling.
    pub compile_time: Duration,
    /// Time spent reading and loading cached images.
    pub load_time: Duration,
}

/// A kernel ready to launch: its function and how many of its 256-thread blocks fit on one
/// multiprocessor at once (grid-stride kernels launch exactly one full wave of blocks, so that no
/// partial last wave idles part of the device).
#[derive(Clone, Debug)]
pub struct LoadedKernel {
    /// The function.
    pub function: CudaFunction,
    /// Resident 256-thread blocks per multiprocessor (at least 1).
    pub blocks_per_sm: u32,
}

/// Threads per block of every cartage kernel.
const BLOCK: u32 = 256;

/// The target NVRTC compiles for.
#[derive(Clone, Debug)]
struct Target {
    /// `sm_90`, or `compute_XY` when NVRTC does not know the device's architecture.
    arch: String,
    kind: ImageKind,
}

/// Compiled modules and looked-up functions of one device.
pub struct KernelModules {
    device: Device,
    ctx: Arc<CudaContext>,
    target: Target,
    nvrtc_version: (i32, i32),
    disk: Option<DiskCache>,
    modules: [Mutex<Option<Arc<CudaModule>>>; SourceFile::ALL.len()],
    functions: RwLock<HashMap<KernelName, LoadedKernel>>,
    stats: Mutex<ModuleStats>,
}

impl std::fmt::Debug for KernelModules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelModules")
            .field("device", &self.device)
            .field("arch", &self.target.arch)
            .finish()
    }
}

/// The on-disk cache folder: `$XDG_CACHE_HOME/cartage/kernels`, else `~/.cache/cartage/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(base.join("cartage").join("kernels"))
}

impl KernelModules {
    /// Modules for the device of `ctx`, with compute capability `cc`.
    pub(crate) fn new(device: Device, ctx: Arc<CudaContext>, cc: (i32, i32)) -> Result<Self> {
        let nvrtc_version = nvrtc::version().ok_or_else(|| Error::BackendUnavailable {
            device,
            reason: "NVRTC is loaded but does not report its version".to_string(),
        })?;
        let own = cc.0 * 10 + cc.1;
        let archs = nvrtc::supported_archs();
        let target = if archs.is_empty() || archs.contains(&own) {
            Target {
                arch: format!("sm_{own}"),
                kind: ImageKind::Cubin,
            }
        } else {
            let best = archs.iter().copied().filter(|&a| a <= own).max().unwrap_or(archs[0]);
            tracing::warn!(%device, own, best, "NVRTC does not know this architecture; compiling PTX for an older one");
            Target {
                arch: format!("compute_{best}"),
                kind: ImageKind::Ptx,
            }
        };
        Ok(KernelModules {
            device,
            ctx,
            target,
            nvrtc_version,
            disk: default_cache_dir().and_then(DiskCache::open),
            modules: Default::default(),
            functions: RwLock::new(HashMap::new()),
            stats: Mutex::new(ModuleStats::default()),
        })
    }

    /// The architecture kernels are compiled for (`sm_90` on an H200).
    pub fn arch(&self) -> &str {
        &self.target.arch
    }

    /// NVRTC's version.
    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc_version
    }

    /// Counters of compiles and cache hits so far.
    pub fn stats(&self) -> ModuleStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `file`'s compiled image is cached on disk (whether or not it exists yet); `None`
    /// when there is no cache folder or it is not private to this user.
    pub fn cache_path(&self, file: SourceFile) -> Option<PathBuf> {
        let disk = self.disk.as_ref()?;
        Some(disk.path(&self.cache_file_name(file, &self.cache_key(file))))
    }

    /// Everything `file`'s image depends on.
    fn cache_key(&self, file: SourceFile) -> CacheKey {
        let version = format!("{}.{}", self.nvrtc_version.0, self.nvrtc_version.1);
        let options = nvrtc::options(&self.target.arch).join("\0");
        CacheKey::new(&[
            ("source", file.source().as_bytes()),
            ("arch", self.target.arch.as_bytes()),
            ("kind", self.target.kind.name().as_bytes()),
            ("options", options.as_bytes()),
            ("nvrtc", version.as_bytes()),
        ])
    }

    fn cache_file_name(&self, file: SourceFile, key: &CacheKey) -> String {
        let stem = file.file_name().trim_end_matches(".cu");
        format!(
            "{stem}-{}-{}-nvrtc{}.{}.{}",
            key.short_hex(),
            self.target.arch,
            self.nvrtc_version.0,
            self.nvrtc_version.1,
            self.target.kind.name()
        )
    }

    /// The function `name`, compiling or loading its module on first use.
    pub fn function(&self, name: KernelName) -> Result<CudaFunction> {
        Ok(self.kernel(name)?.function)
    }

    /// The kernel `name` with its occupancy, compiling or loading its module on first use.
    pub fn kernel(&self, name: KernelName) -> Result<LoadedKernel> {
        if let Some(k) = self.functions.read().unwrap_or_else(|p| p.into_inner()).get(&name) {
            return Ok(k.clone());
        }
        let module = self.module(name.file)?;
        let symbol = name.symbol();
        let function = module.load_function(&symbol).map_err(|e| Error::Driver {
            device: self.device,
            op: "load kernel",
            message: format!("{symbol} in {}: {e}", name.file.file_name()),
        })?;
        let blocks_per_sm = function
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)
            .unwrap_or(1)
            .max(1);
        let kernel = LoadedKernel {
            function,
            blocks_per_sm,
        };
        self.functions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, kernel.clone());
        Ok(kernel)
    }

    /// The loaded module of `file`, compiling it (or reading the disk cache) on first use.
    pub fn module(&self, file: SourceFile) -> Result<Arc<CudaModule>> {
        let mut slot = self.modules[file.index()].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = slot.as_ref() {
            return Ok(module.clone());
        }
        let module = self.load_or_compile(file)?;
        *slot = Some(module.clone());
        Ok(module)
    }

    /// Load `image` into the device's context, after [`nvrtc::driver_image`] has checked it
    /// (and NUL-terminated PTX): the driver is given only a pointer.
    fn load_image(&self, image: Vec<u8>) -> std::result::Result<Arc<CudaModule>, String> {
        let image = nvrtc::driver_image(self.target.kind, image)?;
        self.ctx.load_module(Ptx::from_binary(image)).map_err(|e| e.to_string())
    }

    fn load_or_compile(&self, file: SourceFile) -> Result<Arc<CudaModule>> {
        let key = self.cache_key(file);
        let name = self.cache_file_name(file, &key);
        if let Some(disk) = &self.disk {
            let started = Instant::now();
            if let Some(image) = disk.read(&name, &key) {
                match self.load_image(image) {
                    Ok(module) => {
                        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                        stats.disk_hits += 1;
                        stats.load_time += started.elapsed();
                        tracing::debug!(device = %self.device, path = %disk.path(&name).display(), "kernel module from the disk cache");
                        return Ok(module);
                    }
                    Err(e) => {
                        tracing::warn!(path = %disk.path(&name).display(), error = %e, "cached kernel image did not load; recompiling");
                    }
                }
            }
        }
        let started = Instant::now();
        let image =
            nvrtc::compile(file.file_name(), &file.source(), &self.target.arch, self.target.kind).map_err(|log| {
                Error::Driver {
                    device: self.device,
                    op: "compile kernels (NVRTC)",
                    message: log,
                }
            })?;
        let elapsed = started.elapsed();
        tracing::info!(device = %self.device, file = file.file_name(), arch = %self.target.arch, ms = elapsed.as_millis() as u64, "compiled kernels with NVRTC");
        if let Some(disk) = &self.disk
            && let Err(e) = disk.write(&name, &key, &image)
        {
            // Only the next process pays for this: it compiles again.
            tracing::warn!(path = %disk.path(&name).display(), error = %e, "could not write the kernel disk cache");
        }
        let started = Instant::now();
        let module = self.load_image(image).map_err(|message| Error::Driver {
            device: self.device,
            op: "load kernels",
            message,
        })?;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.compiled += 1;
        stats.compile_time += elapsed;
        stats.load_time += started.elapsed();
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_join_their_parts() {
        let name = KernelName::new(SourceFile::Unary, ["unary", "neg", "f32", "contig"]);
        assert_eq!(name.symbol(), "unary_neg_f32_contig");
        let short = KernelName::new(SourceFile::Construct, ["arange", "bf16", "", ""]);
        assert_eq!(short.symbol(), "arange_bf16");
    }

    /// Every kernel file compiles with NVRTC (no GPU needed, only libnvrtc); skipped loudly
    /// when NVRTC is absent.
    #[test]
    fn every_kernel_file_compiles() {
        if let Err(reason) = crate::loader::nvrtc() {
            eprintln!("SKIP every_kernel_file_compiles: {reason}");
            return;
        }
        let handles: Vec<_> = SourceFile::ALL
            .into_iter()
            .map(|file| {
                std::thread::spawn(move || {
                    nvrtc::compile(file.file_name(), &file.source(), "sm_90", ImageKind::Cubin)
                        .map(|image| (file, image.len()))
                })
            })
            .collect();
        for handle in handles {
            let (file, len) = handle
                .join()
                .expect("compile thread")
                .unwrap_or_else(|log| panic!("{log}"));
            assert!(len > 1000, "{file:?} produced {len} bytes");
        }
    }
}
