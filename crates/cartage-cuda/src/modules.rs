//! Kernels: CUDA C files embedded in the binary with their PTX compiled ahead of time, loaded
//! per module on first use, cached per device and on disk.
//!
//! Where a kernel comes from ([`ModuleOrigin`]), in order:
//! 1. on devices the committed PTX covers ([`crate::precompiled`], when it matches the source):
//!    each kernel alone, the first time it is launched: its machine code from the disk cache,
//!    else its entry cut out of the module's PTX and compiled for the device by the driver's JIT
//!    (tens of milliseconds, where a whole module takes the JIT seconds);
//! 2. otherwise (older devices, stale PTX, or PTX the driver refuses, e.g. a driver older than
//!    the NVRTC that built it) each file in `kernels/` is one module, loaded as a whole the first
//!    time one of its kernels is launched: from the disk cache, else compiled by NVRTC for the
//!    device's own architecture (`common.cuh` is prepended; no CUDA header is needed).
//!
//! The machine code is written
//! to `$XDG_CACHE_HOME/cartage/kernels` (else `~/.cache/cartage/kernels`) under a name holding
//! the file, a hash of the cache key, the architecture and the NVRTC version, so a second process
//! loads it instead of compiling. Each entry carries a magic, a format version, the SHA-256 of
//! its key (source, architecture, image kind, NVRTC options and version) and a SHA-256 over the
//! key and the image, all checked before the image reaches the driver; a changed source or
//! toolkit, a damaged file or one not private to this user is a miss and is recompiled
//! (the `disk_cache` module). Functions are looked up once per device and kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cartage_core::{Device, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::disk_cache::{CacheKey, DiskCache};
use crate::nvrtc::{self, ImageKind};
use crate::{driver, precompiled};

const COMMON: &str = include_str!("../kernels/common.cuh");
const REDUCE_COMMON: &str = include_str!("../kernels/reduce_common.cuh");
const ROWS_COMMON: &str = include_str!("../kernels/rows_common.cuh");
const ATTENTION_MMA: &str = include_str!("../kernels/attention_mma.cuh");
const ATTENTION_F32: &str = include_str!("../kernels/attention_f32.cuh");

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
    /// `sort_radix.cu` (stable radix sort of long rows).
    SortRadix,
    /// `norm.cu` (layer norm, RMS norm, cross-entropy).
    Norm,
    /// `attention.cu` (fused flash-attention forward).
    Attention,
    /// `attention_backward.cu` (fused attention backward, a warp per row).
    AttentionBackward,
    /// `attention_flash_backward.cu` (tiled flash-attention backward on the tensor cores).
    AttentionFlashBackward,
    /// `attention_f32.cu` (fused flash-attention forward in f32 on the CUDA cores).
    AttentionF32,
    /// `attention_f32_backward.cu` (tiled flash-attention backward in f32 on the CUDA cores).
    AttentionF32Backward,
    /// `backward.cu` (softmax, norm and cross-entropy backward).
    Backward,
    /// `update.cu` (the fused optimizer step).
    Update,
    /// `pool.cu` (2-D max and average pooling, forward and backward).
    Pool,
}

impl SourceFile {
    /// Every source file.
    pub const ALL: [SourceFile; 21] = [
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
        SourceFile::SortRadix,
        SourceFile::Norm,
        SourceFile::Attention,
        SourceFile::AttentionBackward,
        SourceFile::AttentionFlashBackward,
        SourceFile::AttentionF32,
        SourceFile::AttentionF32Backward,
        SourceFile::Backward,
        SourceFile::Update,
        SourceFile::Pool,
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
            SourceFile::SortRadix => "sort_radix.cu",
            SourceFile::Norm => "norm.cu",
            SourceFile::Attention => "attention.cu",
            SourceFile::AttentionBackward => "attention_backward.cu",
            SourceFile::AttentionFlashBackward => "attention_flash_backward.cu",
            SourceFile::AttentionF32 => "attention_f32.cu",
            SourceFile::AttentionF32Backward => "attention_f32_backward.cu",
            SourceFile::Backward => "backward.cu",
            SourceFile::Update => "update.cu",
            SourceFile::Pool => "pool.cu",
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
            SourceFile::SortRadix => include_str!("../kernels/sort_radix.cu"),
            SourceFile::Norm => include_str!("../kernels/norm.cu"),
            SourceFile::Attention => include_str!("../kernels/attention.cu"),
            SourceFile::AttentionBackward => include_str!("../kernels/attention_backward.cu"),
            SourceFile::AttentionFlashBackward => include_str!("../kernels/attention_flash_backward.cu"),
            SourceFile::AttentionF32 => include_str!("../kernels/attention_f32.cu"),
            SourceFile::AttentionF32Backward => include_str!("../kernels/attention_f32_backward.cu"),
            SourceFile::Backward => include_str!("../kernels/backward.cu"),
            SourceFile::Update => include_str!("../kernels/update.cu"),
            SourceFile::Pool => include_str!("../kernels/pool.cu"),
        }
    }

    /// The full text NVRTC compiles: `common.cuh` (then `reduce_common.cuh` for the reduction
    /// files, `rows_common.cuh` for the row-wise ones, `attention_mma.cuh` for the
    /// flash-attention ones and `attention_f32.cuh` after it for the f32 ones), then the file.
    pub fn source(self) -> String {
        let reduce = match self {
            SourceFile::Reduce | SourceFile::Extreme | SourceFile::Softmax => REDUCE_COMMON,
            _ => "",
        };
        let rows = match self {
            SourceFile::Softmax | SourceFile::Norm | SourceFile::Scan | SourceFile::Backward => ROWS_COMMON.to_string(),
            SourceFile::Attention | SourceFile::AttentionFlashBackward => ATTENTION_MMA.to_string(),
            SourceFile::AttentionF32 | SourceFile::AttentionF32Backward => format!("{ATTENTION_MMA}\n{ATTENTION_F32}"),
            _ => String::new(),
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

/// How the kernels of a device were obtained so far (for tests and the cold-start benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// Modules compiled by NVRTC in this process.
    pub compiled: u32,
    /// Images loaded from the disk cache (one kernel each from the PTX, a module from NVRTC).
    pub disk_hits: u32,
    /// Kernels built from the committed PTX by the driver's JIT in this process.
    pub precompiled: u32,
    /// Time spent compiling with NVRTC.
    pub compile_time: Duration,
    /// Time the driver's JIT spent on committed PTX.
    pub jit_time: Duration,
    /// Time spent reading and loading cached images.
    pub load_time: Duration,
}

/// Where a loaded kernel's machine code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// The disk cache: built by an earlier process (from PTX or by NVRTC).
    DiskCache,
    /// The committed PTX, compiled for this device by the driver's JIT in this process.
    Precompiled,
    /// The source, compiled by NVRTC in this process.
    Nvrtc,
}

impl ModuleOrigin {
    /// A short name for reports (`disk cache`, `ptx`, `nvrtc`).
    pub const fn name(self) -> &'static str {
        match self {
            ModuleOrigin::DiskCache => "disk cache",
            ModuleOrigin::Precompiled => "ptx",
            ModuleOrigin::Nvrtc => "nvrtc",
        }
    }
}

/// A loaded module and where it came from.
type LoadedModule = (Arc<CudaModule>, ModuleOrigin);

/// How many of a source file's kernels were loaded from each origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginCounts {
    /// Kernels whose machine code came from the disk cache.
    pub disk_cache: u32,
    /// Kernels built from the committed PTX in this process.
    pub precompiled: u32,
    /// Kernels of a module NVRTC compiled in this process.
    pub nvrtc: u32,
}

impl OriginCounts {
    fn add(&mut self, origin: ModuleOrigin) {
        match origin {
            ModuleOrigin::DiskCache => self.disk_cache += 1,
            ModuleOrigin::Precompiled => self.precompiled += 1,
            ModuleOrigin::Nvrtc => self.nvrtc += 1,
        }
    }

    /// Kernels loaded in all.
    pub fn total(&self) -> u32 {
        self.disk_cache + self.precompiled + self.nvrtc
    }
}

/// How a kernel is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Alone, from the committed PTX through the driver's JIT.
    Precompiled,
    /// With its whole module, from the source through NVRTC.
    Nvrtc,
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
    /// The device's own architecture (`sm_90`), what the driver's JIT builds for.
    device_arch: String,
    compute_capability: (i32, i32),
    driver_version: String,
    use_precompiled: AtomicBool,
    /// Set when the driver refused committed PTX: every later kernel goes to NVRTC at once.
    ptx_refused: AtomicBool,
    loaded: Mutex<[OriginCounts; SourceFile::ALL.len()]>,
    nvrtc_version: (i32, i32),
    disk: Option<DiskCache>,
    modules: [Mutex<Option<LoadedModule>>; SourceFile::ALL.len()],
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
        let driver_version = driver::driver_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "unknown".into());
        Ok(KernelModules {
            device,
            ctx,
            target,
            device_arch: format!("sm_{own}"),
            compute_capability: cc,
            driver_version,
            use_precompiled: AtomicBool::new(true),
            ptx_refused: AtomicBool::new(false),
            loaded: Mutex::new(Default::default()),
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

    /// Whether kernels loaded from now on may come from the committed PTX (on by default; off
    /// loads every module not yet loaded through NVRTC, as for a device the PTX does not cover:
    /// for tests of that path and cold-start comparisons).
    pub fn set_use_precompiled(&self, on: bool) {
        self.use_precompiled.store(on, Ordering::Relaxed);
    }

    /// How the kernels of `file` are built.
    fn route(&self, file: SourceFile) -> Route {
        if self.use_precompiled.load(Ordering::Relaxed)
            && !self.ptx_refused.load(Ordering::Relaxed)
            && precompiled::covers(self.compute_capability)
            && precompiled::is_fresh(file)
        {
            Route::Precompiled
        } else {
            Route::Nvrtc
        }
    }

    /// Where the machine code of kernel `name` is cached on disk (whether or not it exists yet),
    /// for the way it is built now: its own entry from the PTX, or its module's from NVRTC;
    /// `None` when there is no cache folder or it is not private to this user.
    pub fn cache_path(&self, name: KernelName) -> Option<PathBuf> {
        let disk = self.disk.as_ref()?;
        let symbol = name.symbol();
        let entry = match self.route(name.file) {
            Route::Precompiled => {
                precompiled::entry_ptx(name.file, &symbol).map(|ptx| self.entry_cache_entry(&symbol, &ptx).0)
            }
            Route::Nvrtc => None,
        };
        let file_name = entry.unwrap_or_else(|| self.cache_file_name(name.file, &self.cache_key(name.file)));
        Some(disk.path(&file_name))
    }

    /// How many kernels of each source file were loaded from each origin so far.
    pub fn origins(&self) -> Vec<(SourceFile, OriginCounts)> {
        let loaded = *self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        SourceFile::ALL
            .into_iter()
            .map(|file| (file, loaded[file.index()]))
            .collect()
    }

    /// One line for reports: for each source file, how many of its kernels came from the
    /// committed PTX, the disk cache and NVRTC so far, or, before any was loaded, how its kernels
    /// will be built (`ptx`: one by one from the committed PTX; `nvrtc`: the whole module).
    pub fn origin_summary(&self) -> String {
        self.origins()
            .into_iter()
            .map(|(file, counts)| {
                let stem = file.file_name().trim_end_matches(".cu");
                if counts.total() == 0 {
                    let planned = match self.route(file) {
                        Route::Precompiled => "ptx",
                        Route::Nvrtc => "nvrtc",
                    };
                    return format!("{stem}: {planned}");
                }
                let parts: Vec<String> = [
                    (counts.precompiled, ModuleOrigin::Precompiled),
                    (counts.disk_cache, ModuleOrigin::DiskCache),
                    (counts.nvrtc, ModuleOrigin::Nvrtc),
                ]
                .into_iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, origin)| format!("{n} {}", origin.name()))
                .collect();
                format!("{stem}: {}", parts.join(" + "))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The disk cache's file name and key of the single-entry `ptx` of `symbol`, built by the
    /// driver's JIT for this device.
    fn entry_cache_entry(&self, symbol: &str, ptx: &str) -> (String, CacheKey) {
        let key = CacheKey::new(&[
            ("ptx", ptx.as_bytes()),
            ("arch", self.device_arch.as_bytes()),
            ("kind", ImageKind::Cubin.name().as_bytes()),
            ("driver", self.driver_version.as_bytes()),
        ]);
        let name = format!(
            "{symbol}-{}-{}-ptxjit{}.cubin",
            key.short_hex(),
            self.device_arch,
            self.driver_version
        );
        (name, key)
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

    /// The kernel `name` with its occupancy, building or loading it on first use.
    pub fn kernel(&self, name: KernelName) -> Result<LoadedKernel> {
        if let Some(k) = self.functions.read().unwrap_or_else(|p| p.into_inner()).get(&name) {
            return Ok(k.clone());
        }
        let symbol = name.symbol();
        let (function, origin) = match self.precompiled_function(name.file, &symbol) {
            Some(loaded) => loaded,
            None => {
                let (module, origin) = self.module_with_origin(name.file)?;
                let function = module.load_function(&symbol).map_err(|e| Error::Driver {
                    device: self.device,
                    op: "load kernel",
                    message: format!("{symbol} in {}: {e}", name.file.file_name()),
                })?;
                (function, origin)
            }
        };
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())[name.file.index()].add(origin);
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

    /// The whole module of `file` (every kernel of the file, from the disk cache or NVRTC),
    /// loading or compiling it on first use.
    pub fn module(&self, file: SourceFile) -> Result<Arc<CudaModule>> {
        Ok(self.module_with_origin(file)?.0)
    }

    fn module_with_origin(&self, file: SourceFile) -> Result<LoadedModule> {
        let mut slot = self.modules[file.index()].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(loaded) = slot.as_ref() {
            return Ok(loaded.clone());
        }
        let loaded = self.load_or_compile(file)?;
        tracing::debug!(device = %self.device, file = file.file_name(), origin = loaded.1.name(), "kernel module loaded");
        *slot = Some(loaded.clone());
        Ok(loaded)
    }

    /// `symbol` of `file` alone from the committed PTX: its machine code from the disk cache,
    /// else built by the driver's JIT and cached. `None` when the PTX does not apply here, lacks
    /// the entry, or the driver refuses it (then its module goes through NVRTC).
    fn precompiled_function(&self, file: SourceFile, symbol: &str) -> Option<(CudaFunction, ModuleOrigin)> {
        if self.route(file) != Route::Precompiled {
            return None;
        }
        let ptx = precompiled::entry_ptx(file, symbol)?;
        let (name, key) = self.entry_cache_entry(symbol, &ptx);
        let (module, origin) = match self.load_cached(ImageKind::Cubin, &name, &key) {
            Some(module) => (module, ModuleOrigin::DiskCache),
            None => match self.jit_entry(symbol, ptx, &name, &key) {
                Ok(module) => (module, ModuleOrigin::Precompiled),
                Err(e) => {
                    tracing::warn!(device = %self.device, symbol, error = %e, "the driver refused the committed PTX; compiling the sources with NVRTC from now on");
                    self.ptx_refused.store(true, Ordering::Relaxed);
                    return None;
                }
            },
        };
        match module.load_function(symbol) {
            Ok(function) => Some((function, origin)),
            Err(e) => {
                tracing::warn!(device = %self.device, symbol, error = %e, "a kernel built from the PTX did not load; using NVRTC");
                None
            }
        }
    }

    /// Load `image` into the device's context, after [`nvrtc::driver_image`] has checked it
    /// (and NUL-terminated PTX): the driver is given only a pointer.
    fn load_image(&self, kind: ImageKind, image: Vec<u8>) -> std::result::Result<Arc<CudaModule>, String> {
        let image = nvrtc::driver_image(kind, image)?;
        self.ctx.load_module(Ptx::from_binary(image)).map_err(|e| e.to_string())
    }

    /// The disk cache's image for `name`/`key`, loaded, or `None` (a miss or an image that does
    /// not load, which is rebuilt and overwritten).
    fn load_cached(&self, kind: ImageKind, name: &str, key: &CacheKey) -> Option<Arc<CudaModule>> {
        let disk = self.disk.as_ref()?;
        let started = Instant::now();
        let image = disk.read(name, key)?;
        match self.load_image(kind, image) {
            Ok(module) => {
                let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                stats.disk_hits += 1;
                stats.load_time += started.elapsed();
                tracing::debug!(device = %self.device, path = %disk.path(name).display(), "kernel module from the disk cache");
                Some(module)
            }
            Err(e) => {
                tracing::warn!(path = %disk.path(name).display(), error = %e, "cached kernel image did not load; rebuilding");
                None
            }
        }
    }

    fn write_disk(&self, name: &str, key: &CacheKey, image: &[u8]) {
        if let Some(disk) = &self.disk
            && let Err(e) = disk.write(name, key, image)
        {
            // Only the next process pays for this: it builds again.
            tracing::warn!(path = %disk.path(name).display(), error = %e, "could not write the kernel disk cache");
        }
    }

    /// The module of `file` from the disk cache, else compiled by NVRTC.
    fn load_or_compile(&self, file: SourceFile) -> Result<LoadedModule> {
        let key = self.cache_key(file);
        let name = self.cache_file_name(file, &key);
        if let Some(module) = self.load_cached(self.target.kind, &name, &key) {
            return Ok((module, ModuleOrigin::DiskCache));
        }
        self.compile(file, &name, &key)
            .map(|module| (module, ModuleOrigin::Nvrtc))
    }

    /// The single-entry `ptx` of `symbol` built for this device by the driver's JIT, cached on
    /// disk.
    fn jit_entry(
        &self,
        symbol: &str,
        ptx: String,
        name: &str,
        key: &CacheKey,
    ) -> std::result::Result<Arc<CudaModule>, String> {
        let started = Instant::now();
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let mut ptx = ptx.into_bytes();
        ptx.push(0);
        let cubin = driver::jit_ptx(symbol, &ptx)?;
        let elapsed = started.elapsed();
        tracing::debug!(device = %self.device, symbol, arch = %self.device_arch, ms = elapsed.as_millis() as u64, "built a kernel from the committed PTX");
        self.write_disk(name, key, &cubin);
        let loading = Instant::now();
        let module = self.load_image(ImageKind::Cubin, cubin)?;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.precompiled += 1;
        stats.jit_time += elapsed;
        stats.load_time += loading.elapsed();
        Ok(module)
    }

    /// `file` compiled by NVRTC, cached on disk.
    fn compile(&self, file: SourceFile, name: &str, key: &CacheKey) -> Result<Arc<CudaModule>> {
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
        self.write_disk(name, key, &image);
        let started = Instant::now();
        let module = self
            .load_image(self.target.kind, image)
            .map_err(|message| Error::Driver {
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
