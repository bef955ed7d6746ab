//! Gather and index_select as map kernels with index checking (`shaders/index.wgsl`).
//!
//! Indices are i32 or i64 (two words; a non-zero high word is out of range, negative
//! included). Each launch takes a slot of a small flags buffer; a bad index sets the slot, and
//! the next synchronisation (`synchronize`, `read`) reads the used slots back and returns the
//! first error as [`Error::IndexOutOfRange`] with op, index, dimension, size and device.
//! Errors belong to the thread that launched the op: a synchronisation on another thread keeps
//! them for the launching thread's next synchronisation.

use std::thread::ThreadId;

use cartage_core::{DType, Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::Window;
use crate::context::GpuContext;
use crate::memory::SegmentTable;
use crate::ops::geometry::coalesce;
use crate::ops::map::{MapKernel, launch};
use crate::wgsl::{self, compute_type};

const INDEX: &str = include_str!("../../shaders/index.wgsl");

/// Index-check slots before a forced check.
const SLOTS: usize = 4096;

struct PendingCheck {
    op: &'static str,
    dim: usize,
    size: usize,
    thread: ThreadId,
}

/// The flags buffer and the checks recorded since the last synchronisation.
pub(crate) struct IndexChecks {
    buffer: wgpu::Buffer,
    id: u64,
    pending: Vec<PendingCheck>,
    found: Vec<(ThreadId, Error)>,
}

impl IndexChecks {
    /// A zeroed flags buffer registered in `table`.
    pub fn new(ctx: &GpuContext, table: &SegmentTable) -> Self {
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cartage index flags"),
            size: (SLOTS * 16) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let id = table.insert(buffer.clone());
        IndexChecks {
            buffer,
            id,
            pending: Vec::new(),
            found: Vec::new(),
        }
    }

    /// Read back the slots used since the last check; the first bad index of an op this thread
    /// launched as an error (others are kept for their threads).
    pub fn check(&mut self, backend: &WgpuBackend) -> Result<()> {
        self.collect(backend)?;
        let me = std::thread::current().id();
        match self.found.iter().position(|(thread, _)| *thread == me) {
            Some(i) => Err(self.found.remove(i).1),
            None => Ok(()),
        }
    }

    fn collect(&mut self, backend: &WgpuBackend) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let used = self.pending.len() * 16;
        let mut bytes = vec![0u8; used];
        backend.read_buffer(&self.buffer, 0, &mut bytes, "index check")?;
        backend.ctx.queue.write_buffer(&self.buffer, 0, &vec![0u8; used]);
        let pending = std::mem::take(&mut self.pending);
        for (slot, check) in pending.iter().enumerate() {
            let word = |k: usize| {
                u32::from_le_bytes(
                    bytes[slot * 16 + 4 * k..slot * 16 + 4 * k + 4]
                        .try_into()
                        .unwrap_or([0; 4]),
                )
            };
            if word(0) != 0 && !self.found.iter().any(|(thread, _)| *thread == check.thread) {
                let index = (u64::from(word(2)) << 32 | u64::from(word(1))) as i64;
                let error = Error::IndexOutOfRange {
                    op: check.op,
                    index,
                    dim: check.dim,
                    size: check.size,
                    device: backend.ctx.cartage_device,
                };
                self.found.push((check.thread, error));
            }
        }
        Ok(())
    }
}

impl IndexChecks {
    /// A slot for an op launched now by this thread, and the window of the flags buffer.
    pub(crate) fn reserve(
        &mut self,
        backend: &WgpuBackend,
        op: &'static str,
        dim: usize,
        size: usize,
    ) -> Result<(u32, Window)> {
        if self.pending.len() == SLOTS {
            self.collect(backend)?;
        }
        let thread = std::thread::current().id();
        self.pending.push(PendingCheck { op, dim, size, thread });
        let window = Window {
            segment: self.id,
            offset: 0,
            size: self.buffer.size(),
        };
        Ok(((self.pending.len() - 1) as u32, window))
    }
}

fn zero(dtype: DType) -> &'static str {
    match compute_type(dtype) {
        "f32" => "0.0",
        "f64" => "0.0lf",
        "i32" => "0",
        "u32" => "0u",
        _ => "vec2<u32>(0u, 0u)",
    }
}

fn body(out: DType, index: DType) -> String {
    let pair = match index {
        DType::I64 => "raw",
        _ => "vec2<u32>(bitcast<u32>(raw), select(0u, 0xffffffffu, raw < 0))",
    };
    format!(
        "{INDEX}
fn compute(i: u32) -> {c} {{
    let o = offsets(i);
    let raw = ld_2(o.z);
    let idx = {pair};
    if idx.y != 0u || idx.x >= P.extra[0].y {{
        report_bad_index(P.extra[0].z, idx);
        return {zero};
    }}
    return ld_1(o.y + idx.x * P.extra[0].x);
}}",
        c = compute_type(out),
        zero = zero(out)
    )
}

/// Record a gather-like map over `out` (the kernel is validated: index dtype, `dim` and shapes).
#[allow(clippy::too_many_arguments)]
fn launch_indexed(
    backend: &WgpuBackend,
    op: &'static str,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
    index_strides: Vec<usize>,
) -> Result<()> {
    if out.layout.numel() == 0 {
        return Ok(());
    }
    let size = input.layout.shape()[dim];
    let mut input_strides = input.layout.strides().to_vec();
    let dim_stride = input_strides[dim];
    input_strides[dim] = 0;
    let geometry = coalesce(
        out.layout.shape(),
        &[out.layout.strides(), &input_strides, &index_strides],
    );
    // The slot is reserved and the op recorded under one lock, so that no check on another
    // thread can read the slot before the op that may set it is recorded.
    let mut checks = backend.index_checks.lock().unwrap_or_else(|p| p.into_inner());
    let (slot, window) = checks.reserve(backend, op, dim, size)?;
    let (out_dtype, index_dtype) = (out.dtype, index.dtype);
    let mut kernel = MapKernel::new((op, ""), out, vec![input, index], move || body(out_dtype, index_dtype));
    kernel.geometry = Some(geometry);
    kernel.extra[0] = crate::ops::geometry::word(dim_stride, "stride")?;
    kernel.extra[1] = crate::ops::geometry::word(size, "dimension size")?;
    kernel.extra[2] = slot;
    kernel.extra_windows = vec![window];
    kernel.extra_bindings = wgsl::binding(4, "flags", "atomic<u32>");
    let result = launch(backend, &kernel);
    drop(checks);
    result
}

/// torch.gather along `dim`.
pub(crate) fn gather(
    backend: &WgpuBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let strides = index.layout.strides().to_vec();
    launch_indexed(backend, "gather", input, index, dim, out, strides)
}

/// Rows of `input` along `dim` chosen by a 1-D `index`.
pub(crate) fn index_select(
    backend: &WgpuBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let mut strides = vec![0usize; out.layout.rank()];
    if dim < strides.len() {
        strides[dim] = index.layout.strides()[0];
    }
    launch_indexed(backend, "index_select", input, index, dim, out, strides)
}
