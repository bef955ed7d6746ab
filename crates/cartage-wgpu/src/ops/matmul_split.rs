//! Split-K products: a single product with few output tiles and a long K (a weight gradient,
//! `[384, 16384] × [16384, 384]`) would run a few dozen workgroups, each walking all of K, and
//! leave most of the device idle. It runs instead as a batched product over `chunks` slices of
//! K into f32 partial sums (f64 for f64), which a column-wise sum then adds into the output in
//! its own dtype, rounding once.
//!
//! The slices are strided views of the operands (no copy): slice `s` of the left operand starts
//! `s · K/chunks` columns in, of the right operand as many rows down.

use cartage_core::{Backend, DType, Layout, ReduceOp, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::ops::matmul::{accumulate, enough_tiles};
use crate::ops::reduce;

/// The shortest slice of K worth a workgroup of its own.
const MIN_CHUNK_K: usize = 256;

/// Output tiles assumed per workgroup when counting how busy a product keeps the device.
const TILE: usize = 64;

/// The slices of K to split `lhs × rhs` into, or `None` to run it whole: only single products
/// (batch 1) whose output has fewer tiles than keep the adapter busy, and only into a number of
/// slices that divides K, each at least [`MIN_CHUNK_K`] long.
pub(crate) fn chunks(backend: &WgpuBackend, lhs: &TensorArg, rhs: &TensorArg) -> Option<usize> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    if batch != 1 || m == 0 || n == 0 || k < 2 * MIN_CHUNK_K {
        return None;
    }
    let enough = enough_tiles(backend);
    let tiles = m.div_ceil(TILE) * n.div_ceil(TILE);
    if tiles >= enough {
        return None;
    }
    let wanted = (2 * enough).div_ceil(tiles).min(k / MIN_CHUNK_K);
    (2..=wanted).rev().find(|s| k.is_multiple_of(*s))
}

/// `out = lhs × rhs` (batch 1) as `chunks` partial products over slices of K, summed.
pub(crate) fn matmul(
    backend: &WgpuBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    chunks: usize,
) -> Result<()> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (m, k, n) = (l[1], l[2], r[2]);
    let slice = k / chunks;
    let (ls, rs) = (lhs.layout.strides(), rhs.layout.strides());
    let lhs_slices = TensorArg {
        buffer: lhs.buffer,
        layout: Layout::from_parts(&[chunks, m, slice], &[slice * ls[2], ls[1], ls[2]], lhs.layout.offset())?,
        dtype: lhs.dtype,
    };
    let rhs_slices = TensorArg {
        buffer: rhs.buffer,
        layout: Layout::from_parts(&[chunks, slice, n], &[slice * rs[1], rs[1], rs[2]], rhs.layout.offset())?,
        dtype: rhs.dtype,
    };
    let acc = if lhs.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let scratch = backend.scratch(chunks * m * n * acc.size_in_bytes())?;
    let partials = TensorArg {
        buffer: scratch.slice(),
        layout: Layout::contiguous(&[chunks, m, n])?,
        dtype: acc,
    };
    let result = accumulate(backend, &lhs_slices, &rhs_slices, &partials)
        .and_then(|()| reduce::reduce(backend, ReduceOp::Sum, &partials, &[0], out));
    backend.free(scratch);
    result
}
