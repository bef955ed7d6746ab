//! [`PrefetchLoader`]: while the device computes on batch N, batch N+1 is on its way (LESSONS R10).
//!
//! The loader takes an iterator of host batches ([`HostBatch`]: bytes, shape, dtype) and yields
//! device tensors in the same order. Pipelined, a worker thread stages each batch in one of two
//! host staging buffers (pinned where the driver can lock memory) and moves it with an asynchronous copy (`copy_from_pinned_async`) while it
//! stages the next batch in the other buffer, and hands finished tensors over a one-slot channel,
//! so copies and host-side preparation overlap the caller's compute on the previous batch. Device
//! memory holds at most three batches at once: the caller's, one waiting in the channel and one
//! being copied.
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

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use cartage_core::{Backend, DType, Device, Element, Error, Result, StagingBuffer, checked_numel};

use crate::{Tensor, runtime};

/// One batch on the host: little-endian element bytes in row-major order, a shape and a dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBatch {
    bytes: Vec<u8>,
    shape: Vec<usize>,
    dtype: DType,
}

impl HostBatch {
    /// A batch of `values` with `shape` (the dtype is `T`'s).
    pub fn new<T: Element>(values: Vec<T>, shape: &[usize]) -> Self {
        HostBatch {
            bytes: T::to_le_bytes_vec(&values).into_owned(),
            shape: shape.to_vec(),
            dtype: T::DTYPE,
        }
    }

    /// A batch from raw little-endian bytes of `dtype`.
    pub fn from_bytes(bytes: Vec<u8>, shape: &[usize], dtype: DType) -> Self {
        HostBatch {
            bytes,
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
        &self.bytes
    }

    /// Fail with [`Error::DataLength`] unless the bytes fill the shape exactly.
    fn check(&self) -> Result<()> {
        let numel = checked_numel(&self.shape).ok_or_else(|| Error::SizeOverflow {
            shape: self.shape.clone(),
            dtype: self.dtype,
        })?;
        let size = self.dtype.size_in_bytes();
        if numel.checked_mul(size) != Some(self.bytes.len()) {
            return Err(Error::DataLength {
                op: "PrefetchLoader",
                shape: self.shape.clone(),
                numel,
                len: self.bytes.len() / size,
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

type Source = Box<dyn Iterator<Item = HostBatch> + Send>;

enum Inner {
    Plain {
        source: Source,
        device: Device,
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
        let backend = runtime::backend(device)?;
        let source: Source = Box::new(batches.into_iter());
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
                },
            });
        }
        let (sender, receiver) = sync_channel(1);
        let device = *device;
        let worker = std::thread::Builder::new()
            .name(format!("cartage-prefetch-{device}"))
            .spawn(move || stage_batches(source, backend, device, sender))
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
            Inner::Plain { source, device } => source.next().map(|batch| write_now(device, &batch)),
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
        if let Inner::Pipelined { receiver, worker } = &mut self.inner {
            // Closing the channel stops the worker at its next hand-over.
            drop(receiver.take());
            if let Some(handle) = worker.take() {
                let _ = handle.join();
            }
        }
    }
}

/// The plain path: allocate on the device and write the batch synchronously.
fn write_now(device: &Device, batch: &HostBatch) -> Result<Tensor> {
    batch.check()?;
    let tensor = Tensor::empty(&batch.shape, batch.dtype, device)?;
    if !batch.bytes.is_empty() {
        tensor.storage().device_buffer().write(0, &batch.bytes)?;
    }
    Ok(tensor)
}

/// Copy `batch` into `buffer`, growing it (through `backend`) when the batch is larger.
fn fill_pinned(backend: &Arc<dyn Backend>, buffer: &mut Option<StagingBuffer>, batch: &HostBatch) -> Result<()> {
    batch.check()?;
    let needed = batch.bytes.len();
    if buffer.as_ref().is_none_or(|b| b.len() < needed) {
        *buffer = Some(backend.alloc_staging(needed.max(1))?);
    }
    if let Some(b) = buffer.as_mut() {
        b.as_mut_slice()[..needed].copy_from_slice(&batch.bytes);
    }
    Ok(())
}

/// The worker: batch k is copied from one pinned buffer while batch k+1 is staged in the other;
/// each finished tensor goes to the caller through the one-slot channel.
fn stage_batches(mut source: Source, backend: Arc<dyn Backend>, device: Device, sender: SyncSender<Result<Tensor>>) {
    let mut buffers: [Option<StagingBuffer>; 2] = [None, None];
    let mut current = 0;
    let mut staged: Option<(Result<()>, HostBatch)> = source.next().map(|batch| {
        let filled = fill_pinned(&backend, &mut buffers[0], &batch);
        (filled, batch)
    });
    while let Some((filled, batch)) = staged.take() {
        let (front, back) = buffers.split_at_mut(1);
        let (this, other) = if current == 0 {
            (&front[0], &mut back[0])
        } else {
            (&back[0], &mut front[0])
        };
        let result = filled.and_then(|()| start_copy(this, &device, &batch));
        // While the copy runs, fetch and stage the next batch in the other buffer.
        staged = source.next().map(|next| {
            let filled = fill_pinned(&backend, other, &next);
            (filled, next)
        });
        let result = result.and_then(|(tensor, copy)| {
            copy.wait()?;
            Ok(tensor)
        });
        if sender.send(result).is_err() {
            return; // the loader was dropped
        }
        current ^= 1;
    }
}

/// Allocate the batch's tensor on the device and start the asynchronous copy into it.
fn start_copy<'a>(
    buffer: &'a Option<StagingBuffer>,
    device: &Device,
    batch: &HostBatch,
) -> Result<(Tensor, cartage_core::CopyHandle<'a>)> {
    let tensor = Tensor::empty(&batch.shape, batch.dtype, device)?;
    let copy = match buffer {
        Some(pinned) if !batch.bytes.is_empty() => tensor.copy_from_pinned_async(pinned)?,
        _ => cartage_core::CopyHandle::completed(),
    };
    Ok((tensor, copy))
}
