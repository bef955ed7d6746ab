//! The prefetch thread: it stages batch k+1 in one buffer while batch k's copy runs from the
//! other, and hands each tensor over as soon as its copy is queued.
//!
//! The thread never waits for a copy on the host. The device orders every later use of the
//! tensor after its copy (CUDA's compute stream waits on the copy's event), so the caller's
//! compute on batch k starts the moment the bytes have arrived, and the only host wait left is
//! the one that must be there: before a staging buffer is rewritten, for the copy that read it
//! two batches earlier.
//!
//! Batches land in a small ring of device tensors the thread owns. A fresh allocation would
//! usually get the block the caller's compute has just freed (say, the output of batch k's
//! matmul), and a copy into it must wait for that compute (the copy stream is ordered after the
//! compute that used the memory), which would serialise copies and compute again. A ring slot
//! was last read by the compute of batch k−[`RING`], long finished. A slot is reused only when
//! the caller no longer holds any tensor or view of it; otherwise a new tensor takes its place.

use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use cartage_core::{Backend, Device, Result, StagingBuffer};

use super::source::{Source, Staged};
use super::staging_pool;
use crate::Tensor;

/// Device tensors in the thread's ring (see the module docs).
const RING: usize = 4;

/// Run the pipeline until the batches end or the loader is dropped (the channel closes).
pub(super) fn run(mut source: Source, backend: Arc<dyn Backend>, device: Device, sender: SyncSender<Result<Tensor>>) {
    let mut buffers: [Option<StagingBuffer>; 2] = [None, None];
    let mut current = 0;
    let mut ring: [Option<Tensor>; RING] = Default::default();
    let mut batch = 0usize;
    while let Some(staged) = source.stage(&backend, device, &mut buffers[current]) {
        let slot = &mut ring[batch % RING];
        let result = staged.and_then(|staged| start_copy(buffers[current].as_ref(), slot, &device, &staged));
        if sender.send(result).is_err() {
            break; // the loader was dropped
        }
        current ^= 1;
        batch += 1;
    }
    drop(ring);
    // Kept for the next loader; a copy still reading one is waited for when it is next written.
    for buffer in buffers.into_iter().flatten() {
        staging_pool::give_back(device, buffer);
    }
}

/// Take the ring slot's tensor when it fits the batch and nobody else holds it (else allocate a
/// new one into the slot) and queue the copy into it; the handle is detached (the staging buffer
/// remembers the copy, and the device orders the tensor's users after it).
fn start_copy(
    buffer: Option<&StagingBuffer>,
    slot: &mut Option<Tensor>,
    device: &Device,
    staged: &Staged,
) -> Result<Tensor> {
    let tensor = match slot {
        Some(t)
            if t.shape() == staged.shape.as_slice()
                && t.dtype() == staged.dtype
                && Arc::strong_count(t.storage()) == 1 =>
        {
            t.clone()
        }
        _ => slot.insert(Tensor::empty(&staged.shape, staged.dtype, device)?).clone(),
    };
    if let Some(buffer) = buffer
        && staged.bytes > 0
    {
        tensor.copy_from_pinned_async(buffer)?.detach();
    }
    Ok(tensor)
}
