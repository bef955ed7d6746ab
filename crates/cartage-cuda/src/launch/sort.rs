//! Stable sort along one dimension, on (key, position) pairs (sort.cu).
//!
//! A row of up to [`TILE`] elements is sorted by one block in shared memory and written out
//! directly. A longer row goes to the radix sort ([`radix`], sort_radix.cu) where it covers it;
//! otherwise (rows of 2^30 elements or more) it is cut into tiles sorted the same way into
//! scratch, then merged by passes of a merge sort in global memory (each element placed by a
//! binary search in the other run; runs double each pass), and finally the values are gathered
//! through the positions.

use cartage_core::{Error, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{Coalesced, KernelShape, KernelStrides, THREADS, grid};
use super::{device_ptr, launch_kernel, max_blocks, size_name};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// Elements one block sorts in shared memory (`SORT_TILE` in sort.cu).
const TILE: u64 = 2048;

/// `struct SortGeom` of sort.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SortGeom {
    rows: u64,
    cols: u64,
    rows_shape: KernelShape,
    rows_in: KernelStrides,
    rows_val: KernelStrides,
    rows_idx: KernelStrides,
    in_stride: i64,
    val_stride: i64,
    idx_stride: i64,
    tiles: u64,
    descending: i32,
    direct: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for SortGeom {}

pub(super) fn sort(
    backend: &CudaBackend,
    input: &TensorArg,
    dim: usize,
    descending: bool,
    values: &TensorArg,
    indices: &TensorArg,
) -> Result<()> {
    let shape = input.layout.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
    let pick = |v: &[usize]| kept.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let rows_c = Coalesced::new(
        &pick(shape),
        &[
            &pick(input.layout.strides()),
            &pick(values.layout.strides()),
            &pick(indices.layout.strides()),
        ],
    );
    rows_c.check_rank("sort")?;
    let rows: u64 = kept.iter().map(|&d| shape[d] as u64).product();
    let cols = shape[dim] as u64;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    if cols >= u32::MAX as u64 {
        return Err(Error::invalid(
            "sort",
            format!("the CUDA sort takes rows of fewer than 2^32 - 1 elements, not {cols}; sort a reshaped tensor"),
        ));
    }
    if super::sort_radix::covers(rows, cols, TILE) {
        return super::sort_radix::sort(backend, input, dim, descending, values, indices, &rows_c);
    }
    let tiles = cols.div_ceil(TILE);
    let mut geom = SortGeom {
        rows,
        cols,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_val: rows_c.strides(1),
        rows_idx: rows_c.strides(2),
        in_stride: input.layout.strides()[dim] as i64,
        val_stride: values.layout.strides()[dim] as i64,
        idx_stride: indices.layout.strides()[dim] as i64,
        tiles,
        descending: descending as i32,
        direct: (tiles == 1) as i32,
    };
    let tile = backend.modules.kernel(KernelName::new(
        SourceFile::Sort,
        ["sort_tile", input.dtype.name(), "", ""],
    ))?;
    let units = rows * tiles;
    let tile_cfg = LaunchConfig {
        grid_dim: (units.clamp(1, max_blocks(backend, &tile) as u64 * 8) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (pi, pv, px) = (device_ptr(input), device_ptr(values), device_ptr(indices));
    let outputs = [input.buffer, values.buffer, indices.buffer];
    if tiles == 1 {
        let none = 0u64;
        return launch_kernel!(backend, tile, tile_cfg, outputs, &pi, &pv, &px, &none, &none, &geom);
    }
    let total = (rows * cols) as usize;
    let blocks = [
        backend.allocator.alloc(total * 8)?,
        backend.allocator.alloc(total * 4)?,
        backend.allocator.alloc(total * 8)?,
        backend.allocator.alloc(total * 4)?,
    ];
    let outcome = (|| {
        let s: Vec<_> = blocks.iter().map(|b| b.slice()).collect();
        let (mut ka, mut ia, mut kb, mut ib) = (s[0].addr(), s[1].addr(), s[2].addr(), s[3].addr());
        geom.direct = 0;
        let all = [input.buffer, values.buffer, indices.buffer, s[0], s[1], s[2], s[3]];
        launch_kernel!(backend, tile, tile_cfg, all, &pi, &pv, &px, &ka, &ia, &geom)?;
        let merge = backend
            .modules
            .kernel(KernelName::new(SourceFile::Sort, ["sort_merge", "", "", ""]))?;
        let merge_cfg = grid(rows * cols, max_blocks(backend, &merge));
        let mut width = TILE;
        while width < cols {
            launch_kernel!(backend, merge, merge_cfg, all, &ka, &ia, &kb, &ib, &rows, &cols, &width)?;
            std::mem::swap(&mut ka, &mut kb);
            std::mem::swap(&mut ia, &mut ib);
            width *= 2;
        }
        let finish = backend.modules.kernel(KernelName::new(
            SourceFile::Sort,
            ["sort_finish", size_name(input.dtype), "", ""],
        ))?;
        let finish_cfg = grid(rows * cols, max_blocks(backend, &finish));
        launch_kernel!(backend, finish, finish_cfg, all, &pi, &pv, &px, &ia, &geom)
    })();
    // Safe to reuse at once: later users of the blocks are queued after these launches.
    for block in blocks {
        backend.allocator.free(block);
    }
    outcome
}
