//! Scan (cumsum, cumprod) along one dimension: a block per row with a block-wide scan and a
//! running carry over chunks, or a thread per row when the rows lie side by side in memory (a
//! scan along a leading dimension), so that neighbouring threads read neighbouring addresses.

use cartage_core::{Result, ScanOp, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{KernelShape, KernelStrides, THREADS, grid};
use super::rows::row_geometry;
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// `struct ScanGeom` of scan.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ScanGeom {
    rows: u64,
    cols: u64,
    rows_shape: KernelShape,
    rows_in: KernelStrides,
    rows_out: KernelStrides,
    in_stride: i64,
    out_stride: i64,
    group: i32,
    pad: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for ScanGeom {}

pub(super) fn scan(backend: &CudaBackend, op: ScanOp, input: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let (rows_c, rows) = row_geometry(op.name(), input, out, dim)?;
    let cols = input.layout.shape()[dim] as u64;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (in_stride, out_stride) = (input.layout.strides()[dim], out.layout.strides()[dim]);
    let side_by_side = rows_c.strides.iter().all(|s| s.last() == Some(&1));
    let per_thread = in_stride != 1 && side_by_side && rows >= 1024;
    let geom = ScanGeom {
        rows,
        cols,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_out: rows_c.strides(1),
        in_stride: in_stride as i64,
        out_stride: out_stride as i64,
        group: if per_thread { 1 } else { THREADS as i32 },
        pad: 0,
    };
    let kind = match op {
        ScanOp::Sum => "sum",
        ScanOp::Prod => "prod",
    };
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Scan,
        ["scan", kind, input.dtype.name(), ""],
    ))?;
    let wave = max_blocks(backend, &kernel);
    let cfg = if per_thread {
        grid(rows, wave)
    } else {
        LaunchConfig {
            grid_dim: (rows.clamp(1, wave as u64 * 4) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    };
    let (pi, po) = (device_ptr(input), device_ptr(out));
    launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &pi, &po, &geom)
}
