//! CUDA graphs from ordinary tensor code: [`cuda_graph`] records the kernels a closure queues on
//! a device's stream, once, and [`CudaGraph::replay`] launches them again as one unit. A step
//! of hundreds of small kernels then costs one launch on the host instead of hundreds of op
//! calls, each with its checks, bookkeeping and launch (LESSONS R31: fixed per-op costs are what
//! a faster kernel cannot remove).
//!
//! What a graph is, and what follows from it:
//! - **Capturing records, it does not run.** The tensors the closure returns hold nothing
//!   meaningful until the first replay.
//! - **Static memory.** A replay runs the same kernels on the same memory. Inputs are tensors
//!   created before the capture: refresh them in place ([`crate::Tensor::copy_from`],
//!   `copy_from_pinned_async`) between replays. Outputs are the tensors the closure returns (and
//!   any it wrote in place, such as gradients): read them after a replay. Memory allocated while
//!   capturing comes from a private pool that no other tensor is given while the graph lives.
//! - **The graph owns what it captured.** Every storage the captured work reads or writes that
//!   was made before the capture (inputs, weights, tensors written in place) is held by the
//!   graph until it is dropped, so dropping such a tensor never lets a replay touch memory that
//!   a new tensor took, or that [`crate::empty_cache`] gave back. (The tensor-level paths record
//!   them; a raw [`cartage_core::Kernel::run`] inside a capture is the caller's to keep alive.)
//! - **No host waits inside.** Reading a value back, synchronising, uploading from host memory,
//!   asynchronous copies and device timing fail with [`crate::Error::GraphCapture`] during the
//!   capture, and so do random draws, whose seeds would repeat on every replay. Index checks
//!   (gather, embedding, cross-entropy targets) still skip an index out of range on the device,
//!   so no memory is touched outside the tensors, but inside a graph it is not reported.
//! - **Warm up first.** Run the closure once eagerly before capturing it, so that kernel modules
//!   are loaded and the allocator's cache is warm.
//! - **Host-side values are frozen.** Anything the closure computes on the host (a learning
//!   rate, Adam's bias correction, a loop count) is baked into the graph. A training step is
//!   therefore captured as forward and backward, and the optimizer steps eagerly after each
//!   replay (one multi-tensor kernel).
//!
//! Only CUDA devices have graphs; elsewhere [`cuda_graph`] fails with
//! [`crate::Error::Unsupported`].
//!
//! ```no_run
//! use cartage::prelude::*;
//! # fn main() -> cartage::Result<()> {
//! let gpu = Device::cuda(0);
//! let x = Tensor::zeros(&[64, 128], DType::F32, &gpu)?; // the static input
//! let w = Tensor::rand(&[128, 32], DType::F32, 1, &gpu)?;
//! x.matmul(&w)?.relu()?; // warm-up
//! let (graph, y) = cartage::cuda_graph(&gpu, || x.matmul(&w)?.relu())?;
//! for step in 0..3 {
//!     x.copy_from(&Tensor::full(&[64, 128], step as f32, DType::F32, &gpu)?)?;
//!     graph.replay()?;
//!     println!("{}", y.sum_all()?.item::<f32>()?);
//! }
//! # Ok(()) }
//! ```

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cartage_core::{Backend, CapturedGraph, Device, Result};

use crate::runtime;
use crate::tensor::{Storage, Tensor};

/// A captured graph of one device's work; see the module docs.
pub struct CudaGraph {
    /// `Some` until dropped (the graph goes first, then `storages`, then the private pool).
    graph: Option<Box<dyn CapturedGraph>>,
    /// Every storage made before the capture that the captured work touches, held until the
    /// graph is gone so that a replay never reaches freed or reused memory.
    storages: Vec<Arc<Storage>>,
    backend: Arc<dyn Backend>,
    pool: u64,
}

thread_local! {
    /// The id of the capture this thread runs (0: none), read on every launch.
    static ACTIVE: Cell<u64> = const { Cell::new(0) };
    /// What that capture has recorded.
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Source of capture ids (0 means "not capturing").
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// The storages a capture on this thread has seen so far.
struct Recorder {
    id: u64,
    device: Device,
    held: Vec<Arc<Storage>>,
    seen: HashSet<usize>,
}

/// The id of the capture this thread is running (0: none); a storage made while capturing
/// remembers it, since its block belongs to the graph's private pool (held anyway).
#[inline]
pub(crate) fn capture_id() -> u64 {
    ACTIVE.with(Cell::get)
}

/// Note that work queued now touches the storages of `tensors`: while this thread captures a
/// graph, the graph will hold them. Costs one thread-local read otherwise.
#[inline]
pub(crate) fn hold<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) {
    if ACTIVE.with(Cell::get) != 0 {
        hold_slow(tensors);
    }
}

#[cold]
fn hold_slow<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let Some(r) = r.as_mut() else { return };
        for t in tensors {
            let storage = t.storage();
            if storage.captured_in() == r.id || storage.backend().device() != r.device {
                continue;
            }
            if r.seen.insert(Arc::as_ptr(storage) as usize) {
                r.held.push(Arc::clone(storage));
            }
        }
    });
}

/// Starts this thread's recording; ending it (or dropping it) stops the recording.
struct Recording;

impl Recording {
    fn start(device: Device) -> Recording {
        let id = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        RECORDER.with(|r| {
            *r.borrow_mut() = Some(Recorder {
                id,
                device,
                held: Vec::new(),
                seen: HashSet::new(),
            })
        });
        ACTIVE.with(|a| a.set(id));
        Recording
    }

    /// The storages recorded.
    fn finish(self) -> Vec<Arc<Storage>> {
        ACTIVE.with(|a| a.set(0));
        RECORDER
            .with(|r| r.borrow_mut().take())
            .map_or_else(Vec::new, |r| r.held)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(0));
        drop(RECORDER.with(|r| r.borrow_mut().take()));
    }
}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraph")
            .field("device", &self.device())
            .field("nodes", &self.nodes())
            .finish()
    }
}

impl CudaGraph {
    /// Queue the captured work again (asynchronous, in stream order after everything queued
    /// before it, including pending copies into its inputs).
    pub fn replay(&self) -> Result<()> {
        match &self.graph {
            Some(graph) => graph.replay(),
            None => Ok(()),
        }
    }

    /// How many nodes (kernels, copies, memsets) the graph holds.
    pub fn nodes(&self) -> usize {
        self.graph.as_ref().map_or(0, |g| g.nodes())
    }

    /// The device the graph runs on.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// Bytes of device memory the graph's private pool holds (the memory its kernels use).
    pub fn pool_bytes(&self) -> usize {
        self.backend.allocator().private_pool_bytes(self.pool)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        drop(self.graph.take());
        // Replays already queued run before any later use of this memory (one stream).
        drop(std::mem::take(&mut self.storages));
        self.backend.allocator().release_private_pool(self.pool);
    }
}

/// Capture the device work of `capture` on `device` into a [`CudaGraph`]; returns the graph and
/// what the closure returned (its output tensors, which a replay rewrites). The closure runs
/// once, recording its kernels without running them. If it fails (or panics), the capture is
/// ended and its memory released before the error is returned.
pub fn cuda_graph<R>(device: &Device, capture: impl FnOnce() -> Result<R>) -> Result<(CudaGraph, R)> {
    let backend = runtime::backend(device)?;
    if capture_id() != 0 {
        return Err(cartage_core::Error::invalid(
            "cuda_graph",
            "this thread is already capturing a graph; capture graphs one after the other",
        ));
    }
    let pool = backend.begin_capture()?;
    let recording = Recording::start(backend.device());
    let outcome = catch_unwind(AssertUnwindSafe(capture));
    let storages = recording.finish();
    let ended = backend.end_capture();
    let release = |backend: &Arc<dyn Backend>| backend.allocator().release_private_pool(pool);
    match (outcome, ended) {
        (Ok(Ok(value)), Ok(graph)) => {
            tracing::debug!(%device, nodes = graph.nodes(), "CUDA graph captured");
            Ok((
                CudaGraph {
                    graph: Some(graph),
                    storages,
                    backend,
                    pool,
                },
                value,
            ))
        }
        (Ok(Ok(value)), Err(e)) => {
            drop(value);
            release(&backend);
            Err(e)
        }
        (Ok(Err(e)), graph) => {
            drop(graph);
            release(&backend);
            Err(e)
        }
        (Err(panic), graph) => {
            drop(graph);
            release(&backend);
            resume_unwind(panic)
        }
    }
}
