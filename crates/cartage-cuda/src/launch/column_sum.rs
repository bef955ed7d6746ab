//! A sum or mean over the leading dimension of a dense row-major matrix (`column_sum_<dtype>` of
//! reduce.cu): a bias gradient sums a `[tokens, features]` gradient over its tokens. The general
//! reduction gives such a sum one thread per output, each reading 4 bytes per row; this kernel
//! gives each thread 16 bytes of neighbouring outputs (a warp reads 512 contiguous bytes of a
//! row) and keeps several rows' loads in flight, and splits the rows over enough blocks to fill
//! the GPU, adding the slices' f32 partial sums in a second launch.

use cartage_core::{DType, ReduceOp, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::Coalesced;
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// `COL_X`, `COL_Y` of reduce.cu: threads per block along the outputs and along the rows.
const COL_X: u32 = 32;
const COL_Y: u32 = 8;

/// Fewest rows per slice: below this the partial sums cost more than the split gains.
const MIN_ROWS_PER_SPLIT: u64 = 64;

/// `struct ColumnGeom` of reduce.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ColumnGeom {
    reduced: u64,
    outputs: u64,
    rows_per_split: u64,
    split: u64,
    mean: i32,
    finish: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernel declares.
unsafe impl DeviceRepr for ColumnGeom {}

/// The matrix a reduction reads when it is a column sum: `(reduced rows, outputs)`, or `None`.
///
/// `rows` and `cols` are the reduction's kept and reduced dimensions coalesced (with the input's
/// and output's strides, and the input's): a column sum keeps one dimension of stride 1 in both
/// and reduces one dimension whose stride is the kept dimension's size, in a float dtype of 2 or
/// 4 bytes whose 16-byte packs tile the outputs from a 16-byte aligned start.
fn matrix(op: ReduceOp, input: &TensorArg, rows: &Coalesced, cols: &Coalesced) -> Option<(u64, u64)> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) || !matches!(input.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let (outputs, reduced) = match (&rows.dims[..], &cols.dims[..]) {
        ([outputs], [reduced]) => (*outputs, *reduced),
        _ => return None,
    };
    let lanes = 16 / input.dtype.size_in_bytes();
    let side_by_side = rows.strides[0] == [1] && rows.strides[1] == [1];
    let dense = cols.strides[0] == [outputs];
    let worth = reduced as u64 >= MIN_ROWS_PER_SPLIT && outputs >= lanes;
    let packed = outputs.is_multiple_of(lanes) && device_ptr(input).is_multiple_of(16);
    (side_by_side && dense && worth && packed).then_some((reduced as u64, outputs as u64))
}

/// Queue the column sum (or mean) of `input` into `out` when the reduction is one
/// ([`matrix`]); false leaves it to the general kernel.
pub(super) fn column_sum(
    backend: &CudaBackend,
    op: ReduceOp,
    input: &TensorArg,
    rows: &Coalesced,
    cols: &Coalesced,
    out: &TensorArg,
) -> Result<bool> {
    let Some((reduced, outputs)) = matrix(op, input, rows, cols) else {
        return Ok(false);
    };
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Reduce,
        ["column_sum", input.dtype.name(), "", ""],
    ))?;
    let lanes = (16 / input.dtype.size_in_bytes()) as u64;
    let col_blocks = outputs.div_ceil(COL_X as u64 * lanes);
    // About two resident waves of blocks, each slice at least MIN_ROWS_PER_SPLIT rows.
    let target = 2 * max_blocks(backend, &kernel) as u64;
    let wanted = target
        .div_ceil(col_blocks)
        .clamp(1, (reduced / MIN_ROWS_PER_SPLIT).max(1))
        .min(u16::MAX as u64);
    let rows_per_split = reduced.div_ceil(wanted);
    let split = reduced.div_ceil(rows_per_split);
    let mut geom = ColumnGeom {
        reduced,
        outputs,
        rows_per_split,
        split,
        mean: i32::from(op == ReduceOp::Mean),
        finish: 0,
    };
    let block_dim = (COL_X, COL_Y, 1);
    let cfg = |slices: u64| LaunchConfig {
        grid_dim: (col_blocks as u32, slices as u32, 1),
        block_dim,
        shared_mem_bytes: 0,
    };
    let (pi, po) = (device_ptr(input), device_ptr(out));
    if split == 1 {
        let pp = 0u64;
        launch_kernel!(
            backend,
            kernel,
            cfg(1),
            [input.buffer, out.buffer],
            &pi,
            &po,
            &pp,
            &geom
        )?;
        return Ok(true);
    }
    let partials = backend.allocator.alloc((split * outputs) as usize * 4)?;
    let slice = partials.slice();
    let pp = slice.addr();
    let queued = (|| {
        launch_kernel!(backend, kernel, cfg(split), [input.buffer, slice], &pi, &po, &pp, &geom)?;
        geom.finish = 1;
        launch_kernel!(backend, kernel, cfg(1), [slice, out.buffer], &pi, &po, &pp, &geom)
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(partials);
    queued.map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::ColumnGeom;
    use crate::modules::{KernelName, SourceFile};

    /// Every dtype's kernel is built into the committed PTX and takes the host's arguments.
    #[test]
    fn kernels_take_the_argument_struct() {
        for dtype in ["f32", "f16", "bf16"] {
            let name = KernelName::new(SourceFile::Reduce, ["column_sum", dtype, "", ""]);
            let params = super::super::ptx_param_bytes(name.file, &name.symbol());
            assert_eq!(
                params,
                [8, 8, 8, std::mem::size_of::<ColumnGeom>()],
                "{}",
                name.symbol()
            );
        }
    }
}
