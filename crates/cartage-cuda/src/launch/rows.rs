//! Row-wise kernels: softmax's fast path, layer/RMS norm and cross-entropy.
//!
//! A row that is dense, 16-byte aligned and at most 512 threads × 4 vectors long is held in
//! registers: 2–32 lanes of a warp per short row (several rows per block), else a block of
//! 64–512 threads per row, each thread holding V ∈ {1, 2, 4} vectors ([`plan`]). Longer dense
//! softmax rows are streamed twice (the second read from L2); other rows take the strided
//! kernels, which read the row from memory once per pass.

use cartage_core::{DType, Error, NormKind, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{Coalesced, KernelShape, KernelStrides};
use super::index::with_fault;
use super::{aligned16, device_ptr, lanes, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// `struct RowGeom` of rows_common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RowGeom {
    pub rows: u64,
    pub cols: u64,
    pub rows_shape: KernelShape,
    pub rows_in: KernelStrides,
    pub rows_out: KernelStrides,
    pub in_stride: i64,
    pub out_stride: i64,
    pub w_stride: i64,
    pub b_stride: i64,
    pub eps: f64,
    pub group: i32,
    pub flag: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for RowGeom {}

/// `struct CeGeom` of norm.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CeGeom {
    rows: u64,
    cols: u64,
    row_stride: i64,
    col_stride: i64,
    target_stride: i64,
    out_stride: i64,
    ignore_index: i64,
    smoothing: f64,
    group: i32,
    dense: i32,
}

// SAFETY: as above.
unsafe impl DeviceRepr for CeGeom {}

/// Threads per row of the streaming softmax for rows too long to hold in registers; its grid
/// is two blocks per multiprocessor, so that the rows in flight stay in L2 for the second pass.
pub(super) const LONG_BLOCK: u32 = 512;

/// How a register-held row is laid out: threads per row, threads per block, vectors per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    pub group: u32,
    pub block: u32,
    pub vectors: u32,
}

/// The register layout of a dense row of `cols` elements of `dtype`, or `None` when the row is
/// not a whole number of 16-byte vectors or too long to hold.
///
/// Each thread keeps 4 vectors (64 bytes) in flight and holds at most 128 bytes of compute values
/// (32 f32, 16 f64) so that the row stays in registers: groups of 2–32 lanes share a warp for
/// short rows (several rows per 256-thread block), longer rows take a block of 64–512 threads
/// (rows of up to 8192 f32 or 16384 bf16).
pub(super) fn plan(cols: usize, dtype: DType) -> Option<Plan> {
    let n = lanes(dtype) as usize;
    if cols == 0 || !cols.is_multiple_of(n) {
        return None;
    }
    let nv = cols / n;
    let compute_bytes = if dtype == DType::F64 { 8 } else { 4 };
    let most = (128 / (n * compute_bytes)).min(8);
    let group = nv.div_ceil(4).next_power_of_two().clamp(2, 512);
    let vectors = nv.div_ceil(group).next_power_of_two();
    // A group of a warp or less shares a 256-thread block; a larger group is the block, within
    // the kernel's launch bound for its V (which leaves the registers V vectors need).
    let block = if group <= 32 { 256 } else { group };
    let bound = match vectors {
        1 | 2 => 1024,
        4 => 512,
        _ => 256,
    };
    (vectors <= most && block <= bound).then_some(Plan {
        group: group as u32,
        block: block as u32,
        vectors: vectors as u32,
    })
}

/// Softmax's layout from the common one: f32 rows that take a 256-thread group with 4 vectors
/// each (rows of 2052–4096 f32) run on 512 threads with 2 vectors instead, twice the threads in
/// flight for the same bytes (rows of 4096 f32 on an H100: 111 µs against 119 µs for
/// [8192, 4096], log_softmax 112 against 116). The norms keep the common layout.
fn softmax_plan(p: Plan, dtype: DType) -> Plan {
    if dtype == DType::F32 && p.group == 256 && p.vectors == 4 {
        Plan {
            group: 512,
            block: 512,
            vectors: 2,
        }
    } else {
        p
    }
}

/// The `v<V>` part of a fast kernel's name.
pub(super) fn vector_name(v: u32) -> &'static str {
    match v {
        1 => "v1",
        2 => "v2",
        4 => "v4",
        _ => "v8",
    }
}

/// One launch over `rows` rows with `plan`'s layout (grid-stride beyond a few waves).
pub(super) fn plan_config(backend: &CudaBackend, rows: u64, plan: Plan) -> LaunchConfig {
    let per_block = (plan.block / plan.group) as u64;
    let cap = backend.sm_count as u64 * (2048 / plan.block as u64).max(1) * 4;
    let blocks = rows.div_ceil(per_block).clamp(1, cap) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (plan.block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The rows (every dimension but `dim`) of `input` and `out`, coalesced.
pub(super) fn row_geometry(
    op: &'static str,
    input: &TensorArg,
    out: &TensorArg,
    dim: usize,
) -> Result<(Coalesced, u64)> {
    let kept: Vec<usize> = (0..input.layout.rank()).filter(|&d| d != dim).collect();
    let pick = |v: &[usize]| kept.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let rows_c = Coalesced::new(
        &pick(input.layout.shape()),
        &[&pick(input.layout.strides()), &pick(out.layout.strides())],
    );
    rows_c.check_rank(op)?;
    let rows = kept.iter().map(|&d| input.layout.shape()[d] as u64).product();
    Ok((rows_c, rows))
}

/// True when the rows along `dim` are dense and every row starts 16-byte aligned.
fn rows_dense(args: &[&TensorArg], dim: usize, rows_c: &Coalesced) -> bool {
    let n = lanes(args[0].dtype) as usize;
    args.iter().all(|a| a.layout.strides()[dim] == 1)
        && rows_c.strides.iter().flatten().all(|s| s.is_multiple_of(n))
        && aligned16(args)
}

/// Softmax over `dim` in registers when the rows allow it; `Ok(false)` sends the caller to the
/// strided kernel.
pub(super) fn softmax_fast(
    backend: &CudaBackend,
    input: &TensorArg,
    dim: usize,
    log: bool,
    out: &TensorArg,
) -> Result<bool> {
    let op = if log { "log_softmax" } else { "softmax" };
    let cols = input.layout.shape()[dim];
    if cols == 0 || !cols.is_multiple_of(lanes(input.dtype) as usize) {
        return Ok(false);
    }
    let (rows_c, rows) = row_geometry(op, input, out, dim)?;
    if !rows_dense(&[input, out], dim, &rows_c) {
        return Ok(false);
    }
    if rows == 0 {
        return Ok(true);
    }
    let (pi, po) = (device_ptr(input), device_ptr(out));
    let plan = match plan(cols, input.dtype).map(|p| softmax_plan(p, input.dtype)) {
        Some(plan) => plan,
        None => {
            // Too long to hold: stream it twice.
            let geom = RowGeom {
                rows,
                cols: cols as u64,
                rows_shape: rows_c.shape(),
                rows_in: rows_c.strides(0),
                rows_out: rows_c.strides(1),
                group: LONG_BLOCK as i32,
                flag: log as i32,
                ..Default::default()
            };
            let kernel = backend.modules.kernel(KernelName::new(
                SourceFile::Softmax,
                ["softmax_long", input.dtype.name(), "", ""],
            ))?;
            let cfg = LaunchConfig {
                grid_dim: (rows.clamp(1, backend.sm_count as u64 * 2) as u32, 1, 1),
                block_dim: (LONG_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &pi, &po, &geom)?;
            return Ok(true);
        }
    };
    let geom = RowGeom {
        rows,
        cols: cols as u64,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_out: rows_c.strides(1),
        group: plan.group as i32,
        flag: log as i32,
        ..Default::default()
    };
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Softmax,
        ["softmax_fast", input.dtype.name(), vector_name(plan.vectors), ""],
    ))?;
    let cfg = plan_config(backend, rows, plan);
    launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &pi, &po, &geom)?;
    Ok(true)
}

/// Layer norm or RMS norm over the last dimension.
pub(super) fn norm(
    backend: &CudaBackend,
    kind: NormKind,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    bias: Option<&TensorArg>,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    let op = kind.name();
    let dim = input.layout.rank() - 1;
    let cols = input.layout.shape()[dim];
    let (rows_c, rows) = row_geometry(op, input, out, dim)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let kind_name = match kind {
        NormKind::Layer => "layer",
        NormKind::Rms => "rms",
    };
    let mut args = vec![input, out];
    args.extend(weight);
    args.extend(bias);
    // The 1-D weight and bias have no rows: their stride along the row is what must be 1.
    let fast = plan(cols, input.dtype).filter(|_| {
        args.iter().all(|a| a.layout.strides().last() == Some(&1))
            && rows_c
                .strides
                .iter()
                .flatten()
                .all(|s| s.is_multiple_of(lanes(input.dtype) as usize))
            && aligned16(&args)
    });
    let stride = |a: Option<&TensorArg>| a.map_or(0, |a| a.layout.strides()[0] as i64);
    let mut geom = RowGeom {
        rows,
        cols: cols as u64,
        rows_shape: rows_c.shape(),
        rows_in: rows_c.strides(0),
        rows_out: rows_c.strides(1),
        in_stride: input.layout.strides()[dim] as i64,
        out_stride: out.layout.strides()[dim] as i64,
        w_stride: stride(weight),
        b_stride: stride(bias),
        eps,
        group: 0,
        flag: weight.is_some() as i32 | (bias.is_some() as i32) << 1,
    };
    let (pi, po) = (device_ptr(input), device_ptr(out));
    let (pw, pb) = (weight.map_or(0, device_ptr), bias.map_or(0, device_ptr));
    let mut slices = vec![input.buffer, out.buffer];
    slices.extend(weight.map(|w| w.buffer));
    slices.extend(bias.map(|b| b.buffer));
    let (kernel, cfg) = match fast {
        Some(plan) => {
            geom.group = plan.group as i32;
            let name = KernelName::new(
                SourceFile::Norm,
                ["norm", kind_name, input.dtype.name(), vector_name(plan.vectors)],
            );
            (backend.modules.kernel(name)?, plan_config(backend, rows, plan))
        }
        None => {
            let plan = Plan {
                group: 256,
                block: 256,
                vectors: 1,
            };
            geom.group = 256;
            let name = KernelName::new(SourceFile::Norm, ["norm", kind_name, input.dtype.name(), "strided"]);
            (backend.modules.kernel(name)?, plan_config(backend, rows, plan))
        }
    };
    launch_kernel!(backend, kernel, cfg, slices, &pi, &po, &pw, &pb, &geom)
}

/// Per-row cross-entropy of `logits` [N, C] against `target` [N].
pub(super) fn cross_entropy(
    backend: &CudaBackend,
    logits: &TensorArg,
    target: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let (rows, cols) = (logits.layout.shape()[0], logits.layout.shape()[1]);
    if rows == 0 {
        return Ok(());
    }
    let strides = logits.layout.strides();
    let n = lanes(logits.dtype) as usize;
    let dense = strides[1] == 1 && strides[0].is_multiple_of(n) && aligned16(&[logits]);
    let group: u32 = if cols <= 1024 {
        32
    } else if cols <= 16384 {
        256
    } else {
        1024
    };
    let block = group.max(256);
    let geom = CeGeom {
        rows: rows as u64,
        cols: cols as u64,
        row_stride: strides[0] as i64,
        col_stride: strides[1] as i64,
        target_stride: target.layout.strides()[0] as i64,
        out_stride: out.layout.strides()[0] as i64,
        ignore_index,
        smoothing: label_smoothing,
        group: group as i32,
        dense: dense as i32,
    };
    let kernel = backend.modules.kernel(KernelName::new(
        SourceFile::Norm,
        ["cross_entropy", logits.dtype.name(), target.dtype.name(), ""],
    ))?;
    let cfg = plan_config(
        backend,
        rows as u64,
        Plan {
            group,
            block,
            vectors: 1,
        },
    );
    let (pl, pt, po) = (device_ptr(logits), device_ptr(target), device_ptr(out));
    let fault = with_fault(backend, |pf| {
        launch_kernel!(
            backend,
            kernel,
            cfg,
            [logits.buffer, target.buffer, out.buffer],
            &pl,
            &pt,
            &po,
            &pf,
            &geom
        )
    })?;
    match fault {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op: "cross_entropy",
            index,
            dim: 1,
            size: cols,
            device: backend.device,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_hold_the_row() {
        let layout = |cols, dtype| plan(cols, dtype).map(|p| (p.group, p.block, p.vectors));
        // Rows of 4096: a block per row, 64 bytes per thread, in f32 and bf16.
        assert_eq!(layout(4096, DType::F32), Some((256, 256, 4)));
        assert_eq!(layout(4096, DType::BF16), Some((128, 128, 4)));
        assert_eq!(layout(1024, DType::F32), Some((64, 64, 4)));
        assert_eq!(layout(32768, DType::BF16), None);
        // Short rows: a few lanes each, several rows per block.
        assert_eq!(layout(64, DType::F32), Some((4, 256, 4)));
        assert_eq!(layout(64, DType::BF16), Some((2, 256, 4)));
        // Long rows: up to 512 threads of 4 vectors; longer ones are not held.
        assert_eq!(layout(8192, DType::F32), Some((512, 512, 4)));
        assert_eq!(layout(16384, DType::BF16), Some((512, 512, 4)));
        assert_eq!(layout(16384, DType::F32), None);
        // Every length from 64 to 8192 (powers of two) fits, and each plan covers its row.
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for shift in 6..=13 {
                let cols = 1usize << shift;
                let p = plan(cols, dtype).unwrap_or_else(|| panic!("{cols} {dtype}"));
                let held = p.group as usize * p.vectors as usize * lanes(dtype) as usize;
                let shape_ok = if p.group <= 32 {
                    p.block == 256
                } else {
                    p.block == p.group
                };
                assert!(held >= cols && p.vectors <= 4 && shape_ok, "{cols} {dtype}: {p:?}");
            }
        }
        // Not a whole number of vectors, or too long: the strided kernels.
        assert_eq!(plan(4097, DType::F32), None);
        assert_eq!(plan(1 << 16, DType::F32), None);
        assert_eq!(plan(1 << 16, DType::F64), None);
    }

    #[test]
    fn softmax_takes_more_threads_for_rows_of_4096_f32() {
        let p = plan(4096, DType::F32).expect("a register plan");
        assert_eq!(
            softmax_plan(p, DType::F32),
            Plan {
                group: 512,
                block: 512,
                vectors: 2
            }
        );
        // Still the whole row: 512 threads × 2 vectors × 4 lanes.
        assert_eq!(512 * 2 * lanes(DType::F32) as usize, 4096);
        assert_eq!(softmax_plan(p, DType::BF16), p);
        let short = plan(1024, DType::F32).expect("a register plan");
        assert_eq!(softmax_plan(short, DType::F32), short);
    }

    #[test]
    fn row_geom_matches_the_c_layout() {
        // 2 × u64, Shape (80), 2 × Strides (64), 4 × i64, f64, 2 × i32.
        assert_eq!(std::mem::size_of::<RowGeom>(), 16 + 80 + 128 + 32 + 8 + 8);
        assert_eq!(std::mem::size_of::<CeGeom>(), 8 * 8 + 8);
    }
}
