//! CUDA graphs: the work one thread queues on the compute stream is captured once
//! (`cuStreamBeginCapture`, relaxed mode) and replayed as one launch (`cuGraphLaunch`), so a
//! step of hundreds of small kernels costs one launch on the host instead of hundreds.
//!
//! While a capture runs:
//! - the caching allocator serves every allocation from a private pool, so memory a replay
//!   writes is never handed to another tensor while the graph lives;
//! - operations that wait on the host (synchronising, reading back, uploading from host memory,
//!   asynchronous copies on the copy stream, events' times) fail with [`Error::GraphCapture`]
//!   instead of invalidating the capture, and so do random draws (their seeds would be frozen
//!   into the graph and repeat on every replay);
//! - launches from any other thread fail the same way: the device has one compute stream, and
//!   their work would be recorded into this graph.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cartage_core::{CapturedGraph, Error, Result};
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::backend::CudaBackend;
use crate::driver;
use crate::ordering::StreamOrder;

/// Which thread captures, and into which private pool.
#[derive(Debug, Default)]
pub(crate) struct CaptureSlot {
    /// True while a capture runs (checked on every launch without taking the lock).
    active: AtomicBool,
    state: Mutex<Option<(ThreadId, u64)>>,
}

impl CaptureSlot {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<(ThreadId, u64)>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while a capture runs.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

/// A captured, instantiated graph of one device's compute stream.
struct Graph {
    /// The graph and its executable; cudarc's type is not `Sync`, so replays are serialised.
    graph: Mutex<CudaGraph>,
    nodes: usize,
    device: cartage_core::Device,
    /// The device's stream bookkeeping: a replay waits for pending copies into its inputs, and
    /// later copies wait for the replay.
    order: Arc<StreamOrder>,
    compute: Arc<CudaStream>,
}

// SAFETY: the graph's handles are used only behind the mutex (one thread at a time, as the CUDA
// documentation requires for graph objects), and the context they belong to is thread-safe.
unsafe impl Send for Graph {}
// SAFETY: as above: every access goes through the mutex.
unsafe impl Sync for Graph {}

impl CapturedGraph for Graph {
    fn replay(&self) -> Result<()> {
        let graph = self.graph.lock().unwrap_or_else(|p| p.into_inner());
        self.order.before_opaque_compute(&self.compute)?;
        graph
            .launch()
            .map_err(driver::error(self.device, "replay a CUDA graph"))
    }

    fn nodes(&self) -> usize {
        self.nodes
    }
}

impl CudaBackend {
    /// Refuse `op` while a capture runs: it would wait on the host (or repeat on replay).
    #[inline]
    pub(crate) fn refuse_in_capture(&self, op: &'static str, reason: &'static str) -> Result<()> {
        if self.capture.active() {
            return Err(Error::GraphCapture {
                op,
                device: self.device,
                reason,
            });
        }
        Ok(())
    }

    /// Refuse a launch from a thread other than the capturing one.
    #[inline]
    pub(crate) fn check_capturing_thread(&self, op: &'static str) -> Result<()> {
        if self.capture.active() {
            let state = self.capture.state();
            if let Some((thread, _)) = *state
                && thread != std::thread::current().id()
            {
                return Err(Error::GraphCapture {
                    op,
                    device: self.device,
                    reason: "another thread is capturing this device's stream, and this launch would be recorded into its graph",
                });
            }
        }
        Ok(())
    }

    pub(crate) fn begin_graph_capture(&self) -> Result<u64> {
        if self.capture.active() {
            return Err(Error::GraphCapture {
                op: "begin_capture",
                device: self.device,
                reason: "a capture is already running on this device; end it first",
            });
        }
        // Everything queued before the capture finishes first, so that the graph waits on no
        // event recorded outside it (the per-segment copy events are cleared too).
        cartage_core::Backend::synchronize(self)?;
        let pool = self.allocator.begin_private_pool()?;
        let begun = self
            .compute
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(driver::error(self.device, "begin a CUDA graph capture"));
        if let Err(e) = begun {
            self.allocator.end_private_pool();
            self.allocator.release_private_pool(pool);
            return Err(e);
        }
        *self.capture.state() = Some((std::thread::current().id(), pool));
        self.capture.active.store(true, Ordering::Release);
        tracing::debug!(device = %self.device, pool, "graph capture begun");
        Ok(pool)
    }

    pub(crate) fn end_graph_capture(&self) -> Result<Box<dyn CapturedGraph>> {
        let Some((thread, pool)) = *self.capture.state() else {
            return Err(Error::GraphCapture {
                op: "end_capture",
                device: self.device,
                reason: "no capture is running on this device",
            });
        };
        if thread != std::thread::current().id() {
            return Err(Error::GraphCapture {
                op: "end_capture",
                device: self.device,
                reason: "the capture was begun on another thread; end it there",
            });
        }
        let ended = self
            .compute
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(driver::error(self.device, "end a CUDA graph capture"));
        self.allocator.end_private_pool();
        *self.capture.state() = None;
        self.capture.active.store(false, Ordering::Release);
        let graph = ended?.ok_or_else(|| Error::Driver {
            device: self.device,
            op: "end a CUDA graph capture",
            message: "the driver returned no graph".into(),
        })?;
        let nodes = node_count(&graph);
        graph
            .upload()
            .map_err(driver::error(self.device, "upload a CUDA graph"))?;
        tracing::debug!(device = %self.device, pool, nodes, "graph captured");
        Ok(Box::new(Graph {
            graph: Mutex::new(graph),
            nodes,
            device: self.device,
            order: Arc::clone(&self.order),
            compute: Arc::clone(&self.compute),
        }))
    }
}

/// The number of nodes in `graph` (0 if the driver cannot say).
fn node_count(graph: &CudaGraph) -> usize {
    let mut count: usize = 0;
    // SAFETY: `cu_graph` is the live graph `graph` owns (not destroyed here); with a null node
    // array the call only writes the count into `count`, a valid out-pointer.
    let status = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut count) };
    if status == sys::CUresult::CUDA_SUCCESS {
        count
    } else {
        0
    }
}
