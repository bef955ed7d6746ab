//! `Kernel::Copy` (`contiguous`, transposes, permutes, strided writes): a driver copy for dense
//! views, a tiled shared-memory transpose when the input's unit-stride dimension is not the
//! output's, and otherwise a gather whose elements are widened to 16-, 8- or 4-byte vectors when
//! the innermost dimension is contiguous on both sides.

use cartage_core::{Result, TensorArg};
use cudarc::driver::LaunchConfig;

use super::geometry::{Coalesced, KernelShape, KernelStrides, THREADS, grid};
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::driver;
use crate::modules::{KernelName, SourceFile};

/// The transpose kernel's tile edge (`TILE` in construct.cu).
const TILE: u64 = 32;
/// The shortest rows and columns worth a tile: below this most of a tile's threads would idle.
const MIN_TILE_EXTENT: usize = 16;

/// The name part of a `bytes`-wide element.
fn width_name(bytes: usize) -> &'static str {
    match bytes {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        8 => "b8",
        _ => "b16",
    }
}

/// A copy seen as `out[rest][r][c] = in[rest][r][c]`, where the input's unit stride runs along
/// `r` and the output's along `c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransposePlan {
    /// The other dimensions.
    rest: Vec<usize>,
    /// Their strides in the output and the input.
    rest_out: Vec<usize>,
    rest_in: Vec<usize>,
    rows: usize,
    cols: usize,
    /// The output's stride along `r` and the input's along `c`.
    out_row: usize,
    in_col: usize,
}

impl TransposePlan {
    /// The plan for a coalesced copy (operand 0 the output, 1 the input), or `None` when the
    /// innermost dimension is contiguous on both sides or the tile would be mostly empty.
    pub(crate) fn of(geometry: &Coalesced) -> Option<Self> {
        let (dims, so, si) = (&geometry.dims, &geometry.strides[0], &geometry.strides[1]);
        let last = dims.len().checked_sub(1)?;
        if last == 0 || so[last] != 1 || si[last] == 1 {
            return None;
        }
        let k = (0..last).find(|&d| si[d] == 1)?;
        if dims[k] < MIN_TILE_EXTENT || dims[last] < MIN_TILE_EXTENT {
            return None;
        }
        let others = |s: &[usize]| -> Vec<usize> { (0..last).filter(|&d| d != k).map(|d| s[d]).collect() };
        Some(TransposePlan {
            rest: others(dims),
            rest_out: others(so),
            rest_in: others(si),
            rows: dims[k],
            cols: dims[last],
            out_row: so[k],
            in_col: si[last],
        })
    }

    /// Tiles over columns (x), rows (y) and the other dimensions (z), within the grid's limits.
    fn config(&self) -> LaunchConfig {
        let rest: u64 = self.rest.iter().map(|&d| d as u64).product();
        LaunchConfig {
            grid_dim: (
                (self.cols as u64).div_ceil(TILE).min(i32::MAX as u64) as u32,
                (self.rows as u64).div_ceil(TILE).min(65_535) as u32,
                rest.clamp(1, 65_535) as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The copy with elements widened to `width` bytes (16, 8 or 4; more than `size`) when the
/// innermost dimension is contiguous on both sides and every stride, the inner extent and both
/// addresses allow it; `None` otherwise.
pub(crate) fn widen(geometry: &Coalesced, size: usize, addrs: [u64; 2]) -> Option<(Coalesced, usize)> {
    let last = geometry.dims.len() - 1;
    if geometry.strides.iter().any(|s| s[last] != 1) {
        return None;
    }
    [16usize, 8, 4].into_iter().filter(|&w| w > size).find_map(|width| {
        let factor = width / size;
        let fits = geometry.dims[last].is_multiple_of(factor)
            && addrs.iter().all(|a| a.is_multiple_of(width as u64))
            && geometry
                .strides
                .iter()
                .all(|s| s[..last].iter().all(|st| st.is_multiple_of(factor)));
        fits.then(|| {
            let mut wide = geometry.clone();
            wide.dims[last] /= factor;
            for s in &mut wide.strides {
                for st in &mut s[..last] {
                    *st /= factor;
                }
            }
            (wide, width)
        })
    })
}

pub(super) fn copy(backend: &CudaBackend, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, pi) = (device_ptr(out), device_ptr(input));
    if po == pi && input.layout.strides() == out.layout.strides() {
        // A copy onto itself (the in-place case `Kernel::validate` allows): nothing to do.
        return Ok(());
    }
    let size = out.dtype.size_in_bytes();
    if input.layout.is_contiguous() && out.layout.is_contiguous() {
        backend.bind()?;
        backend
            .order
            .before_compute(&backend.compute, &[input.buffer, out.buffer])?;
        // SAFETY: both views are dense, covering `n * size` bytes inside their buffers
        // (`Kernel::validate`), live blocks (the contract of `launch`) that do not overlap unless
        // they are the same view; queued on the compute stream after earlier users.
        return unsafe { driver::dtod_async(po, pi, n * size, backend.compute.cu_stream()) }
            .map_err(driver::error(backend.device, "copy"));
    }
    let geometry = Coalesced::of("copy", &[&out.layout, &input.layout])?;
    if let Some(plan) = TransposePlan::of(&geometry) {
        let kernel = backend.modules.kernel(KernelName::new(
            SourceFile::Construct,
            ["transpose", width_name(size), "", ""],
        ))?;
        let rest = KernelShape::new(&plan.rest);
        let (ro, ri) = (KernelStrides::new(&plan.rest_out), KernelStrides::new(&plan.rest_in));
        let (rows, cols) = (plan.rows as u64, plan.cols as u64);
        let (out_row, in_col) = (plan.out_row as i64, plan.in_col as i64);
        return launch_kernel!(
            backend,
            kernel,
            plan.config(),
            [input.buffer, out.buffer],
            &po,
            &pi,
            &rest,
            &ro,
            &ri,
            &rows,
            &cols,
            &out_row,
            &in_col
        );
    }
    let (geometry, width) = widen(&geometry, size, [po, pi]).unwrap_or((geometry, size));
    let (shape, so, si) = (geometry.shape(), geometry.strides(0), geometry.strides(1));
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Construct,
        ["copy", width_name(width), "strided", ""],
    ))?;
    let cfg = grid(shape.numel, max_blocks(backend, &kernel));
    launch_kernel!(
        backend,
        kernel,
        cfg,
        [input.buffer, out.buffer],
        &po,
        &pi,
        &shape,
        &so,
        &si
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(dims: &[usize], out: &[usize], input: &[usize]) -> Coalesced {
        Coalesced::new(dims, &[out, input])
    }

    #[test]
    fn a_transposed_matrix_is_tiled() {
        // out [64, 48] dense from the transpose of a dense [48, 64].
        let plan = TransposePlan::of(&geometry(&[64, 48], &[48, 1], &[1, 64])).expect("a plan");
        assert_eq!((plan.rows, plan.cols, plan.out_row, plan.in_col), (64, 48, 48, 64));
        assert!(plan.rest.is_empty());
        assert_eq!(plan.config().grid_dim, (2, 2, 1));
    }

    #[test]
    fn a_batched_permute_keeps_the_batch_as_rest() {
        // [B, R, C] out dense, in the (0, 2, 1) permute of a dense [B, C, R].
        let plan = TransposePlan::of(&geometry(&[3, 40, 20], &[800, 20, 1], &[800, 1, 40])).expect("a plan");
        assert_eq!(
            (plan.rest, plan.rest_out, plan.rest_in),
            (vec![3], vec![800], vec![800])
        );
        assert_eq!((plan.rows, plan.cols), (40, 20));
        // The unit stride of the input on the outer dimension: (2, 1, 0) permute.
        let plan = TransposePlan::of(&geometry(&[20, 30, 40], &[1200, 40, 1], &[1, 20, 600])).expect("a plan");
        assert_eq!((plan.rows, plan.cols, plan.rest), (20, 40, vec![30]));
        assert_eq!((plan.out_row, plan.in_col, plan.rest_in), (1200, 600, vec![20]));
    }

    #[test]
    fn contiguous_inner_dimensions_and_thin_tiles_are_not_transposed() {
        assert!(TransposePlan::of(&geometry(&[8, 64], &[64, 1], &[128, 1])).is_none());
        assert!(TransposePlan::of(&geometry(&[4, 64], &[64, 1], &[1, 4])).is_none());
        assert!(TransposePlan::of(&geometry(&[64], &[1], &[3])).is_none());
    }

    #[test]
    fn gathers_widen_when_every_stride_allows() {
        // (0, 2, 1, 3) permute of f32 with an inner extent of 64: 16-byte vectors.
        let g = geometry(&[2, 8, 4, 64], &[2048, 256, 64, 1], &[2048, 64, 512, 1]);
        let (wide, width) = widen(&g, 4, [0, 4096]).expect("widened");
        assert_eq!(width, 16);
        assert_eq!(wide.dims, vec![2, 8, 4, 16]);
        assert_eq!(wide.strides, vec![vec![512, 64, 16, 1], vec![512, 16, 128, 1]]);
        // An inner extent of 2 f32: 8-byte vectors.
        let g = geometry(&[5, 2], &[2, 1], &[4, 1]);
        assert_eq!(widen(&g, 4, [0, 0]).map(|(_, w)| w), Some(8));
        // Misaligned addresses, odd extents and a strided inner dimension stay as they are.
        let g = geometry(&[2, 8, 4, 64], &[2048, 256, 64, 1], &[2048, 64, 512, 1]);
        assert_eq!(widen(&g, 4, [0, 4]), None);
        assert_eq!(widen(&geometry(&[5, 3], &[3, 1], &[4, 1]), 4, [0, 0]), None);
        assert_eq!(widen(&geometry(&[5, 4], &[4, 1], &[8, 2]), 4, [0, 0]), None);
        // Elements already 16 bytes wide... none are; 8-byte elements widen to 16.
        assert_eq!(
            widen(&geometry(&[3, 2], &[2, 1], &[4, 1]), 8, [0, 0]).map(|(_, w)| w),
            Some(16)
        );
    }
}
