//! Malformed model kernels (`Scan`, `Sort`, `Scatter`, `Norm`, `CrossEntropy`) give the typed
//! error `Kernel::validate` assigns to each structural rule — wrong index dtypes, mismatched
//! shapes, dims out of range, outputs that alias an input or broadcast, norm parameters of the
//! wrong length, an RMS norm with a bias, label smoothing outside `[0, 1]` — both from
//! `validate` itself and from the backend's launch (when it runs the op for that dtype; a
//! backend that does not may refuse with `Unsupported`), and never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::kernel::{Kernel, NormKind, ScanOp, ScatterMode, TensorArg};
use crate::layout::Layout;

use super::DeviceBuffer;
use super::harness::Harness;

/// Require `kernel` to fail validation with `kind`, and the backend's launch (or the
/// synchronize after it) with `kind` too (`Unsupported` allowed where the backend does not list
/// the op), without panicking.
fn expect_kind(h: &Harness, what: &str, kernel: Kernel, kind: ErrorKind) {
    h.count_check();
    match kernel.validate() {
        Err(e) if e.kind() == kind => {}
        Err(e) => h.fail(format!(
            "{what}: validate() gave {} ({e}), expected {}",
            e.kind_name(),
            kind.name()
        )),
        Ok(()) => h.fail(format!("{what}: validate() accepted it, expected {}", kind.name())),
    }
    let supported = h.supports(kernel.op(), kernel.dtype());
    let backend = h.backend();
    let outcome = catch_unwind(AssertUnwindSafe(|| h.run(&kernel).and_then(|()| backend.synchronize())));
    match outcome {
        Ok(Err(e)) if e.kind() == kind => {}
        Ok(Err(e)) if !supported && e.kind() == ErrorKind::Unsupported => {}
        Ok(Err(e)) => h.fail(format!(
            "{what}: launch gave {} ({e}), expected {}",
            e.kind_name(),
            kind.name()
        )),
        Ok(Ok(())) => h.fail(format!("{what}: the malformed kernel was accepted")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            h.fail(format!(
                "{what}: launch panicked instead of returning an error: {message}"
            ));
        }
    }
}

/// The first float dtype the backend runs `op` for, or f32 (then the launch may be refused
/// with `Unsupported`).
fn float_for(h: &Harness, op: crate::kernel::Op) -> DType {
    [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(op, d))
        .unwrap_or(DType::F32)
}

fn buf(h: &Harness, dtype: DType, len: usize) -> DeviceBuffer {
    h.upload(dtype, &vec![0.0; len])
}

fn layout(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("small")
}

/// `[n]` elements of `buf` starting at element `at`.
fn at(buf: &DeviceBuffer, shape: &[usize], offset: usize) -> TensorArg {
    let strides = crate::layout::contiguous_strides(shape);
    buf.arg(&Layout::from_parts(shape, &strides, offset).expect("small"))
}

/// Every malformed model kernel below must give its typed error.
pub fn malformed_model_kernels(h: &Harness) {
    scan(h);
    sort(h);
    scatter(h);
    norm(h);
    cross_entropy(h);
}

fn scan(h: &Harness) {
    use ErrorKind::*;
    let f = float_for(h, crate::kernel::Op::Scan(ScanOp::Sum));
    let (a, out, other) = (
        buf(h, f, 24),
        buf(h, f, 24),
        buf(h, if f == DType::F64 { DType::F32 } else { DType::F64 }, 12),
    );
    let scan = |input: TensorArg, dim, out: TensorArg| Kernel::Scan {
        op: ScanOp::Sum,
        input,
        dim,
        out,
    };
    let cases = [
        (
            "cumsum along dim 2 of a rank-2 input",
            scan(a.contiguous(&[3, 4]), 2, out.contiguous(&[3, 4])),
            DimOutOfRange,
        ),
        (
            "cumsum into a [4, 3] output",
            scan(a.contiguous(&[3, 4]), 1, out.contiguous(&[4, 3])),
            ShapeMismatch,
        ),
        (
            "cumsum into another dtype",
            scan(a.contiguous(&[3, 4]), 1, other.contiguous(&[3, 4])),
            InvalidArgument,
        ),
        (
            "cumsum in place",
            scan(a.contiguous(&[3, 4]), 1, a.contiguous(&[3, 4])),
            InvalidArgument,
        ),
        (
            "cumsum into an output overlapping the input",
            scan(a.contiguous(&[3, 4]), 1, at(&a, &[3, 4], 5)),
            InvalidArgument,
        ),
        (
            "cumsum into a broadcast output",
            scan(
                a.contiguous(&[3, 4]),
                1,
                out.arg(&layout(&[1, 4]).broadcast_to(&[3, 4]).expect("broadcastable")),
            ),
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        expect_kind(h, what, kernel, kind);
    }
}

fn sort(h: &Harness) {
    use ErrorKind::*;
    let f = float_for(h, crate::kernel::Op::Sort);
    let (a, values) = (buf(h, f, 24), buf(h, f, 24));
    let (i64s, i32s, floats) = (buf(h, DType::I64, 24), buf(h, DType::I32, 24), buf(h, DType::F32, 24));
    let sort = |dim, values: TensorArg, indices: TensorArg| Kernel::Sort {
        input: a.contiguous(&[3, 4]),
        dim,
        descending: false,
        values,
        indices,
    };
    let cases = [
        (
            "sort with i32 indices",
            sort(1, values.contiguous(&[3, 4]), i32s.contiguous(&[3, 4])),
            WrongDType,
        ),
        (
            "sort with f32 indices",
            sort(1, values.contiguous(&[3, 4]), floats.contiguous(&[3, 4])),
            WrongDType,
        ),
        (
            "sort into [4, 3] values",
            sort(1, values.contiguous(&[4, 3]), i64s.contiguous(&[3, 4])),
            ShapeMismatch,
        ),
        (
            "sort into [3, 5] indices",
            sort(1, values.contiguous(&[3, 4]), i64s.contiguous(&[3, 5])),
            ShapeMismatch,
        ),
        (
            "sort along dim 2 of a rank-2 input",
            sort(2, values.contiguous(&[3, 4]), i64s.contiguous(&[3, 4])),
            DimOutOfRange,
        ),
        (
            "sort with values over the input",
            sort(1, at(&a, &[3, 4], 2), i64s.contiguous(&[3, 4])),
            InvalidArgument,
        ),
        (
            "sort into broadcast indices",
            sort(
                1,
                values.contiguous(&[3, 4]),
                i64s.arg(&layout(&[1, 4]).broadcast_to(&[3, 4]).expect("broadcastable")),
            ),
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        expect_kind(h, what, kernel, kind);
    }
}

fn scatter(h: &Harness) {
    use ErrorKind::*;
    let f = float_for(h, crate::kernel::Op::Scatter(ScatterMode::Add));
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let (src, out, wrong) = (buf(h, f, 24), buf(h, f, 24), buf(h, other, 24));
    let (idx, floats, bytes) = (buf(h, DType::I64, 24), buf(h, DType::F32, 24), buf(h, DType::U8, 24));
    let scatter = |src: TensorArg, index: TensorArg, dim, out: TensorArg| Kernel::Scatter {
        mode: ScatterMode::Add,
        src,
        index,
        dim,
        out,
    };
    let s = |shape: &[usize]| src.contiguous(shape);
    let i = |shape: &[usize]| idx.contiguous(shape);
    let o = |shape: &[usize]| out.contiguous(shape);
    let cases = [
        (
            "scatter_add with f32 indices",
            scatter(s(&[2, 3]), floats.contiguous(&[2, 3]), 0, o(&[4, 3])),
            WrongDType,
        ),
        (
            "scatter_add with u8 indices",
            scatter(s(&[2, 3]), bytes.contiguous(&[2, 3]), 0, o(&[4, 3])),
            WrongDType,
        ),
        (
            "scatter_add with a rank-1 index",
            scatter(s(&[2, 3]), i(&[6]), 0, o(&[4, 3])),
            ShapeMismatch,
        ),
        (
            "scatter_add with an index larger than the source",
            scatter(s(&[2, 3]), i(&[3, 3]), 0, o(&[4, 3])),
            ShapeMismatch,
        ),
        (
            "scatter_add with an index wider than the destination off dim",
            scatter(s(&[2, 5]), i(&[2, 5]), 0, o(&[4, 3])),
            ShapeMismatch,
        ),
        (
            "scatter_add along dim 2 of rank 2",
            scatter(s(&[2, 3]), i(&[2, 3]), 2, o(&[4, 3])),
            DimOutOfRange,
        ),
        (
            "scatter_add of another dtype",
            scatter(wrong.contiguous(&[2, 3]), i(&[2, 3]), 0, o(&[4, 3])),
            InvalidArgument,
        ),
        (
            "scatter_add into its own source",
            scatter(s(&[2, 3]), i(&[2, 3]), 0, at(&src, &[4, 3], 1)),
            InvalidArgument,
        ),
        (
            "scatter_add into a broadcast destination",
            scatter(
                s(&[2, 3]),
                i(&[2, 3]),
                0,
                out.arg(&layout(&[1, 3]).broadcast_to(&[4, 3]).expect("broadcastable")),
            ),
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        expect_kind(h, what, kernel, kind);
    }
}

fn norm(h: &Harness) {
    use ErrorKind::*;
    let f = float_for(h, crate::kernel::Op::Norm(NormKind::Layer));
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let (a, out, w, wrong) = (buf(h, f, 24), buf(h, f, 24), buf(h, f, 24), buf(h, other, 24));
    let norm = |kind, input: TensorArg, weight: Option<TensorArg>, bias: Option<TensorArg>, eps, out: TensorArg| {
        Kernel::Norm {
            kind,
            input,
            weight,
            bias,
            eps,
            out,
        }
    };
    let x = || a.contiguous(&[3, 4]);
    let y = || out.contiguous(&[3, 4]);
    let (layer, rms) = (NormKind::Layer, NormKind::Rms);
    let cases = [
        (
            "layer_norm with a weight of 3 for rows of 4",
            norm(layer, x(), Some(w.contiguous(&[3])), None, 1e-5, y()),
            ShapeMismatch,
        ),
        (
            "layer_norm with a [1, 4] weight",
            norm(layer, x(), Some(w.contiguous(&[1, 4])), None, 1e-5, y()),
            ShapeMismatch,
        ),
        (
            "layer_norm with a bias of 5",
            norm(layer, x(), None, Some(w.contiguous(&[5])), 1e-5, y()),
            ShapeMismatch,
        ),
        (
            "rms_norm with a bias",
            norm(rms, x(), Some(w.contiguous(&[4])), Some(w.contiguous(&[4])), 1e-5, y()),
            InvalidArgument,
        ),
        (
            "rms_norm with a weight of another dtype",
            norm(rms, x(), Some(wrong.contiguous(&[4])), None, 1e-5, y()),
            InvalidArgument,
        ),
        (
            "layer_norm with eps -1",
            norm(layer, x(), None, None, -1.0, y()),
            InvalidArgument,
        ),
        (
            "layer_norm with eps NaN",
            norm(layer, x(), None, None, f64::NAN, y()),
            InvalidArgument,
        ),
        (
            "layer_norm of a rank-0 input",
            norm(layer, a.contiguous(&[]), None, None, 1e-5, out.contiguous(&[])),
            InvalidArgument,
        ),
        (
            "layer_norm into a [4, 3] output",
            norm(layer, x(), None, None, 1e-5, out.contiguous(&[4, 3])),
            ShapeMismatch,
        ),
        (
            "rms_norm in place",
            norm(rms, x(), None, None, 1e-5, x()),
            InvalidArgument,
        ),
        (
            "layer_norm into its weight",
            norm(layer, x(), Some(at(&out, &[4], 0)), None, 1e-5, y()),
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        expect_kind(h, what, kernel, kind);
    }
}

fn cross_entropy(h: &Harness) {
    use ErrorKind::*;
    let f = float_for(h, crate::kernel::Op::CrossEntropy);
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let (logits, out, wrong) = (buf(h, f, 24), buf(h, f, 24), buf(h, other, 24));
    let (target, floats) = (buf(h, DType::I64, 24), buf(h, DType::F32, 24));
    let ce = |logits: TensorArg, target: TensorArg, smoothing, out: TensorArg| Kernel::CrossEntropy {
        logits,
        target,
        ignore_index: -100,
        label_smoothing: smoothing,
        out,
    };
    let l = || logits.contiguous(&[3, 4]);
    let t = || target.contiguous(&[3]);
    let o = || out.contiguous(&[3]);
    let cases = [
        (
            "cross_entropy with f32 targets",
            ce(l(), floats.contiguous(&[3]), 0.0, o()),
            WrongDType,
        ),
        (
            "cross_entropy of rank-3 logits",
            ce(logits.contiguous(&[3, 4, 1]), t(), 0.0, o()),
            ShapeMismatch,
        ),
        (
            "cross_entropy with 4 targets for 3 rows",
            ce(l(), target.contiguous(&[4]), 0.0, o()),
            ShapeMismatch,
        ),
        (
            "cross_entropy into a [3, 1] loss",
            ce(l(), t(), 0.0, out.contiguous(&[3, 1])),
            ShapeMismatch,
        ),
        (
            "cross_entropy with label smoothing -0.1",
            ce(l(), t(), -0.1, o()),
            InvalidArgument,
        ),
        (
            "cross_entropy with label smoothing 1.5",
            ce(l(), t(), 1.5, o()),
            InvalidArgument,
        ),
        (
            "cross_entropy with label smoothing NaN",
            ce(l(), t(), f64::NAN, o()),
            InvalidArgument,
        ),
        (
            "cross_entropy into another dtype",
            ce(l(), t(), 0.0, wrong.contiguous(&[3])),
            InvalidArgument,
        ),
        (
            "cross_entropy into its logits",
            ce(l(), t(), 0.0, at(&logits, &[3], 2)),
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        expect_kind(h, what, kernel, kind);
    }
}
