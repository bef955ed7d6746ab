//! The prefetch thread: it stages batch k+1 in one buffer while batch k's copy runs from the
//! other, and hands each tensor over as soon as its copy is queued.
//!
//! The thread never waits for a copy on the host. The device orders every later use of the
//! tensor after its copy (CUDA's compute stream waits on the copy's event), so the caller's
//! compute on batch k starts the moment the bytes have arrived, and the only host wait left is
//! the one that must be there: before a staging buffer is rewritten, for the copy that read it
//! two batches earlier.
//!
//! The thread also keeps the two tensors it handed out last. A caller typically drops batch k
//! right after queuing its compute; without the thread's reference the allocator would hand
//! that block to batch k+1 at once, and batch k+1's copy would have to wait for batch k's
//! compute (the copy stream is ordered after the compute that used the memory). Held back, the
//! block of batch k−2 is reused instead, whose compute finished long before.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use cartage_core::{Backend, Device, Result, StagingBuffer};

use super::source::{Source, Staged};
use super::staging_pool;
use crate::Tensor;

/// How many handed-out tensors the thread keeps (see the module docs).
const HELD_BACK: usize = 2;

/// Run the pipeline until the batches end or the loader is dropped (the channel closes).
pub(super) fn run(mut source: Source, backend: Arc<dyn Backend>, device: Device, sender: SyncSender<Result<Tensor>>) {
    let mut buffers: [Option<StagingBuffer>; 2] = [None, None];
    let mut current = 0;
    let mut recent: VecDeque<Tensor> = VecDeque::with_capacity(HELD_BACK + 1);
    while let Some(staged) = source.stage(&backend, device, &mut buffers[current]) {
        let result = staged.and_then(|staged| start_copy(buffers[current].as_ref(), &device, &staged));
        if let Ok(tensor) = &result {
            recent.push_back(tensor.clone());
            if recent.len() > HELD_BACK {
                recent.pop_front();
            }
        }
        if sender.send(result).is_err() {
            break; // the loader was dropped
        }
        current ^= 1;
    }
    drop(recent);
    // Kept for the next loader; a copy still reading one is waited for when it is next written.
    for buffer in buffers.into_iter().flatten() {
        staging_pool::give_back(device, buffer);
    }
}

/// Allocate the batch's tensor and queue the copy into it; the handle is detached (the staging
/// buffer remembers the copy, and the device orders the tensor's users after it).
fn start_copy(buffer: Option<&StagingBuffer>, device: &Device, staged: &Staged) -> Result<Tensor> {
    let tensor = Tensor::empty(&staged.shape, staged.dtype, device)?;
    if let Some(buffer) = buffer
        && staged.bytes > 0
    {
        tensor.copy_from_pinned_async(buffer)?.detach();
    }
    Ok(tensor)
}
