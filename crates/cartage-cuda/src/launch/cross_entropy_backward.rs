//! The logits gradient of cross-entropy ([`cartage_core::Kernel::CrossEntropyBackward`]): a warp
//! per row up to 1024 classes, else a block (as the forward, [`super::rows::cross_entropy`]), with
//! 16-byte vectors where the logits (and the output) are dense. Targets are checked with the
//! forward's protocol: each row's target is loaded once, one outside `[0, C)` that is not
//! `ignore_index` is recorded in a fault block read back after the launch, and the launch fails
//! with [`Error::IndexOutOfRange`] naming dim 1 and C.

use cartage_core::{DType, Error, Result, TensorArg};
use cudarc::driver::DeviceRepr;

use super::index::with_fault;
use super::rows::{Plan, plan_config};
use super::{aligned16, device_ptr, lanes, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// `struct CeGradGeom` of backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CeGradGeom {
    rows: u64,
    cols: u64,
    row_stride: i64,
    col_stride: i64,
    out_row: i64,
    out_col: i64,
    target_stride: i64,
    grad_stride: i64,
    ignore_index: i64,
    spread: f64,
    keep: f64,
    group: i32,
    dense: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for CeGradGeom {}

/// True when `arg` ([N, C]) has unit column stride and every row starts 16-byte aligned.
fn dense_rows(arg: &TensorArg) -> bool {
    let strides = arg.layout.strides();
    strides[1] == 1 && strides[0].is_multiple_of(lanes(arg.dtype) as usize) && aligned16(&[arg])
}

/// `cross_entropy_backward_<dtype>_<index dtype>`.
fn kernel_name(dtype: DType, index: DType) -> KernelName {
    KernelName::new(
        SourceFile::Backward,
        ["cross_entropy_backward", dtype.name(), index.name(), ""],
    )
}

/// The logits gradient of per-row cross-entropy: `g[n]·(softmax(logits[n]) − (1 − s)·onehot −
/// s/C)`, zero rows where the target is `ignore_index`.
pub(super) fn cross_entropy_backward(
    backend: &CudaBackend,
    logits: &TensorArg,
    target: &TensorArg,
    grad: &TensorArg,
    ignore_index: i64,
    label_smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let (rows, cols) = (logits.layout.shape()[0], logits.layout.shape()[1]);
    if rows == 0 {
        return Ok(());
    }
    let group: u32 = if cols <= 1024 {
        32
    } else if cols <= 16384 {
        256
    } else {
        1024
    };
    let (strides, out_strides) = (logits.layout.strides(), out.layout.strides());
    let geom = CeGradGeom {
        rows: rows as u64,
        cols: cols as u64,
        row_stride: strides[0] as i64,
        col_stride: strides[1] as i64,
        out_row: out_strides[0] as i64,
        out_col: out_strides[1] as i64,
        target_stride: target.layout.strides()[0] as i64,
        grad_stride: grad.layout.strides()[0] as i64,
        ignore_index,
        spread: label_smoothing / cols.max(1) as f64,
        keep: 1.0 - label_smoothing,
        group: group as i32,
        dense: dense_rows(logits) as i32 | (dense_rows(out) as i32) << 1,
    };
    let kernel = backend.modules.kernel(kernel_name(logits.dtype, target.dtype))?;
    let cfg = plan_config(
        backend,
        rows as u64,
        Plan {
            group,
            block: group.max(256),
            vectors: 1,
        },
    );
    let (pl, pt, pg, po) = (
        device_ptr(logits),
        device_ptr(target),
        device_ptr(grad),
        device_ptr(out),
    );
    let fault = with_fault(backend, |pf| {
        launch_kernel!(
            backend,
            kernel,
            cfg,
            [logits.buffer, target.buffer, grad.buffer, out.buffer],
            &pl,
            &pt,
            &pg,
            &po,
            &pf,
            &geom
        )
    })?;
    match fault {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op: "cross_entropy_backward",
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
    fn every_dtype_pair_is_built() {
        let entries = crate::precompiled::entry_names(SourceFile::Backward);
        for dtype in super::super::backward::DTYPES {
            for index in [DType::I32, DType::I64] {
                let symbol = kernel_name(dtype, index).symbol();
                assert!(entries.contains(&symbol.as_str()), "{symbol} is not built");
            }
        }
    }

    #[test]
    fn ce_grad_geom_matches_the_c_layout() {
        // 2 × u64, 7 × i64, 2 × f64, 2 × i32.
        let geom = std::mem::size_of::<CeGradGeom>();
        assert_eq!(geom, 16 + 56 + 16 + 8);
        // (logits, target, grad, out, fault, geom), as the launch pushes them.
        let name = kernel_name(DType::BF16, DType::I32);
        assert_eq!(
            super::super::ptx_param_bytes(name.file, &name.symbol()),
            [8, 8, 8, 8, 8, geom]
        );
    }
}
