//! Where a loader's batches come from: an iterator of [`HostBatch`]es, or a function that writes
//! each batch straight into the staging buffer (no host `Vec` per batch at all).

use std::sync::Arc;

use cartage_core::{Backend, DType, Device, Error, Result, StagingBuffer, checked_numel};

use super::HostBatch;
use super::staging_pool;

/// Writes batch `index` into the byte slice it is given (exactly the batch's size).
pub(super) type Fill = Box<dyn FnMut(usize, &mut [u8]) -> Result<()> + Send>;

/// The batches of one loader.
pub(super) enum Source {
    /// Each batch given as host bytes.
    Batches(Box<dyn Iterator<Item = HostBatch> + Send>),
    /// `count` batches of one shape, each written in place by `fill`.
    Filled {
        shape: Vec<usize>,
        dtype: DType,
        count: usize,
        next: usize,
        fill: Fill,
    },
}

/// What a staged batch is: its shape, dtype and byte length (in the staging buffer's front).
pub(super) struct Staged {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: usize,
}

impl Source {
    /// Write the next batch into `buffer` (taken from the pool, or grown, when too small);
    /// `None` once the batches are exhausted.
    pub(super) fn stage(
        &mut self,
        backend: &Arc<dyn Backend>,
        device: Device,
        buffer: &mut Option<StagingBuffer>,
    ) -> Option<Result<Staged>> {
        match self {
            Source::Batches(batches) => {
                let batch = batches.next()?;
                Some(batch.check().and_then(|()| {
                    let bytes = batch.bytes();
                    let slot = slot(backend, device, buffer, bytes.len())?;
                    slot.copy_from_slice(bytes);
                    Ok(Staged {
                        shape: batch.shape().to_vec(),
                        dtype: batch.dtype(),
                        bytes: bytes.len(),
                    })
                }))
            }
            Source::Filled {
                shape,
                dtype,
                count,
                next,
                fill,
            } => {
                if *next >= *count {
                    return None;
                }
                let index = *next;
                *next += 1;
                Some(byte_len(shape, *dtype).and_then(|len| {
                    let slot = slot(backend, device, buffer, len)?;
                    fill(index, slot)?;
                    Ok(Staged {
                        shape: shape.clone(),
                        dtype: *dtype,
                        bytes: len,
                    })
                }))
            }
        }
    }
}

/// The bytes of a `shape` batch of `dtype`, or the error for a shape too large to address.
pub(super) fn byte_len(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_numel(shape)
        .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
        .ok_or_else(|| Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype,
        })
}

/// The first `len` bytes of `buffer`, writable once any copy still reading them has finished;
/// a buffer too small goes back to the pool and a large enough one replaces it.
fn slot<'b>(
    backend: &Arc<dyn Backend>,
    device: Device,
    buffer: &'b mut Option<StagingBuffer>,
    len: usize,
) -> Result<&'b mut [u8]> {
    if buffer.as_ref().is_none_or(|b| b.len() < len) {
        if let Some(small) = buffer.take() {
            staging_pool::give_back(device, small);
        }
        *buffer = Some(staging_pool::take(backend, device, len)?);
    }
    match buffer.as_mut() {
        Some(b) => Ok(&mut b.as_mut_slice()[..len]),
        None => Err(Error::invalid("PrefetchLoader", "no staging buffer")),
    }
}
