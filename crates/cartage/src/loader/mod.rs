//! [`PrefetchLoader`]: while the device computes on batch N, batch N+1 is on its way (LESSONS R10).
//!
//! The loader takes host batches and yields device tensors in the same order. Pipelined, a
//! worker thread writes each batch into one of two host staging buffers (pinned where the driver
//! can lock memory), queues an asynchronous copy from it on the device's copy stream and hands
//! the tensor over at once: the device orders the caller's compute after the copy (an event the
//! compute stream waits on), so neither the worker nor the caller waits for a copy on the host,
//! and copies, host-side preparation and compute all overlap. Batches land in a ring of four
//! device tensors the worker reuses once the caller has dropped them, so a copy never lands in
//! memory the caller's compute has just freed (and would have to wait for it).
//!
//! Batches come as [`HostBatch`]es (owned or shared bytes: [`HostBatch::shared`] hands the same
//! bytes out again without a copy) or from a function that writes each batch straight into the
//! staging buffer ([`PrefetchLoader::from_fn`]), so no host `Vec` is built per batch. Staging
//! buffers outlive the loader: the next loader (the next epoch) takes them from a small pool
//! instead of pinning memory again ([`release_loader_staging`] frees them).
//!
//! Dropping a pipelined loader closes its channel, which stops the worker at its next hand-over,
//! and waits for the worker at most [`DROP_JOIN_TIMEOUT`] (as PyTorch's `DataLoader` joins its
//! workers with a timeout): a worker stuck in the caller's own iterator or `fill` function is
//! left to finish on its own, with a `tracing` warning, rather than hang the drop.
//!
//! On a device without asynchronous copies (the CPU backend) it degrades to a plain iterator that
//! writes each batch in place; [`PrefetchMode`] can force either behaviour.
//!
//! ```
//! use cartage::loader::{HostBatch, PrefetchLoader};
//! use cartage::prelude::*;
//! # fn main() -> cartage::Result<()> {
//! let device = Device::cpu();
//! let batches = (0..4).map(|i| HostBatch::new(vec![i as f32; 6], &[2, 3]));
//! let mut seen = Vec::new();
//! for batch in PrefetchLoader::new(batches, &device)? {
//!     let batch = batch?; // on the device
//!     seen.push(batch.sum_all()?.item::<f32>()?);
//! }
//! assert_eq!(seen, vec![0.0, 6.0, 12.0, 18.0]);
//! # Ok(()) }
//! ```

mod source;
mod staging_pool;
mod worker;

use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cartage_core::{DType, Device, Element, Error, Result, StagingBuffer};

use self::source::{Source, byte_len};
pub use self::staging_pool::{kept_loader_staging, release_loader_staging};
use crate::{Tensor, runtime};

/// How long dropping a pipelined [`PrefetchLoader`] waits for its worker thread to stop (5 s,
/// PyTorch's `DataLoader` worker join timeout). A worker still blocked after that (inside the
/// caller's iterator or `fill` function) is detached with a warning.
pub const DROP_JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A batch's bytes: its own, or shared with other batches (handed out again without a copy).
#[derive(Clone, Debug)]
enum Bytes {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Shared(a) => a,
        }
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

/// One batch on the host: little-endian element bytes in row-major order, a shape and a dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBatch {
    bytes: Bytes,
    shape: Vec<usize>,
    dtype: DType,
}

impl HostBatch {
    /// A batch of `values` with `shape` (the dtype is `T`'s).
    pub fn new<T: Element>(values: Vec<T>, shape: &[usize]) -> Self {
        HostBatch {
            bytes: Bytes::Owned(T::to_le_bytes_vec(&values).into_owned()),
            shape: shape.to_vec(),
            dtype: T::DTYPE,
        }
    }

    /// A batch from raw little-endian bytes of `dtype`.
    pub fn from_bytes(bytes: Vec<u8>, shape: &[usize], dtype: DType) -> Self {
        HostBatch {
            bytes: Bytes::Owned(bytes),
            shape: shape.to_vec(),
            dtype,
        }
    }

    /// A batch of little-endian bytes shared with other batches: cloning the `Arc` (say, to hand
    /// the same data out every epoch) copies no bytes.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cartage::DType;
    /// use cartage::loader::HostBatch;
    /// let bytes: Arc<[u8]> = Arc::from(vec![0u8; 16]);
    /// let batches: Vec<HostBatch> = (0..3).map(|_| HostBatch::shared(bytes.clone(), &[2, 2], DType::F32)).collect();
    /// assert_eq!(batches[2].bytes().len(), 16);
    /// ```
    pub fn shared(bytes: Arc<[u8]>, shape: &[usize], dtype: DType) -> Self {
        HostBatch {
            bytes: Bytes::Shared(bytes),
            shape: shape.to_vec(),
            dtype,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Fail with [`Error::DataLength`] unless the bytes fill the shape exactly.
    fn check(&self) -> Result<()> {
        let expected = byte_len(&self.shape, self.dtype)?;
        let size = self.dtype.size_in_bytes();
        if expected != self.bytes().len() {
            return Err(Error::DataLength {
                op: "PrefetchLoader",
                shape: self.shape.clone(),
                numel: expected / size,
                len: self.bytes().len() / size,
            });
        }
        Ok(())
    }
}

/// Whether a [`PrefetchLoader`] runs a copy pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefetchMode {
    /// Pipelined where the device copies asynchronously (`capabilities().async_copies`), plain
    /// elsewhere.
    #[default]
    Auto,
    /// Always pipelined (a worker thread and pinned double buffers).
    Pipelined,
    /// Always a plain iterator (each batch written when asked for).
    Plain,
}

enum Inner {
    Plain {
        source: Source,
        device: Device,
        /// Where a filled batch is written before it goes to the device (the plain path only).
        scratch: Option<StagingBuffer>,
    },
    Pipelined {
        receiver: Option<Receiver<Result<Tensor>>>,
        worker: Option<JoinHandle<()>>,
    },
}

/// Device batches from host batches, prefetched. See the module docs.
pub struct PrefetchLoader {
    inner: Inner,
}

impl std::fmt::Debug for PrefetchLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefetchLoader")
            .field("pipelined", &self.is_pipelined())
            .finish()
    }
}

impl PrefetchLoader {
    /// A loader onto `device` ([`PrefetchMode::Auto`]).
    pub fn new<I>(batches: I, device: &Device) -> Result<Self>
    where
        I: IntoIterator<Item = HostBatch>,
        I::IntoIter: Send + 'static,
    {
        PrefetchLoader::with_mode(batches, device, PrefetchMode::Auto)
    }

    /// A loader onto `device` with an explicit mode.
    pub fn with_mode<I>(batches: I, device: &Device, mode: PrefetchMode) -> Result<Self>
    where
        I: IntoIterator<Item = HostBatch>,
        I::IntoIter: Send + 'static,
    {
        PrefetchLoader::start(Source::Batches(Box::new(batches.into_iter())), device, mode)
    }

    /// `count` batches of `shape` and `dtype`, each written by `fill(index, bytes)` straight into
    /// the staging buffer the device copies from (little-endian element bytes, exactly the
    /// batch's size): no host `Vec` per batch, and the staging memory is reused across loaders.
    ///
    /// ```
    /// use cartage::loader::PrefetchLoader;
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let device = Device::cpu();
    /// let loader = PrefetchLoader::from_fn(&[2], DType::F32, 3, &device, |i, bytes| {
    ///     let value = i as f32;
    ///     for chunk in bytes.chunks_exact_mut(4) {
    ///         chunk.copy_from_slice(&value.to_le_bytes());
    ///     }
    ///     Ok(())
    /// })?;
    /// let sums: Vec<f32> = loader.map(|b| b?.sum_all()?.item::<f32>()).collect::<cartage::Result<_>>()?;
    /// assert_eq!(sums, vec![0.0, 2.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn from_fn<F>(shape: &[usize], dtype: DType, count: usize, device: &Device, fill: F) -> Result<Self>
    where
        F: FnMut(usize, &mut [u8]) -> Result<()> + Send + 'static,
    {
        PrefetchLoader::from_fn_with_mode(shape, dtype, count, device, PrefetchMode::Auto, fill)
    }

    /// [`PrefetchLoader::from_fn`] with an explicit mode.
    pub fn from_fn_with_mode<F>(
        shape: &[usize],
        dtype: DType,
        count: usize,
        device: &Device,
        mode: PrefetchMode,
        fill: F,
    ) -> Result<Self>
    where
        F: FnMut(usize, &mut [u8]) -> Result<()> + Send + 'static,
    {
        byte_len(shape, dtype)?;
        let source = Source::Filled {
            shape: shape.to_vec(),
            dtype,
            count,
            next: 0,
            fill: Box::new(fill),
        };
        PrefetchLoader::start(source, device, mode)
    }

    fn start(source: Source, device: &Device, mode: PrefetchMode) -> Result<Self> {
        let backend = runtime::backend(device)?;
        let pipelined = match mode {
            PrefetchMode::Auto => backend.capabilities().async_copies,
            PrefetchMode::Pipelined => true,
            PrefetchMode::Plain => false,
        };
        tracing::debug!(%device, pipelined, "prefetch loader");
        if !pipelined {
            return Ok(PrefetchLoader {
                inner: Inner::Plain {
                    source,
                    device: *device,
                    scratch: None,
                },
            });
        }
        let (sender, receiver) = sync_channel(1);
        let device = *device;
        let worker = std::thread::Builder::new()
            .name(format!("cartage-prefetch-{device}"))
            .spawn(move || worker::run(source, backend, device, sender))
            .map_err(|e| Error::Driver {
                device,
                op: "spawn the prefetch thread",
                message: e.to_string(),
            })?;
        Ok(PrefetchLoader {
            inner: Inner::Pipelined {
                receiver: Some(receiver),
                worker: Some(worker),
            },
        })
    }

    /// True when a worker thread prefetches through pinned double buffers.
    pub fn is_pipelined(&self) -> bool {
        matches!(self.inner, Inner::Pipelined { .. })
    }
}

impl Iterator for PrefetchLoader {
    type Item = Result<Tensor>;

    fn next(&mut self) -> Option<Result<Tensor>> {
        match &mut self.inner {
            Inner::Plain {
                source: Source::Batches(batches),
                device,
                ..
            } => batches.next().map(|batch| write_now(device, &batch)),
            Inner::Plain {
                source,
                device,
                scratch,
            } => {
                let backend = match runtime::backend(device) {
                    Ok(backend) => backend,
                    Err(e) => return Some(Err(e)),
                };
                let staged = source.stage(&backend, *device, scratch)?;
                Some(staged.and_then(|staged| {
                    let bytes = scratch.as_ref().map_or(&[][..], |s| &s.as_slice()[..staged.bytes]);
                    write_bytes(device, &staged.shape, staged.dtype, bytes)
                }))
            }
            Inner::Pipelined { receiver, worker } => {
                let item = receiver.as_ref()?.recv().ok();
                if item.is_none() {
                    // The worker finished (or panicked: carry its panic to the caller).
                    receiver.take();
                    if let Some(handle) = worker.take()
                        && let Err(panic) = handle.join()
                    {
                        std::panic::resume_unwind(panic);
                    }
                }
                item
            }
        }
    }
}

impl Drop for PrefetchLoader {
    fn drop(&mut self) {
        match &mut self.inner {
            Inner::Pipelined { receiver, worker } => {
                // Closing the channel stops the worker at its next hand-over.
                drop(receiver.take());
                if let Some(handle) = worker.take() {
                    join_bounded(handle, DROP_JOIN_TIMEOUT);
                }
            }
            Inner::Plain { device, scratch, .. } => {
                if let Some(buffer) = scratch.take() {
                    staging_pool::give_back(*device, buffer);
                }
            }
        }
    }
}

/// Join `handle` if it finishes within `bound`; otherwise leave it running, detached, with a
/// warning (it holds only what the loader gave it, and exits at its next hand-over). A panic in
/// the worker is logged, not carried into a drop.
fn join_bounded(handle: JoinHandle<()>, bound: Duration) {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    while !handle.is_finished() {
        if start.elapsed() >= bound {
            tracing::warn!(
                thread = handle.thread().name().unwrap_or("prefetch"),
                waited = ?bound,
                "PrefetchLoader dropped while its worker is still producing a batch (blocked in the batch \
                 iterator or `fill` function?): the thread is left to finish on its own"
            );
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
    if handle.join().is_err() {
        tracing::warn!("the PrefetchLoader's worker thread panicked");
    }
}

/// The plain path: allocate on the device and write the batch synchronously.
fn write_now(device: &Device, batch: &HostBatch) -> Result<Tensor> {
    batch.check()?;
    write_bytes(device, &batch.shape, batch.dtype, batch.bytes())
}

fn write_bytes(device: &Device, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<Tensor> {
    let tensor = Tensor::empty(shape, dtype, device)?;
    if bytes.is_empty() {
        return Ok(tensor);
    }
    if dtype == DType::Bool {
        let mut bools = bytes.to_vec();
        crate::tensor::normalize_bool_bytes(&mut bools);
        tensor.storage().device_buffer().write(0, &bools)?;
    } else {
        tensor.storage().device_buffer().write(0, bytes)?;
        tensor
            .storage()
            .set_known_range(crate::tensor::create::index_range_of(dtype, bytes));
    }
    Ok(tensor)
}
