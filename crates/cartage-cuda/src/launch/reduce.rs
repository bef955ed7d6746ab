//! Reductions and softmax: the input seen as rows (kept dimensions, one per output element) ×
//! columns (reduced dimensions), and a choice of how many threads share a row.
//!
//! - long rows: a block per row; when there are few rows (a full reduction, a per-row reduction
//!   of a short matrix) each row is split over many blocks writing partial states, combined by a
//!   second launch — so a full reduction of 1 GiB keeps every multiprocessor busy;
//! - shorter rows: a warp per row;
//! - many short rows that lie side by side in memory (reducing a leading dimension): a thread
//!   per row, so neighbouring threads read neighbouring addresses; when those threads would not
//!   fill the GPU (a bias gradient, a few thousand outputs each summing tens of thousands of
//!   rows), the reduced dimension is split into chunks as well, neighbouring threads still
//!   taking neighbouring outputs of one chunk;
//! - a sum or mean over the leading dimension of a dense matrix (a bias gradient): the
//!   column-sum kernel of `column_sum.rs`, 16 bytes of neighbouring outputs per thread.
//!
//! Partial states come from the caching allocator and go back to it right after the launches
//! are queued (stream order makes the reuse safe).

use cartage_core::{ReduceOp, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{Coalesced, KernelShape, KernelStrides, THREADS};
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// `struct ReduceGeom` of reduce.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ReduceGeom {
    rows: u64,
    cols: u64,
    split: u64,
    chunk: u64,
    rows_shape: KernelShape,
    rows_in: KernelStrides,
    rows_out: KernelStrides,
    cols_shape: KernelShape,
    cols_in: KernelStrides,
    group: i32,
    dense: i32,
    finish: i32,
    pad: i32,
}

/// `struct SoftmaxGeom` of reduce.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SoftmaxGeom {
    rows: u64,
    cols: u64,
    rows_shape: KernelShape,
    rows_in: KernelStrides,
    rows_out: KernelStrides,
    in_stride: i64,
    out_stride: i64,
    group: i32,
    log: i32,
    /// Causal: rows per `[L, S]` matrix (row `r` keeps its first `r % L + 1` elements); 0 keeps
    /// every element.
    causal_rows: u64,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for ReduceGeom {}
// SAFETY: as above.
unsafe impl DeviceRepr for SoftmaxGeom {}

/// Bytes of the largest partial state (`ArgAcc<double>`, `LseAcc<double>`).
const PARTIAL_BYTES: usize = 16;

fn config(units: u64, group: u32, max: u32) -> LaunchConfig {
    let per_block = (THREADS / group) as u64;
    let blocks = units.div_ceil(per_block).clamp(1, max as u64) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn pick<T: Copy>(values: &[T], dims: &[usize]) -> Vec<T> {
    dims.iter().map(|&d| values[d]).collect()
}

pub(super) fn reduce(
    backend: &CudaBackend,
    op: ReduceOp,
    input: &TensorArg,
    dims: &[usize],
    out: &TensorArg,
) -> Result<()> {
    let name = op.name();
    let rank = input.layout.rank();
    let shape = input.layout.shape();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let (in_strides, out_strides) = (input.layout.strides(), out.layout.strides());
    let row_dims = pick(shape, &kept);
    let rows_c = Coalesced::new(&row_dims, &[&pick(in_strides, &kept), &pick(out_strides, &kept)]);
    rows_c.check_rank(name)?;
    let col_dims = pick(shape, dims);
    let cols_c = Coalesced::new(&col_dims, &[&pick(in_strides, dims)]);
    cols_c.check_rank(name)?;
    let rows = row_dims.iter().product::<usize>() as u64;
    let cols = col_dims.iter().product::<usize>() as u64;
    if rows == 0 {
        return Ok(());
    }
    if super::column_sum::column_sum(backend, op, input, &rows_c, &cols_c, out)? {
        return Ok(());
    }
    let dense = cols <= 1 || (cols_c.dims.len() == 1 && cols_c.strides[0][0] == 1);
    let rows_side_by_side = rows_c.strides[0].last() == Some(&1);
    let file = match op {
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::LogSumExp | ReduceOp::Prod => SourceFile::Reduce,
        _ => SourceFile::Extreme,
    };
    let kernel = backend
        .modules
        .kernel(KernelName::new(file, ["reduce", name, input.dtype.name(), ""]))?;
    // One full wave of blocks: every grid-stride loop below ends at the same time. A warp per row
    // when there are rows enough to fill at least half of that wave with warps (no block-wide
    // synchronisation per row), a block per row for long rows or few of them.
    let wave = max_blocks(backend, &kernel) as u64;
    let group: u32 = if cols <= 8 || (!dense && rows >= 1024 && rows_side_by_side) {
        1
    } else if cols < 2048 || (cols < 16384 && 2 * rows * 32 >= wave * THREADS as u64) {
        32
    } else {
        THREADS
    };
    let (mut split, mut chunk) = (1u64, cols.max(1));
    if group == THREADS && rows < wave && cols >= 65536 {
        let wanted = wave.div_ceil(rows).clamp(1, cols / 16384);
        chunk = cols.div_ceil(wanted).div_ceil(16) * 16;
        split = cols.div_ceil(chunk);
    } else if group == 1 && cols >= 256 && rows < wave * THREADS as u64 {
        // One thread per output leaves most of the GPU idle when the outputs are few and the
        // reduced dim long (a bias gradient: [16384, 1152] summed over dim 0 ran on 5 blocks):
        // split the reduced dim so that about one wave of threads runs, each summing a chunk of
        // at least 32 elements, and combine the chunks in a second pass.
        let wanted = (wave * THREADS as u64).div_ceil(rows).clamp(1, cols / 32);
        chunk = cols.div_ceil(wanted);
        split = cols.div_ceil(chunk);
    }
    let mut geom = ReduceGeom {
        rows,
        cols,
        split,
        chunk,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_out: rows_c.strides(1),
        cols_shape: cols_c.shape(),
        cols_in: cols_c.strides(0),
        group: group as i32,
        dense: dense as i32,
        finish: 0,
        pad: 0,
    };
    let (pi, po) = (device_ptr(input), device_ptr(out));
    let max = wave as u32;
    if split == 1 {
        let pp = 0u64;
        let cfg = config(rows, group, max);
        return launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &pi, &po, &pp, &geom);
    }
    let partials = backend.allocator.alloc((rows * split) as usize * PARTIAL_BYTES)?;
    let slice = partials.slice();
    let pp = slice.addr();
    let first = (|| {
        let cfg = config(rows * split, group, max);
        launch_kernel!(backend, kernel, cfg, [input.buffer, slice], &pi, &po, &pp, &geom)?;
        geom.finish = 1;
        geom.group = if split > 32 { THREADS as i32 } else { 32 };
        let cfg = config(rows, geom.group as u32, max);
        launch_kernel!(backend, kernel, cfg, [slice, out.buffer], &pi, &po, &pp, &geom)
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(partials);
    first
}

/// `Kernel::Softmax`: the register-row kernels for dense rows, else (and for every causal
/// softmax, whose rows read only their unmasked part) a warp or a block per row.
pub(super) fn softmax(
    backend: &CudaBackend,
    input: &TensorArg,
    dim: usize,
    log: bool,
    causal: bool,
    out: &TensorArg,
) -> Result<()> {
    if !causal && super::rows::softmax_fast(backend, input, dim, log, out)? {
        return Ok(());
    }
    let op = if log { "log_softmax" } else { "softmax" };
    let rank = input.layout.rank();
    let shape = input.layout.shape();
    let kept: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
    let row_dims = pick(shape, &kept);
    let rows_c = Coalesced::new(
        &row_dims,
        &[&pick(input.layout.strides(), &kept), &pick(out.layout.strides(), &kept)],
    );
    rows_c.check_rank(op)?;
    let rows = row_dims.iter().product::<usize>() as u64;
    let cols = shape[dim] as u64;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let group: u32 = if cols >= 1024 { THREADS } else { 32 };
    let geom = SoftmaxGeom {
        rows,
        cols,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_out: rows_c.strides(1),
        in_stride: input.layout.strides()[dim] as i64,
        out_stride: out.layout.strides()[dim] as i64,
        group: group as i32,
        log: log as i32,
        causal_rows: if causal { shape[rank - 2] as u64 } else { 0 },
    };
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Softmax,
        ["softmax", input.dtype.name(), "", ""],
    ))?;
    let (pi, po) = (device_ptr(input), device_ptr(out));
    let cfg = config(rows, group, max_blocks(backend, &kernel));
    launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &pi, &po, &geom)
}
