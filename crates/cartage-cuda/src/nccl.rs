//! NCCL collectives on CUDA devices (feature `nccl`): [`NcclEngine`] opens a group, across
//! processes (one GPU each, after a rendezvous) or across the threads of one process;
//! [`NcclCommunicator`] is one rank's member and implements core's [`Collective`].
//!
//! - **Loaded at run time.** `libnccl.so.2` (NCCL's own soname: what the `libnccl2` package and
//!   the `nvidia-nccl-cu*` wheels install), then `libnccl.so`. cudarc's `nccl` feature gives the
//!   types and constants; the entry points are looked up here because cudarc's loader does not
//!   try `libnccl.so.2` and panics when a library or symbol is missing. A machine without NCCL
//!   gets [`Error::BackendUnavailable`] naming `libnccl.so.2`; nothing in the build needs NCCL.
//! - **On the communicator's own stream, asynchronous.** Each communicator has a non-blocking
//!   stream of the device's context, at the device's highest priority (NCCL's kernels take few
//!   multiprocessors, and a rank that starts late holds up every peer), so that a gradient
//!   bucket's all-reduce runs beside the backward kernels queued after it instead of between
//!   them. It is ordered with events, per segment, by the backend's [`crate::ordering`], as the
//!   copy stream is: before a collective, its stream waits for an event recorded on the compute
//!   stream after the last compute work queued on its operands' segments (and for asynchronous
//!   copies and other communicators' collectives pending on them); after it, an event recorded
//!   on its stream is kept with those segments, and the next compute work on them (the optimizer
//!   step, a read, a kernel on a block freed into the caching allocator and handed out again)
//!   and the next copy wait for it. Compute on other segments does not (the unit is the
//!   allocator's segment, as for copies: a buffer below 10 MiB shares a 2 or 20 MiB segment
//!   with others, whose compute then waits for the collective too). The call returns at once;
//!   `Backend::synchronize` waits for the collectives too, and a barrier waits for all the
//!   compute queued before it. Collectives are refused during a graph capture (the graph records
//!   the compute stream only).
//! - **Handles.** The handle waits on that event: its `wait` polls it and NCCL's asynchronous
//!   error; past the timeout (a peer died or never called) it aborts the communicator and fails
//!   with [`Error::RanksMissing`] instead of hanging.
//! - **One thread at a time** per communicator (NCCL's rule): calls take a lock.
//! - `ncclCommInitRank` blocks until every rank has joined, so join after a rendezvous (the
//!   frontend's `ProcessGroup::init` does). A rank that never joins (it died after the
//!   rendezvous) makes the others fail with [`Error::RanksMissing`] after the engine's timeout.
//!
//! Raw NCCL calls live in this file only, each through the `Nccl` table of entry points.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cartage_core::collective::{CallKind, CollectiveCall};
use cartage_core::{
    Backend, Collective, CollectiveArg, CollectiveEngine, CollectiveHandle, CopyCompletion, DType, Device,
    DeviceBuffer, Error, ReduceKind, Result,
};
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use crate::backend::CudaBackend;
use crate::driver;

/// The library names tried, in order.
const LIBRARIES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// The oldest NCCL accepted: 2.13 has `ncclAvg`, bf16 and `ncclGetLastError`.
const MIN_VERSION: c_int = 21300;
/// The size of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// NCCL's entry points (results and enums as C `int`s, so no value the library returns can be
/// an invalid Rust enum).
struct Nccl {
    _lib: libloading::Library,
    version: c_int,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int,
    comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> c_int,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> c_int,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> c_int,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, ncclComm_t, *mut c_void) -> c_int,
    reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> c_int,
}

/// The success code of every NCCL call.
const SUCCESS: c_int = 0;
/// `ncclInProgress`: an asynchronous operation has not finished.
const IN_PROGRESS: c_int = 7;

/// Open NCCL and look up every entry point, or say why not.
fn load() -> std::result::Result<Nccl, String> {
    let mut tried = Vec::new();
    let lib = LIBRARIES
        .iter()
        .find_map(|name| {
            // SAFETY: loading NCCL, a vendor library whose initialisers have no preconditions;
            // the handle lives in the table for the life of the process (a static).
            match unsafe { libloading::Library::new(*name) } {
                Ok(lib) => Some(lib),
                Err(e) => {
                    tried.push(format!("{name}: {e}"));
                    None
                }
            }
        })
        .ok_or_else(|| {
            format!(
                "NCCL (libnccl.so.2) could not be loaded ({}). Install NCCL (the `libnccl2` package), or put the folder \
                 holding libnccl.so.2 (for instance the `nvidia-nccl-cu12` wheel's nvidia/nccl/lib) on LD_LIBRARY_PATH",
                tried.join("; ")
            )
        })?;
    macro_rules! entry {
        ($name:literal) => {
            // SAFETY: the symbol's C signature (nccl.h) is the type the field declares; the
            // library stays loaded while the table exists.
            *unsafe { lib.get($name) }.map_err(|e| format!("NCCL lacks {}: {e}; update NCCL", $name))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = entry!("ncclGetVersion");
    let mut version: c_int = 0;
    // SAFETY: writes one integer through a valid pointer.
    let status = unsafe { get_version(&mut version) };
    if status != SUCCESS || version < MIN_VERSION {
        return Err(format!(
            "NCCL {} is too old: cartage needs 2.13 or newer; update NCCL",
            version_name(version)
        ));
    }
    Ok(Nccl {
        version,
        get_unique_id: entry!("ncclGetUniqueId"),
        comm_init_rank: entry!("ncclCommInitRank"),
        comm_init_all: entry!("ncclCommInitAll"),
        comm_destroy: entry!("ncclCommDestroy"),
        comm_abort: entry!("ncclCommAbort"),
        comm_get_async_error: entry!("ncclCommGetAsyncError"),
        get_error_string: entry!("ncclGetErrorString"),
        get_last_error: entry!("ncclGetLastError"),
        all_reduce: entry!("ncclAllReduce"),
        broadcast: entry!("ncclBroadcast"),
        all_gather: entry!("ncclAllGather"),
        reduce_scatter: entry!("ncclReduceScatter"),
        send: entry!("ncclSend"),
        recv: entry!("ncclRecv"),
        _lib: lib,
    })
}

/// NCCL's version code as `2.28.3`.
fn version_name(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

/// The loaded library, once per process, or why it cannot be used.
fn library() -> std::result::Result<&'static Nccl, String> {
    static LIBRARY: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    LIBRARY.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// NCCL's version (`2.28.3`) when it loads, or why it does not.
///
/// ```
/// // On a machine without NCCL this is an error naming the library, never a panic.
/// match cartage_cuda::nccl::version() {
///     Ok(version) => assert!(version.starts_with("2.")),
///     Err(reason) => assert!(reason.contains("libnccl.so.2") || reason.contains("NCCL")),
/// }
/// ```
pub fn version() -> std::result::Result<String, String> {
    library().map(|lib| version_name(lib.version))
}

/// The library, or [`Error::BackendUnavailable`] for `device`.
fn library_for(device: Device) -> Result<&'static Nccl> {
    library().map_err(|reason| Error::BackendUnavailable { device, reason })
}

impl Nccl {
    /// A failed call as [`Error::Driver`], with NCCL's message (and its last error on `comm`).
    fn error(&self, device: Device, op: &'static str, code: c_int, comm: Option<ncclComm_t>) -> Error {
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        let text = unsafe { cstr((self.get_error_string)(code)) };
        // SAFETY: `comm` is a live communicator (or null, which NCCL accepts); the returned
        // string is NUL-terminated and valid until the next NCCL call on this thread.
        let last = unsafe { cstr((self.get_last_error)(comm.unwrap_or(std::ptr::null_mut()))) };
        let message = if last.is_empty() {
            text
        } else {
            format!("{text}: {last}")
        };
        Error::Driver { device, op, message }
    }

    /// `Ok` when `code` is success, else [`Nccl::error`].
    fn check(&self, device: Device, op: &'static str, code: c_int, comm: Option<ncclComm_t>) -> Result<()> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(self.error(device, op, code, comm))
        }
    }
}

/// A C string as an owned `String` (empty for null).
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string valid for the call.
unsafe fn cstr(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// NCCL's data type for a cartage dtype (booleans travel as bytes: max of 0/1 is any).
fn data_type(dtype: DType) -> c_int {
    let t = match dtype {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U8 | DType::Bool => ncclDataType_t::ncclUint8,
    };
    t as c_int
}

fn reduction(op: ReduceKind) -> c_int {
    let r = match op {
        ReduceKind::Sum => ncclRedOp_t::ncclSum,
        ReduceKind::Avg => ncclRedOp_t::ncclAvg,
        ReduceKind::Max => ncclRedOp_t::ncclMax,
    };
    r as c_int
}

/// A communicator handle, shared by a member and its handles in flight; aborted at most once.
struct Comm {
    device: Device,
    /// `None` once destroyed or aborted.
    raw: Mutex<Option<RawComm>>,
}

/// An `ncclComm_t`. NCCL communicators may move between threads; the mutex around it gives
/// one thread at a time.
struct RawComm(ncclComm_t);

// SAFETY: an NCCL communicator is not tied to the thread that made it; every use goes through
// the `Comm` mutex, so one thread at a time calls NCCL on it.
unsafe impl Send for RawComm {}

impl Comm {
    fn lock(&self) -> MutexGuard<'_, Option<RawComm>> {
        self.raw.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// NCCL's asynchronous error on the communicator, if any (a peer failed, a network error).
    fn async_error(&self, lib: &Nccl) -> Option<Error> {
        let guard = self.lock();
        let raw = guard.as_ref()?;
        let mut state: c_int = SUCCESS;
        // SAFETY: `raw` is a live communicator (not yet destroyed: it is in the slot), used by
        // this thread alone while the guard is held; `state` is a valid out-pointer.
        let code = unsafe { (lib.comm_get_async_error)(raw.0, &mut state) };
        let failed = if code != SUCCESS { code } else { state };
        (failed != SUCCESS && failed != IN_PROGRESS)
            .then(|| lib.error(self.device, "ncclCommGetAsyncError", failed, Some(raw.0)))
    }

    /// Abort the communicator: its work in flight is cancelled and later calls fail.
    fn abort(&self, lib: &Nccl) {
        if let Some(raw) = self.lock().take() {
            // SAFETY: `raw` is live and is never used again (taken out of the slot).
            let code = unsafe { (lib.comm_abort)(raw.0) };
            if code != SUCCESS {
                tracing::error!(device = %self.device, code, "ncclCommAbort failed");
            }
        }
    }
}

/// The completion of one collective: a CUDA event after it on the communicator's stream.
struct NcclCompletion {
    event: Arc<CudaEvent>,
    comm: Arc<Comm>,
    op: &'static str,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

impl CopyCompletion for NcclCompletion {
    fn wait(&self) -> Result<()> {
        let lib = library_for(self.comm.device)?;
        self.event
            .context()
            .bind_to_thread()
            .map_err(driver::error(self.comm.device, "bind context"))?;
        let started = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match self.event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(driver::error(self.comm.device, "wait for a collective")(e)),
            }
            if let Some(error) = self.comm.async_error(lib) {
                self.comm.abort(lib);
                return Err(error);
            }
            let waited = started.elapsed();
            if waited >= self.timeout {
                tracing::error!(
                    op = self.op,
                    rank = self.rank,
                    ?waited,
                    "collective timed out: aborting the communicator"
                );
                self.comm.abort(lib);
                return Err(Error::RanksMissing {
                    op: self.op,
                    rank: self.rank,
                    world_size: self.world_size,
                    missing: Vec::new(),
                    waited,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn is_done(&self) -> bool {
        self.event.try_is_complete().unwrap_or(true)
    }
}

/// One rank of an NCCL group on one CUDA device; see the module docs.
pub struct NcclCommunicator {
    backend: Arc<CudaBackend>,
    /// The same backend, as core's trait object (for scratch buffers).
    backend_dyn: Arc<dyn Backend>,
    /// The stream this communicator's collectives run on (see the module docs).
    stream: Arc<CudaStream>,
    comm: Arc<Comm>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCommunicator")
            .field("device", &self.backend.device)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl NcclCommunicator {
    /// Queue `call` on the communicator's stream, ordered against the compute stream and the
    /// copy stream per segment, and return its handle.
    fn enqueue(&self, call: &CollectiveCall<'_>) -> Result<CollectiveHandle> {
        let device = self.backend.device;
        self.backend.refuse_in_capture(
            call.name(),
            "collectives run on the communicator's own stream, which the graph does not record",
        )?;
        let lib = library_for(device)?;
        let operands = call.kind().operands();
        for operand in &operands {
            let ours = operand
                .backend()
                .as_any()
                .downcast_ref::<CudaBackend>()
                .is_some_and(|b| std::ptr::eq(b, &*self.backend));
            if !ours {
                return Err(Error::invalid(
                    call.name(),
                    format!(
                        "an operand's memory does not belong to the CUDA backend of {device} this communicator uses"
                    ),
                ));
            }
        }
        // A barrier is an all-reduce of one byte of scratch memory (freed in stream order).
        let scratch = match call.kind() {
            CallKind::Barrier => Some(DeviceBuffer::new(&self.backend_dyn, 1)?),
            _ => None,
        };
        let guard = self.comm.lock();
        let Some(raw) = guard.as_ref() else {
            return Err(Error::BackendUnavailable {
                device,
                reason: "the NCCL communicator was aborted after an earlier failure or timeout; make a new group"
                    .into(),
            });
        };
        let comm = raw.0;
        self.backend.bind()?;
        let mut slices: Vec<_> = operands.iter().map(|o| o.bytes()).collect();
        slices.extend(scratch.as_ref().map(DeviceBuffer::slice));
        // Created before anything is queued, so that a failure here leaves nothing in flight.
        let event = Arc::new(
            self.backend
                .ctx
                .new_event(None)
                .map_err(driver::error(device, "create event"))?,
        );
        for slice in &slices {
            self.backend.order.collective_after_compute(
                &self.backend.ctx,
                &self.backend.compute,
                &self.stream,
                *slice,
            )?;
        }
        if matches!(call.kind(), CallKind::Barrier) {
            // A barrier follows all the compute this rank queued before it, not only the work on
            // its scratch byte's segment.
            let queued = self
                .backend
                .ctx
                .new_event(None)
                .map_err(driver::error(device, "create event"))?;
            queued
                .record(&self.backend.compute)
                .map_err(driver::error(device, "record event"))?;
            self.stream
                .wait(&queued)
                .map_err(driver::error(device, "order a barrier after compute"))?;
        }
        let stream = self.stream.cu_stream() as *mut c_void;
        let src = |o: &CollectiveArg<'_>| o.bytes().addr() as *const c_void;
        let dst = |o: &CollectiveArg<'_>| o.bytes().addr() as *mut c_void;
        // SAFETY: every address lies in a live block of this device's memory (each operand is
        // inside a `DeviceBuffer` borrowed for the call, checked above to belong to this backend;
        // the scratch buffer is ours), and `CollectiveCall::check` verified the element counts
        // the call reads and writes: an all-gather output holds world × input, a reduce-scatter
        // input world × output, a root or peer is a rank of the group. The stream waits (above)
        // for the compute work and copies queued on those segments so far, and every later
        // user of them, freed or not, waits for the event recorded after the call (below), so
        // no other work touches the memory meanwhile. `comm` is live and used by this thread
        // alone (guard held); `stream` is this communicator's stream, whose context is bound.
        let code = unsafe {
            match call.kind() {
                CallKind::AllReduce { buf, op } => (lib.all_reduce)(
                    src(buf),
                    dst(buf),
                    buf.numel(),
                    data_type(buf.dtype()),
                    reduction(*op),
                    comm,
                    stream,
                ),
                CallKind::Broadcast { buf, root } => (lib.broadcast)(
                    src(buf),
                    dst(buf),
                    buf.numel(),
                    data_type(buf.dtype()),
                    *root as c_int,
                    comm,
                    stream,
                ),
                CallKind::AllGather { input, output } => (lib.all_gather)(
                    src(input),
                    dst(output),
                    input.numel(),
                    data_type(input.dtype()),
                    comm,
                    stream,
                ),
                CallKind::ReduceScatter { input, output, op } => (lib.reduce_scatter)(
                    src(input),
                    dst(output),
                    output.numel(),
                    data_type(input.dtype()),
                    reduction(*op),
                    comm,
                    stream,
                ),
                CallKind::Send { buf, peer } => (lib.send)(
                    src(buf),
                    buf.numel(),
                    data_type(buf.dtype()),
                    *peer as c_int,
                    comm,
                    stream,
                ),
                CallKind::Recv { buf, peer } => (lib.recv)(
                    dst(buf),
                    buf.numel(),
                    data_type(buf.dtype()),
                    *peer as c_int,
                    comm,
                    stream,
                ),
                CallKind::Barrier => {
                    let byte = scratch
                        .as_ref()
                        .map_or(std::ptr::null_mut(), |s| s.slice().addr() as *mut c_void);
                    let uint8 = ncclDataType_t::ncclUint8 as c_int;
                    let max = ncclRedOp_t::ncclMax as c_int;
                    (lib.all_reduce)(byte, byte, 1, uint8, max, comm, stream)
                }
            }
        };
        lib.check(device, call.name(), code, Some(comm))?;
        drop(guard);
        if let Err(e) = event.record(&self.stream) {
            // The collective is queued but nothing could track it: drain the stream before the
            // operands can be reused.
            if let Err(sync) = self.stream.synchronize() {
                tracing::error!(%device, error = %sync, "could not drain the communicator's stream");
            }
            return Err(driver::error(device, "record event")(e));
        }
        for slice in &slices {
            self.backend
                .order
                .after_collective(&self.stream, *slice, Arc::clone(&event));
        }
        Ok(CollectiveHandle::new(
            call.name(),
            Arc::new(NcclCompletion {
                event,
                comm: Arc::clone(&self.comm),
                op: call.name(),
                rank: self.rank,
                world_size: self.world_size,
                timeout: self.timeout,
            }),
        ))
    }
}

impl Collective for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn device(&self) -> Device {
        self.backend.device
    }

    fn engine(&self) -> &'static str {
        "nccl"
    }

    fn run(&self, call: &CollectiveCall<'_>) -> Result<CollectiveHandle> {
        self.enqueue(call)
    }
}

impl Drop for NcclCommunicator {
    /// Wait (bounded by the timeout) for the collectives queued so far on the communicator's
    /// stream, then destroy the communicator;
    /// abort it instead when that work fails or never finishes, so a dead peer cannot hang the
    /// drop.
    fn drop(&mut self) {
        let Ok(lib) = library() else { return };
        let flushed = self
            .backend
            .bind()
            .and_then(|()| {
                self.backend
                    .ctx
                    .new_event(None)
                    .map_err(driver::error(self.backend.device, "create event"))
            })
            .and_then(|event| {
                event
                    .record(&self.stream)
                    .map_err(driver::error(self.backend.device, "record event"))?;
                let completion = NcclCompletion {
                    event: Arc::new(event),
                    comm: Arc::clone(&self.comm),
                    op: "destroy communicator",
                    rank: self.rank,
                    world_size: self.world_size,
                    timeout: self.timeout,
                };
                completion.wait()
            });
        if let Err(e) = flushed {
            tracing::error!(device = %self.backend.device, error = %e, "NCCL work failed before the communicator was dropped");
            self.comm.abort(lib);
            return;
        }
        if let Some(raw) = self.comm.lock().take() {
            // SAFETY: `raw` is live, its queued work has finished (waited above), and it is
            // never used again (taken out of the slot).
            let code = unsafe { (lib.comm_destroy)(raw.0) };
            if code != SUCCESS {
                tracing::error!(device = %self.backend.device, code, "ncclCommDestroy failed");
            }
        }
    }
}

/// Opens NCCL groups on CUDA devices; implements core's [`CollectiveEngine`] for the frontend's
/// `ProcessGroup::init` (one process per GPU) and offers [`NcclEngine::local_group`] (one
/// process, one thread per GPU).
#[derive(Clone, Copy, Debug)]
pub struct NcclEngine {
    timeout: Duration,
}

impl Default for NcclEngine {
    fn default() -> Self {
        NcclEngine::new()
    }
}

impl NcclEngine {
    /// The default collective timeout: how long `wait` lets a collective run before it aborts
    /// the communicator (a dead peer).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

    /// An engine with [`NcclEngine::DEFAULT_TIMEOUT`].
    pub fn new() -> Self {
        NcclEngine {
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The same engine with another collective timeout.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        NcclEngine { timeout }
    }

    /// One member per backend, rank `i` on `backends[i]` (all CUDA, distinct devices), made in
    /// one call (`ncclCommInitAll`): one process driving several GPUs; hand each member to its
    /// own thread.
    pub fn local_group(&self, backends: &[Arc<dyn Backend>]) -> Result<Vec<Arc<dyn Collective>>> {
        let cuda: Vec<Arc<CudaBackend>> = backends.iter().map(cuda_backend).collect::<Result<_>>()?;
        let Some(first) = cuda.first() else {
            return Err(Error::invalid(
                "NcclEngine::local_group",
                "a group needs at least one device",
            ));
        };
        let lib = library_for(first.device)?;
        let ordinals: Vec<c_int> = cuda.iter().map(|b| b.device.ordinal() as c_int).collect();
        if (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) {
            return Err(Error::invalid(
                "NcclEngine::local_group",
                format!(
                    "each rank needs its own device, but the devices are {:?}",
                    cuda.iter().map(|b| b.device).collect::<Vec<_>>()
                ),
            ));
        }
        // The streams first: once NCCL has made the communicators, nothing is left to fail.
        let streams: Vec<Arc<CudaStream>> = cuda.iter().map(|b| comm_stream(b)).collect::<Result<_>>()?;
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `comms` has room for one communicator per listed device; `ordinals` lists
        // distinct devices this process can open (each opened as a backend above).
        let code = unsafe { (lib.comm_init_all)(comms.as_mut_ptr(), ordinals.len() as c_int, ordinals.as_ptr()) };
        lib.check(first.device, "ncclCommInitAll", code, None)?;
        let world_size = cuda.len();
        Ok(cuda
            .into_iter()
            .zip(backends)
            .zip(comms.into_iter().zip(streams))
            .enumerate()
            .map(|(rank, ((backend, backend_dyn), (raw, stream)))| {
                let member = self.member(backend, Arc::clone(backend_dyn), stream, raw, rank, world_size);
                Arc::new(member) as Arc<dyn Collective>
            })
            .collect())
    }

    /// The member of rank `rank` on `backend`, its collectives on `stream`.
    fn member(
        &self,
        backend: Arc<CudaBackend>,
        backend_dyn: Arc<dyn Backend>,
        stream: Arc<CudaStream>,
        raw: ncclComm_t,
        rank: usize,
        world_size: usize,
    ) -> NcclCommunicator {
        tracing::info!(device = %backend.device, rank, world_size, "NCCL communicator ready");
        NcclCommunicator {
            comm: Arc::new(Comm {
                device: backend.device,
                raw: Mutex::new(Some(RawComm(raw))),
            }),
            backend,
            backend_dyn,
            stream,
            rank,
            world_size,
            timeout: self.timeout,
        }
    }
}

/// A non-blocking stream of `backend`'s context at the device's highest priority, for one
/// communicator's collectives.
fn comm_stream(backend: &CudaBackend) -> Result<Arc<CudaStream>> {
    let err = |op| driver::error(backend.device, op);
    backend.bind()?;
    let (_, greatest) = cudarc::driver::result::stream::get_priority_range().map_err(err("stream priorities"))?;
    backend
        .ctx
        .new_stream_with_priority(greatest)
        .map_err(err("create the communicator's stream"))
}

/// The CUDA backend behind `backend` (the one `open_cuda` caches for its ordinal).
fn cuda_backend(backend: &Arc<dyn Backend>) -> Result<Arc<CudaBackend>> {
    let device = backend.device();
    let not_cuda = || {
        Error::invalid(
            "nccl",
            format!("NCCL communicates between CUDA devices, and {device} is not one opened by cartage-cuda"),
        )
    };
    let concrete = backend.as_any().downcast_ref::<CudaBackend>().ok_or_else(not_cuda)?;
    let cached = crate::open_cuda(device.ordinal())?;
    if std::ptr::eq(concrete, &*cached) {
        Ok(cached)
    } else {
        Err(not_cuda())
    }
}

impl CollectiveEngine for NcclEngine {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn check(&self, backend: &Arc<dyn Backend>) -> Result<()> {
        let cuda = cuda_backend(backend)?;
        library_for(cuda.device).map(|_| ())
    }

    fn unique_id(&self, backend: &Arc<dyn Backend>) -> Result<Vec<u8>> {
        let device = backend.device();
        let lib = library_for(device)?;
        let mut id = ncclUniqueId {
            internal: [0; ID_BYTES],
        };
        // SAFETY: writes one id through a valid pointer.
        let code = unsafe { (lib.get_unique_id)(&mut id) };
        lib.check(device, "ncclGetUniqueId", code, None)?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    fn join(
        &self,
        backend: &Arc<dyn Backend>,
        id: &[u8],
        rank: usize,
        world_size: usize,
    ) -> Result<Arc<dyn Collective>> {
        let cuda = cuda_backend(backend)?;
        let lib = library_for(cuda.device)?;
        if id.len() != ID_BYTES || rank >= world_size || world_size > c_int::MAX as usize {
            return Err(Error::invalid(
                "nccl",
                format!(
                    "joining needs a {ID_BYTES}-byte NCCL id (got {}) and a rank below the world size (rank {rank} of {world_size})",
                    id.len()
                ),
            ));
        }
        // The stream first: once NCCL has made the communicator, nothing is left to fail.
        let stream = comm_stream(&cuda)?;
        let mut unique = ncclUniqueId {
            internal: [0; ID_BYTES],
        };
        for (slot, &byte) in unique.internal.iter_mut().zip(id) {
            *slot = byte as c_char;
        }
        // `ncclCommInitRank` blocks until every rank has joined and has no timeout of its own:
        // it runs on a helper thread, and a rank that never joins makes this one fail after the
        // engine's timeout instead of hanging. The helper stays blocked in NCCL (its
        // communicator, should the missing rank come late, is never used).
        let (done, result) = std::sync::mpsc::channel::<Result<usize>>();
        let helper = Arc::clone(&cuda);
        let started = Instant::now();
        std::thread::Builder::new()
            .name(format!("nccl-join-{rank}"))
            .spawn(move || {
                let joined = helper.bind().and_then(|()| {
                    let mut raw: ncclComm_t = std::ptr::null_mut();
                    // SAFETY: `raw` is a valid out-pointer; the id is the 128 bytes rank 0's
                    // NCCL made; the device's context is bound to this thread, so NCCL uses
                    // this device.
                    let code = unsafe { (lib.comm_init_rank)(&mut raw, world_size as c_int, unique, rank as c_int) };
                    lib.check(helper.device, "ncclCommInitRank", code, None)?;
                    Ok(raw as usize)
                });
                let _ = done.send(joined);
            })
            .map_err(|e| Error::invalid("nccl", format!("could not start a thread to join the group: {e}")))?;
        let raw = match result.recv_timeout(self.timeout) {
            Ok(joined) => joined? as ncclComm_t,
            Err(_) => {
                return Err(Error::RanksMissing {
                    op: "ncclCommInitRank",
                    rank,
                    world_size,
                    missing: Vec::new(),
                    waited: started.elapsed(),
                });
            }
        };
        Ok(Arc::new(self.member(
            cuda,
            Arc::clone(backend),
            stream,
            raw,
            rank,
            world_size,
        )))
    }
}
