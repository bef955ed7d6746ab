//! Ordering the compute stream, the copy stream and the communicators' streams against each
//! other, per segment.
//!
//! All kernels, cuBLAS calls and synchronous copies run on the compute stream, in order.
//! Asynchronous copies run on the copy stream so that they can overlap compute (R10), and NCCL
//! collectives on their communicator's own stream so that they can overlap backward (the `nccl`
//! module). That leaves two hazards per side stream, both handled here with events instead of
//! stream-wide waits:
//! - a copy or a collective must not touch a segment before the compute work already queued on
//!   it has finished (that includes a block freed and handed out again while kernels still read
//!   it): its stream waits for an event recorded on the compute stream at the segment's last use
//!   (a shared marker, recorded again only when it no longer covers that use);
//! - compute work must not touch a segment before an asynchronous copy or a collective on it has
//!   finished: the copy's or collective's event is kept with the segment, and the next compute
//!   submission that uses the segment makes the compute stream wait for it (then forgets it).
//!   Freeing needs nothing more: a block returned to the caching allocator and handed out again
//!   lies in the same segment, so its next user waits the same way.
//!
//! Between side streams the same events apply: a copy waits for the collectives pending on its
//! segment, and a collective for the copy and the other communicators' collectives pending on
//! it. A prefetch into a fresh block therefore overlaps the kernels still running on other
//! memory, and a gradient bucket's all-reduce the backward kernels queued after it.

use std::sync::{Arc, Mutex};

use cartage_core::raw::BufferSlice;
use cartage_core::{Device, Result};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::driver;

#[derive(Default)]
struct SegmentUse {
    /// Compute submission number of the last compute work that used the segment (0: none).
    last_compute: u64,
    /// The last asynchronous copy that touched the segment, not yet waited for by compute.
    pending_copy: Option<Arc<CudaEvent>>,
    /// The last collective of each communicator's stream (keyed by the stream's handle) that
    /// touched the segment, not yet waited for by compute.
    pending_collectives: Vec<(usize, Arc<CudaEvent>)>,
}

#[derive(Default)]
struct State {
    /// Compute submissions so far.
    submissions: u64,
    /// Indexed by segment id (ids are small and handed out in order by `DeviceMemory`; 0 is all
    /// imported memory, `cartage_core::raw::EXTERNAL_SEGMENT_ID`, tracked as one segment).
    segments: Vec<SegmentUse>,
    /// An event on the compute stream and the submission number it was recorded after.
    marker: Option<(CudaEvent, u64)>,
    /// The last compute submission whose segments are unknown (a graph replay): every later
    /// copy waits for it, whatever segment it touches.
    opaque: u64,
}

/// The per-segment bookkeeping of one device; see the module docs.
pub struct StreamOrder {
    device: Device,
    state: Mutex<State>,
}

impl StreamOrder {
    /// Bookkeeping for `device`.
    pub fn new(device: Device) -> Self {
        StreamOrder {
            device,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn segment(&mut self, id: u64) -> &mut SegmentUse {
        let index = id as usize;
        if index >= self.segments.len() {
            self.segments.resize_with(index + 1, SegmentUse::default);
        }
        &mut self.segments[index]
    }
}

impl StreamOrder {
    /// Call before queuing compute work that uses `slices`: waits for pending asynchronous copies
    /// and collectives of their segments and records the use.
    ///
    /// When the work consumes a copy (a prefetched batch) or a collective (a reduced bucket), a
    /// fresh marker is recorded first, after all earlier compute: the next copies into memory
    /// that earlier compute used then wait for that point, not for this work (which itself waits
    /// for the copy), so copies and compute keep overlapping. It costs one event record per
    /// consumed copy, none otherwise.
    pub fn before_compute(&self, compute: &CudaStream, slices: &[BufferSlice]) -> Result<()> {
        let mut state = self.lock();
        state.submissions += 1;
        let now = state.submissions;
        let mut consumed_copy = false;
        for slice in slices {
            let entry = state.segment(slice.segment().id);
            entry.last_compute = now;
            if let Some(event) = entry.pending_copy.take() {
                compute
                    .wait(&event)
                    .map_err(driver::error(self.device, "order compute after copy"))?;
                consumed_copy = true;
            }
            for (_, event) in std::mem::take(&mut entry.pending_collectives) {
                compute
                    .wait(&event)
                    .map_err(driver::error(self.device, "order compute after a collective"))?;
                consumed_copy = true;
            }
        }
        if consumed_copy {
            let event = match state.marker.take() {
                Some((event, _)) => event,
                None => compute
                    .context()
                    .new_event(None)
                    .map_err(driver::error(self.device, "create event"))?,
            };
            event
                .record(compute)
                .map_err(driver::error(self.device, "record event"))?;
            state.marker = Some((event, now - 1));
        }
        Ok(())
    }

    /// Call before queuing compute work whose segments are not known here (a graph replay): it
    /// waits for every pending asynchronous copy and collective, and every later copy and
    /// collective waits for it.
    pub fn before_opaque_compute(&self, compute: &CudaStream) -> Result<()> {
        let mut state = self.lock();
        state.submissions += 1;
        state.opaque = state.submissions;
        for entry in state.segments.iter_mut() {
            if let Some(event) = entry.pending_copy.take() {
                compute
                    .wait(&event)
                    .map_err(driver::error(self.device, "order compute after copy"))?;
            }
            for (_, event) in std::mem::take(&mut entry.pending_collectives) {
                compute
                    .wait(&event)
                    .map_err(driver::error(self.device, "order compute after a collective"))?;
            }
        }
        Ok(())
    }

    /// Call before queuing a copy of `slice` on `copy`: the copy stream waits for the compute
    /// work queued on the segment so far (and for any graph replay queued so far), and for the
    /// collectives pending on it.
    pub fn copy_after_compute(
        &self,
        ctx: &Arc<CudaContext>,
        compute: &CudaStream,
        copy: &CudaStream,
        slice: BufferSlice,
    ) -> Result<()> {
        let mut state = self.lock();
        for (_, event) in &state.segment(slice.segment().id).pending_collectives {
            copy.wait(event)
                .map_err(driver::error(self.device, "order copy after a collective"))?;
        }
        self.side_after_compute(&mut state, ctx, compute, copy, slice)
    }

    /// Call before queuing a collective that touches `slice` on `comm`, its communicator's
    /// stream: `comm` waits for the compute work queued on the segment so far (and for any graph
    /// replay queued so far), for a pending asynchronous copy of it, and for the collectives of
    /// other communicators pending on it.
    pub fn collective_after_compute(
        &self,
        ctx: &Arc<CudaContext>,
        compute: &CudaStream,
        comm: &CudaStream,
        slice: BufferSlice,
    ) -> Result<()> {
        let mut state = self.lock();
        let key = comm.cu_stream() as usize;
        let entry = state.segment(slice.segment().id);
        let others = entry
            .pending_collectives
            .iter()
            .filter(|(stream, _)| *stream != key)
            .map(|(_, event)| event);
        for event in entry.pending_copy.iter().chain(others) {
            comm.wait(event)
                .map_err(driver::error(self.device, "order a collective after earlier work"))?;
        }
        self.side_after_compute(&mut state, ctx, compute, comm, slice)
    }

    /// Make `side` (the copy stream or a communicator's stream) wait for the compute work queued
    /// on `slice`'s segment so far, through the marker.
    fn side_after_compute(
        &self,
        state: &mut State,
        ctx: &Arc<CudaContext>,
        compute: &CudaStream,
        side: &CudaStream,
        slice: BufferSlice,
    ) -> Result<()> {
        let needed = state.segment(slice.segment().id).last_compute.max(state.opaque);
        if needed == 0 {
            return Ok(());
        }
        let submissions = state.submissions;
        let covered = state.marker.as_ref().is_some_and(|(_, at)| *at >= needed);
        if !covered {
            let event = match state.marker.take() {
                Some((event, _)) => event,
                None => ctx
                    .new_event(None)
                    .map_err(driver::error(self.device, "create event"))?,
            };
            event
                .record(compute)
                .map_err(driver::error(self.device, "record event"))?;
            state.marker = Some((event, submissions));
        }
        if let Some((event, _)) = &state.marker {
            side.wait(event)
                .map_err(driver::error(self.device, "order a side stream after compute"))?;
        }
        Ok(())
    }

    /// Call after queuing an asynchronous copy of `slice` whose completion `event` records.
    pub fn after_copy(&self, slice: BufferSlice, event: Arc<CudaEvent>) {
        self.lock().segment(slice.segment().id).pending_copy = Some(event);
    }

    /// Call after queuing a collective on `comm` that touched `slice`, whose completion `event`
    /// records (it replaces the segment's earlier event of the same stream, which it follows).
    pub fn after_collective(&self, comm: &CudaStream, slice: BufferSlice, event: Arc<CudaEvent>) {
        let key = comm.cu_stream() as usize;
        let mut state = self.lock();
        let pending = &mut state.segment(slice.segment().id).pending_collectives;
        match pending.iter_mut().find(|(stream, _)| *stream == key) {
            Some(slot) => slot.1 = event,
            None => pending.push((key, event)),
        }
    }

    /// Forget a segment returned to the driver.
    pub fn forget_segment(&self, id: u64) {
        *self.lock().segment(id) = SegmentUse::default();
    }

    /// Forget every pending copy (after a synchronisation of the compute and copy streams), and
    /// wait for the pending collectives before forgetting them: they run on communicators'
    /// streams, which that synchronisation does not cover.
    pub fn clear_pending(&self) {
        let mut collectives = Vec::new();
        for entry in self.lock().segments.iter_mut() {
            entry.pending_copy = None;
            collectives.append(&mut entry.pending_collectives);
        }
        for (_, event) in collectives {
            if let Err(e) = event.synchronize() {
                tracing::error!(device = %self.device, error = %e, "waiting for a collective failed");
            }
        }
    }
}
