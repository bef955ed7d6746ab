//! Stable sort of long rows by an LSD radix sort with 8-bit digits (sort_radix.cu).
//!
//! Each value becomes an order-preserving unsigned key (complemented for a descending sort); the
//! (key, column) pairs are sorted by one stable pass per digit, least significant first: one
//! kernel counts every pass's digits of every row, then each pass is one kernel whose blocks take
//! tiles in order and find their offsets by a decoupled look-back over the row's earlier tiles.
//! The first pass reads the input directly and the last writes `values` and `indices`, so a sort
//! of 32-bit keys moves its pairs through scratch only three times.

use cartage_core::{DType, Error, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{Coalesced, KernelShape, KernelStrides, THREADS};
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::driver;
use crate::modules::{KernelName, SourceFile};

/// Columns one block ranks per pass (`RADIX_TILE` in sort_radix.cu).
const TILE: u64 = 4096;
/// Digit values (`RADIX_BINS`).
const BINS: u64 = 256;
/// The longest row the look-back words count (30 bits, `RADIX_COUNT_MASK`).
const MAX_COLS: u64 = (1 << 30) - 1;
/// Bytes kept for the per-pass tile tickets (8 passes of u32, padded).
const TICKET_BYTES: u64 = 256;

/// `struct RadixGeom` of sort_radix.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RadixGeom {
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
    passes: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for RadixGeom {}

/// Digit passes for `dtype`'s keys (8 bits each), and the bytes of a key in scratch.
fn passes(dtype: DType) -> (u32, u64) {
    match dtype {
        DType::U8 | DType::Bool => (1, 4),
        DType::F16 | DType::BF16 => (2, 4),
        DType::F32 | DType::I32 => (4, 4),
        DType::F64 | DType::I64 => (8, 8),
    }
}

/// True when the radix sort takes `rows` rows of `cols` elements: rows longer than `short`
/// (which the shared-memory sort handles in one block), short enough for the 30-bit counts,
/// with one block per tile fitting a grid.
pub(super) fn covers(rows: u64, cols: u64, short: u64) -> bool {
    cols > short && cols <= MAX_COLS && rows.saturating_mul(cols.div_ceil(TILE)) <= i32::MAX as u64
}

/// Sort `input` along `dim` into `values` and `indices`; `rows_c` is the coalesced geometry of
/// the three operands without `dim`, and [`covers`] holds.
pub(super) fn sort(
    backend: &CudaBackend,
    input: &TensorArg,
    dim: usize,
    descending: bool,
    values: &TensorArg,
    indices: &TensorArg,
    rows_c: &Coalesced,
) -> Result<()> {
    let shape = input.layout.shape();
    let cols = shape[dim] as u64;
    let rows = rows_c.dims.iter().map(|&d| d as u64).product::<u64>();
    let tiles = cols.div_ceil(TILE);
    let units = rows * tiles;
    let (passes, key_bytes) = passes(input.dtype);
    let geom = RadixGeom {
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
        passes: passes as i32,
    };
    let hist = rows * passes as u64 * BINS * 4;
    let control = hist + TICKET_BYTES + passes as u64 * units * BINS * 4;
    let to_usize = |bytes: u64| {
        usize::try_from(bytes).map_err(|_| {
            Error::invalid(
                "sort",
                format!("the radix sort's scratch of {bytes} bytes does not fit this host's address space; sort fewer rows at once"),
            )
        })
    };
    let total = rows * cols;
    // Ping-pong pairs between passes: the first pass reads the input, the last writes the
    // outputs, so one pair serves two passes and a second one is needed from three on.
    let pairs = match passes {
        1 => 0,
        2 => 1,
        _ => 2,
    };
    let mut sizes = vec![to_usize(control)?];
    for _ in 0..pairs {
        sizes.push(to_usize(total * key_bytes)?);
        sizes.push(to_usize(total * 4)?);
    }
    let mut blocks = Vec::with_capacity(sizes.len());
    for &bytes in &sizes {
        match backend.allocator.alloc(bytes) {
            Ok(block) => blocks.push(block),
            Err(e) => {
                for block in blocks {
                    backend.allocator.free(block);
                }
                return Err(e);
            }
        }
    }
    let outcome = (|| {
        let scratch: Vec<_> = blocks.iter().map(|b| b.slice()).collect();
        let mut all = vec![input.buffer, values.buffer, indices.buffer];
        all.extend(scratch.iter().copied());
        let control_addr = scratch[0].addr();
        let (hist_addr, tickets_addr, status_addr) =
            (control_addr, control_addr + hist, control_addr + hist + TICKET_BYTES);
        let pair = |i: usize| (scratch[1 + 2 * i].addr(), scratch[2 + 2 * i].addr());
        backend.bind()?;
        backend.order.before_compute(&backend.compute, &all)?;
        // SAFETY: the control block is a live block of this device of `control` bytes, cleared
        // in stream order before the kernels that count into it.
        unsafe { driver::memset_async(control_addr, 0, sizes[0], backend.compute.cu_stream()) }
            .map_err(driver::error(backend.device, "clear sort counters"))?;

        let (pi, pv, px) = (device_ptr(input), device_ptr(values), device_ptr(indices));
        let hist_kernel = backend.modules.kernel(KernelName::new(
            SourceFile::SortRadix,
            ["radix_hist", input.dtype.name(), "", ""],
        ))?;
        let hist_cfg = LaunchConfig {
            grid_dim: (
                units.clamp(1, max_blocks(backend, &hist_kernel) as u64 * 4) as u32,
                1,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_kernel!(backend, hist_kernel, hist_cfg, all, &pi, &hist_addr, &geom)?;

        let pass_kernel = backend.modules.kernel(KernelName::new(
            SourceFile::SortRadix,
            ["radix_pass", input.dtype.name(), "", ""],
        ))?;
        // One block per tile (`covers` keeps the count within a grid).
        let pass_cfg = LaunchConfig {
            grid_dim: (units as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        for pass in 0..passes as u64 {
            let (kin, iin) = if pass == 0 {
                (0, 0)
            } else {
                pair(((pass - 1) % 2) as usize)
            };
            let (kout, iout) = if pass + 1 == passes as u64 {
                (0, 0)
            } else {
                pair((pass % 2) as usize)
            };
            launch_kernel!(
                backend,
                pass_kernel,
                pass_cfg,
                all,
                &pi,
                &kin,
                &iin,
                &kout,
                &iout,
                &pv,
                &px,
                &hist_addr,
                &status_addr,
                &tickets_addr,
                &geom,
                &pass
            )?;
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the blocks are queued after these launches.
    for block in blocks {
        backend.allocator.free(block);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_the_kernels_parameters() {
        for dtype in DType::ALL {
            let hist = KernelName::new(SourceFile::SortRadix, ["radix_hist", dtype.name(), "", ""]);
            assert_eq!(
                crate::launch::ptx_param_bytes(hist.file, &hist.symbol()),
                [8, 8, std::mem::size_of::<RadixGeom>()],
                "{}",
                hist.symbol()
            );
            let pass = KernelName::new(SourceFile::SortRadix, ["radix_pass", dtype.name(), "", ""]);
            let mut want = vec![8; 10];
            want.extend([std::mem::size_of::<RadixGeom>(), 8]);
            assert_eq!(
                crate::launch::ptx_param_bytes(pass.file, &pass.symbol()),
                want,
                "{}",
                pass.symbol()
            );
        }
    }

    #[test]
    fn every_dtype_has_whole_byte_digits() {
        for dtype in DType::ALL {
            let (passes, key_bytes) = passes(dtype);
            assert_eq!(passes as usize, dtype.size_in_bytes(), "{dtype}");
            assert!(key_bytes as usize >= dtype.size_in_bytes() && key_bytes >= 4, "{dtype}");
        }
    }

    #[test]
    fn short_rows_and_huge_rows_are_left_to_the_merge_sort() {
        assert!(!covers(1, 2048, 2048));
        assert!(covers(1, 2049, 2048));
        assert!(covers(3, 1 << 20, 2048));
        assert!(!covers(1, 1 << 30, 2048));
    }
}
