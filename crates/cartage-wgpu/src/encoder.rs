//! Batched command recording: ops go into one shared command encoder, consecutive dispatches
//! into one compute pass, and the batch is submitted at a sync point, before a read, before a
//! host write, or when the parameter buffer is full ([`MAX_OPS_PER_BATCH`] ops).
//!
//! Each op's 256-byte parameter block is appended to a host-side staging vector and bound at a
//! dynamic offset of one uniform buffer; the whole vector is written with one `write_buffer`
//! right before the submit, which wgpu orders before the batch's commands. A chain of small ops
//! between two syncs therefore costs one pass, one parameter upload and one submit per
//! `submit_every` ops (default [`DEFAULT_SUBMIT_EVERY`]), so that the device works on one batch
//! while the host records the next.

use cartage_core::Result;

use crate::context::GpuContext;
use crate::pipelines::PARAM_BYTES;

/// The most ops one batch can hold (the parameter buffer has one slot per op).
pub(crate) const MAX_OPS_PER_BATCH: usize = 1024;

/// Ops recorded before a batch is submitted without waiting for a sync point, by default: the
/// device starts on them while the host records the next ones.
pub(crate) const DEFAULT_SUBMIT_EVERY: usize = 256;

/// One op's parameters (64 words; kernels read the fields they declare).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ParamBlock(pub [u32; 64]);

impl Default for ParamBlock {
    fn default() -> Self {
        ParamBlock([0; 64])
    }
}

/// The recorder of the current batch.
pub(crate) struct Recorder {
    params_buffer: wgpu::Buffer,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u8>,
    ops: usize,
    submit_every: usize,
    /// Address of the pipeline last set in the open pass (only compared, never dereferenced).
    last_pipeline: usize,
    dispatches: u64,
    submits: u64,
}

impl Recorder {
    /// A recorder for `ctx` with its parameter buffer.
    pub fn new(ctx: &GpuContext) -> Self {
        let params_buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cartage op parameters"),
            size: PARAM_BYTES * MAX_OPS_PER_BATCH as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Recorder {
            params_buffer,
            encoder: None,
            pass: None,
            params: Vec::with_capacity(PARAM_BYTES as usize * MAX_OPS_PER_BATCH),
            ops: 0,
            submit_every: DEFAULT_SUBMIT_EVERY,
            last_pipeline: 0,
            dispatches: 0,
            submits: 0,
        }
    }

    /// The uniform buffer parameter blocks are bound from.
    pub fn params_buffer(&self) -> &wgpu::Buffer {
        &self.params_buffer
    }

    /// Submit a batch once it holds `ops` ops (clamped to 1..=MAX_OPS_PER_BATCH).
    pub fn set_submit_every(&mut self, ops: usize) {
        self.submit_every = ops.clamp(1, MAX_OPS_PER_BATCH);
    }

    /// (dispatches recorded, batches submitted) since creation.
    pub fn counters(&self) -> (u64, u64) {
        (self.dispatches, self.submits)
    }

    fn encoder(&mut self, ctx: &GpuContext) -> &mut wgpu::CommandEncoder {
        self.encoder.get_or_insert_with(|| {
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("cartage batch"),
            })
        })
    }

    /// End the open compute pass, if any, so the encoder can record copies.
    fn end_pass(&mut self) {
        self.pass = None;
        self.last_pipeline = 0;
    }

    /// Record one dispatch of `pipeline` with `bind_group` and `params`.
    pub fn dispatch(
        &mut self,
        ctx: &GpuContext,
        pipeline: &wgpu::ComputePipeline,
        bind_group: &wgpu::BindGroup,
        params: &ParamBlock,
        groups: [u32; 3],
    ) -> Result<()> {
        if self.ops >= self.submit_every {
            self.submit(ctx);
        }
        let offset = (self.ops as u64 * PARAM_BYTES) as u32;
        self.params.extend_from_slice(bytemuck::cast_slice(&params.0));
        self.ops += 1;
        self.dispatches += 1;
        if self.pass.is_none() {
            let pass = self
                .encoder(ctx)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("cartage ops"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        let pass = self.pass.as_mut().expect("a compute pass was just opened");
        // Cached pipelines live as long as the device, so their address identifies them.
        let address = std::ptr::from_ref(pipeline) as usize;
        if address != self.last_pipeline {
            pass.set_pipeline(pipeline);
            self.last_pipeline = address;
        }
        pass.set_bind_group(0, bind_group, &[offset]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    /// Record a buffer-to-buffer copy (offsets and size multiples of 4, distinct buffers).
    pub fn copy(
        &mut self,
        ctx: &GpuContext,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    ) {
        self.end_pass();
        self.encoder(ctx)
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
    }

    /// Record a timestamp into `query_set[index]` after all work recorded so far.
    pub fn timestamp(&mut self, ctx: &GpuContext, query_set: &wgpu::QuerySet, index: u32) {
        self.end_pass();
        if ctx.has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS) {
            self.encoder(ctx).write_timestamp(query_set, index);
        } else {
            // An empty pass whose beginning is timestamped (written at the bottom of the pipe,
            // after the work before it).
            let pass = self.encoder(ctx).begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("cartage timestamp"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set,
                    beginning_of_pass_write_index: Some(index),
                    end_of_pass_write_index: None,
                }),
            });
            drop(pass);
        }
    }

    /// Record the resolution of `count` queries into `destination` at `offset`.
    pub fn resolve(
        &mut self,
        ctx: &GpuContext,
        query_set: &wgpu::QuerySet,
        count: u32,
        destination: &wgpu::Buffer,
        offset: u64,
    ) {
        self.end_pass();
        self.encoder(ctx)
            .resolve_query_set(query_set, 0..count, destination, offset);
    }

    /// Submit the batch (parameters first); the submission index, or `None` when empty.
    pub fn submit(&mut self, ctx: &GpuContext) -> Option<wgpu::SubmissionIndex> {
        self.end_pass();
        let encoder = self.encoder.take()?;
        if !self.params.is_empty() {
            ctx.queue.write_buffer(&self.params_buffer, 0, &self.params);
            self.params.clear();
        }
        self.ops = 0;
        self.submits += 1;
        Some(ctx.queue.submit(Some(encoder.finish())))
    }
}
