//! Which library runs a product: cuBLASLt with its heuristic's algorithm, cuBLASLt with the
//! algorithm an on-device search picked, or the classic `cublasGemmEx` ([`crate::blas`]).
//!
//! # The default, per shape
//! With [`MatmulLibrary::Auto`] and the search off:
//! - a matrix-vector product (the GEMM's `m` or `n` is 1, e.g. one token through a weight) runs
//!   on GemmEx: cuBLAS's classic path sends it to dedicated GEMV kernels, while cuBLASLt offers
//!   only GEMM algorithms, which leave most of the tile empty for a single column;
//! - f64 runs on GemmEx: cuBLASLt's double-precision algorithms are few and bring nothing here;
//! - every other product runs on cuBLASLt with the heuristic's first algorithm, an explicit
//!   workspace (32 MiB on Hopper, 4 MiB before, NVIDIA's recommendation) and its descriptors
//!   built once per problem and cached, so a repeated shape costs one `cublasLtMatmul`;
//! - when cuBLASLt refuses a problem (no algorithm, an error), GemmEx runs it, and the refusal
//!   is remembered for that problem.
//!
//! With the search on ([`cartage_core::Backend::set_matmul_algo_search`], or
//! `CARTAGE_MATMUL_SEARCH=1` in the environment from the start) the first product of
//! each problem times the heuristic's best [`SEARCH_CANDIDATES`] algorithms, and GemmEx for a
//! plain product, with device events ([`SEARCH_REPEATS`] runs each after one warm-up) and keeps
//! the fastest for every later product of that problem. A problem is its sizes, transposes,
//! leading dimensions, batch strides, dtype and precision, epilogue and operand alignments
//! ([`LtProblem`]). [`MatmulCounters::searches`] counts the searches run.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use cartage_core::raw::Allocation;
use cartage_core::{Error, Result};
use cudarc::driver::sys::CUevent_flags;

use crate::backend::CudaBackend;
use crate::blas::{Gemm, GemmKind};
use crate::driver;
use crate::lt::{Epilogue, LtHandle, LtPlan, LtProblem};

/// Candidates timed by the search.
pub const SEARCH_CANDIDATES: usize = 8;
/// Timed runs of each candidate (after one warm-up run).
pub const SEARCH_REPEATS: usize = 3;

/// The library a plain product runs on (a CUDA-specific setting, for A/B measurements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulLibrary {
    /// The per-shape default of the module docs (or the search's winner when it is on).
    Auto,
    /// `cublasGemmEx` for every plain product (fused linear layers still use cuBLASLt).
    GemmEx,
    /// cuBLASLt for every product it accepts (GemmEx only where it refuses).
    Lt,
}

/// How many products ran where, and how many searches ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulCounters {
    /// Algorithm searches run (one per problem while the search is on).
    pub searches: u64,
    /// Products queued through cuBLASLt.
    pub lt_products: u64,
    /// Products queued through `cublasGemmEx`.
    pub gemm_ex_products: u64,
    /// Products cuBLASLt refused or failed that GemmEx ran instead.
    pub lt_fallbacks: u64,
}

/// What a cached problem runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// cuBLASLt with this candidate of the plan.
    Lt(usize),
    /// GemmEx (the search's winner, or cuBLASLt refused the problem).
    GemmEx,
}

/// A problem's plan (none when cuBLASLt refused it) and what runs it.
struct Cached {
    plan: Option<LtPlan>,
    choice: Choice,
    searched: bool,
}

/// The cuBLASLt handle and the plans, behind the backend's mutex.
struct LtState {
    handle: LtHandle,
    plans: HashMap<LtProblem, Cached>,
}

/// The environment variable that turns the search on from the start: `1`, `on` or `true` (off
/// when unset, empty, `0`, `off` or `false`), as `set_matmul_algo_search(&device, true)` would.
pub const MATMUL_SEARCH_VAR: &str = "CARTAGE_MATMUL_SEARCH";

/// The initial search setting from [`MATMUL_SEARCH_VAR`].
fn search_from_env() -> bool {
    let Some(value) = std::env::var_os(MATMUL_SEARCH_VAR) else {
        return false;
    };
    let text = value.to_string_lossy();
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" => true,
        "" | "0" | "off" | "false" => false,
        _ => {
            tracing::warn!(value = %text, "{MATMUL_SEARCH_VAR} is none of 1, on, true, 0, off, false; the search stays off");
            false
        }
    }
}

/// The per-device routing state.
pub(crate) struct MatmulRouting {
    lt: Mutex<Option<LtState>>,
    search: AtomicBool,
    library: AtomicU8,
    searches: AtomicU64,
    lt_products: AtomicU64,
    gemm_ex_products: AtomicU64,
    lt_fallbacks: AtomicU64,
}

impl Default for MatmulRouting {
    fn default() -> Self {
        MatmulRouting {
            lt: Mutex::new(None),
            search: AtomicBool::new(search_from_env()),
            library: AtomicU8::new(0),
            searches: AtomicU64::new(0),
            lt_products: AtomicU64::new(0),
            gemm_ex_products: AtomicU64::new(0),
            lt_fallbacks: AtomicU64::new(0),
        }
    }
}

impl MatmulRouting {
    pub(crate) fn search(&self) -> bool {
        self.search.load(Ordering::Relaxed)
    }

    pub(crate) fn set_search(&self, on: bool) {
        self.search.store(on, Ordering::Relaxed);
    }

    pub(crate) fn library(&self) -> MatmulLibrary {
        match self.library.load(Ordering::Relaxed) {
            1 => MatmulLibrary::GemmEx,
            2 => MatmulLibrary::Lt,
            _ => MatmulLibrary::Auto,
        }
    }

    pub(crate) fn set_library(&self, library: MatmulLibrary) {
        let code = match library {
            MatmulLibrary::Auto => 0,
            MatmulLibrary::GemmEx => 1,
            MatmulLibrary::Lt => 2,
        };
        self.library.store(code, Ordering::Relaxed);
    }

    pub(crate) fn counters(&self) -> MatmulCounters {
        MatmulCounters {
            searches: self.searches.load(Ordering::Relaxed),
            lt_products: self.lt_products.load(Ordering::Relaxed),
            gemm_ex_products: self.gemm_ex_products.load(Ordering::Relaxed),
            lt_fallbacks: self.lt_fallbacks.load(Ordering::Relaxed),
        }
    }

    /// Problems with a cached plan or decision.
    pub(crate) fn cached_problems(&self) -> usize {
        self.lt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, |s| s.plans.len())
    }
}

/// The largest workspace offered to cuBLASLt on a device of compute capability `cc`.
fn max_workspace(cc: (i32, i32)) -> usize {
    if cc.0 >= 9 { 32 << 20 } else { 4 << 20 }
}

/// True when a plain product goes to GemmEx without asking cuBLASLt (see the module docs).
fn plain_prefers_gemm_ex(gemm: &Gemm, library: MatmulLibrary, search: bool) -> bool {
    match library {
        MatmulLibrary::GemmEx => true,
        MatmulLibrary::Lt => gemm.kind == GemmKind::F64,
        MatmulLibrary::Auto => gemm.kind == GemmKind::F64 || (!search && (gemm.m == 1 || gemm.n == 1)),
    }
}

fn cublas_error(backend: &CudaBackend, op: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> Error {
    let device = backend.device;
    move |e| Error::Driver {
        device,
        op,
        message: e.to_string(),
    }
}

/// Queue `gemm` on the compute stream: GemmEx or cuBLASLt as the module docs say, with
/// `epilogue` (reading `bias`) applied by cuBLASLt. Returns true when the epilogue was applied,
/// false when the product ran on GemmEx without it (the caller then applies it).
///
/// # Safety
/// As [`crate::blas::Blas::gemm`]: every address in `gemm` (and `bias`, `m` elements when the
/// epilogue has one) is device memory of this backend holding its operand, already ordered on
/// the compute stream after its earlier users, live until the queued work completes.
pub(crate) unsafe fn queue(backend: &CudaBackend, gemm: &Gemm, epilogue: Epilogue, bias: Option<u64>) -> Result<bool> {
    if epilogue.has_bias() != bias.is_some() {
        return Err(Error::invalid(
            "linear",
            "a bias epilogue needs the bias's address, and no other epilogue takes one",
        ));
    }
    let routing = &backend.routing;
    let search = routing.search();
    let plain = epilogue == Epilogue::None;
    if plain && plain_prefers_gemm_ex(gemm, routing.library(), search) {
        // SAFETY: forwarded contract.
        unsafe { gemm_ex(backend, gemm) }?;
        return Ok(false);
    }
    let ran = {
        let mut slot = backend.routing.lt.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            let handle = LtHandle::new().map_err(cublas_error(backend, "create cuBLASLt handle"))?;
            *slot = Some(LtState {
                handle,
                plans: HashMap::new(),
            });
        }
        let Some(state) = slot.as_mut() else {
            return Err(Error::invalid("matmul", "no cuBLASLt handle"));
        };
        // SAFETY: forwarded contract.
        unsafe { run_lt(backend, state, gemm, epilogue, bias, search) }
    };
    match ran {
        Ok(true) => {
            routing.lt_products.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Ok(false) => {
            // SAFETY: forwarded contract.
            unsafe { gemm_ex(backend, gemm) }?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Queue `gemm` through `cublasGemmEx`.
///
/// # Safety
/// As [`queue`].
unsafe fn gemm_ex(backend: &CudaBackend, gemm: &Gemm) -> Result<()> {
    backend.routing.gemm_ex_products.fetch_add(1, Ordering::Relaxed);
    backend.with_blas(|blas| {
        // SAFETY: forwarded contract; the handle's stream is the compute stream.
        unsafe { blas.gemm(gemm) }.map_err(|e| Error::Driver {
            device: backend.device,
            op: "cublasGemmEx",
            message: e.to_string(),
        })
    })
}

/// Run the problem's cuBLASLt choice; `Ok(false)` when GemmEx should run it instead.
///
/// # Safety
/// As [`queue`].
unsafe fn run_lt(
    backend: &CudaBackend,
    state: &mut LtState,
    gemm: &Gemm,
    epilogue: Epilogue,
    bias: Option<u64>,
    search: bool,
) -> Result<bool> {
    let problem = LtProblem::of(gemm, epilogue);
    let stale = state
        .plans
        .get(&problem)
        .is_some_and(|c| search && !c.searched && c.plan.is_some());
    if stale || !state.plans.contains_key(&problem) {
        let count = if search { SEARCH_CANDIDATES } else { 1 };
        let cached = match LtPlan::new(
            &state.handle,
            &problem,
            max_workspace(backend.compute_capability),
            count,
        ) {
            Ok(plan) => Cached {
                plan: Some(plan),
                choice: Choice::Lt(0),
                searched: false,
            },
            Err(e) => {
                tracing::debug!(device = %backend.device, ?problem, error = %e, "cuBLASLt refused the problem; GemmEx runs it");
                Cached {
                    plan: None,
                    choice: Choice::GemmEx,
                    searched: true,
                }
            }
        };
        state.plans.insert(problem, cached);
    }
    let Some(cached) = state.plans.get_mut(&problem) else {
        return Ok(false);
    };
    if search
        && !cached.searched
        && let Some(plan) = cached.plan.as_ref()
    {
        // SAFETY: forwarded contract.
        cached.choice = unsafe { search_choice(backend, &state.handle, plan, gemm, epilogue, bias) }?;
        cached.searched = true;
        backend.routing.searches.fetch_add(1, Ordering::Relaxed);
    }
    let (Some(plan), Choice::Lt(index)) = (cached.plan.as_ref(), cached.choice) else {
        if cached.plan.is_none() {
            backend.routing.lt_fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        return Ok(false);
    };
    // SAFETY: forwarded contract.
    match unsafe { run_candidate(backend, &state.handle, plan, index, gemm, bias) } {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::warn!(device = %backend.device, ?problem, error = %e, "cublasLtMatmul failed; GemmEx runs this problem from now on");
            cached.choice = Choice::GemmEx;
            cached.plan = None;
            cached.searched = true;
            backend.routing.lt_fallbacks.fetch_add(1, Ordering::Relaxed);
            Ok(false)
        }
    }
}

/// A workspace of `bytes` from the caching allocator, ordered on the compute stream.
fn workspace(backend: &CudaBackend, bytes: usize) -> Result<Option<Allocation>> {
    if bytes == 0 {
        return Ok(None);
    }
    let block = backend.allocator.alloc(bytes)?;
    if let Err(e) = backend.order.before_compute(&backend.compute, &[block.slice()]) {
        backend.allocator.free(block);
        return Err(e);
    }
    Ok(Some(block))
}

/// Queue candidate `index` of `plan` with its own workspace, returned in stream order.
///
/// # Safety
/// As [`queue`].
unsafe fn run_candidate(
    backend: &CudaBackend,
    handle: &LtHandle,
    plan: &LtPlan,
    index: usize,
    gemm: &Gemm,
    bias: Option<u64>,
) -> Result<()> {
    let bytes = plan.candidates[index.min(plan.candidates.len() - 1)].workspaceSize;
    let space = workspace(backend, bytes)?;
    let addr = space.as_ref().map_or(0, |s| s.slice().addr());
    // SAFETY: the caller's contract covers the operands; the workspace is a live block of at
    // least the candidate's size, freed below only in stream order.
    let ran = unsafe { plan.run(handle, index, gemm, bias, addr, &backend.compute) };
    if let Some(space) = space {
        backend.allocator.free(space);
    }
    ran.map_err(cublas_error(backend, "cublasLtMatmul"))
}

/// Time every candidate of `plan` (and GemmEx for a plain product) on the device and return the
/// fastest. The output is written by every run; the inputs are only read, so the final run
/// leaves the right result.
///
/// # Safety
/// As [`queue`].
unsafe fn search_choice(
    backend: &CudaBackend,
    handle: &LtHandle,
    plan: &LtPlan,
    gemm: &Gemm,
    epilogue: Epilogue,
    bias: Option<u64>,
) -> Result<Choice> {
    let event = || {
        backend
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver::error(backend.device, "create event"))
    };
    let time = |run: &dyn Fn() -> Result<()>| -> Result<Option<f32>> {
        if run().is_err() {
            return Ok(None);
        }
        let (start, end) = (event()?, event()?);
        start
            .record(&backend.compute)
            .map_err(driver::error(backend.device, "record event"))?;
        for _ in 0..SEARCH_REPEATS {
            if run().is_err() {
                return Ok(None);
            }
        }
        end.record(&backend.compute)
            .map_err(driver::error(backend.device, "record event"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(driver::error(backend.device, "event elapsed time"))?;
        Ok(Some(ms))
    };
    let mut best: Option<(f32, Choice)> = None;
    let mut consider = |ms: Option<f32>, choice: Choice| {
        if let Some(ms) = ms
            && best.is_none_or(|(b, _)| ms < b)
        {
            best = Some((ms, choice));
        }
    };
    for index in 0..plan.candidates.len() {
        // SAFETY: forwarded contract.
        let ms = time(&|| unsafe { run_candidate(backend, handle, plan, index, gemm, bias) })?;
        tracing::debug!(device = %backend.device, index, ?ms, "cuBLASLt candidate timed");
        consider(ms, Choice::Lt(index));
    }
    if epilogue == Epilogue::None {
        let blas = || {
            backend.with_blas(|blas| {
                // SAFETY: forwarded contract.
                unsafe { blas.gemm(gemm) }.map_err(|e| Error::Driver {
                    device: backend.device,
                    op: "cublasGemmEx",
                    message: e.to_string(),
                })
            })
        };
        let ms = time(&blas)?;
        tracing::debug!(device = %backend.device, ?ms, "GemmEx timed");
        consider(ms, Choice::GemmEx);
    }
    let choice = best.map_or(Choice::Lt(0), |(_, c)| c);
    tracing::info!(device = %backend.device, m = gemm.m, n = gemm.n, k = gemm.k, batch = gemm.batch, ?choice, "matmul algorithm search");
    Ok(choice)
}
