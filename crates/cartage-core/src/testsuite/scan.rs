//! `Scan` (cumsum, cumprod): every dtype the backend lists, along the first, a middle and the
//! last dim, from contiguous, transposed, permuted, narrowed, offset and broadcast inputs into
//! strided output views; integers wrap; large scans (2^20 + 1 elements, and columns of a
//! 1024 × 1025 matrix) over integer-valued inputs, whose prefixes are exact in any order, so a
//! parallel scan that drops or repeats one element shows.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op, ScanOp};

use super::harness::Harness;
use super::reference_model;
use super::views::{LARGE, View, ViewKind, view};
use super::{Operand, Spec};

/// Values whose products stay finite and nonzero: floats of magnitude in [0.9, 1.1) with a
/// random sign, integers ±1..=3 (1..=3 for u8), so long integer products wrap.
pub fn product_values(h: &Harness, dtype: DType, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let sign = if dtype != DType::U8 && h.below(2) == 1 {
                -1.0
            } else {
                1.0
            };
            if dtype.is_float() {
                dtype.round_trip(sign * h.uniform(0.9, 1.1))
            } else if dtype == DType::Bool {
                1.0
            } else {
                sign * h.int(1, 3) as f64
            }
        })
        .collect()
}

/// An operand for `op`: standard values for sums, [`product_values`] for products.
fn scan_operand(h: &Harness, op: ScanOp, dtype: DType, kind: ViewKind, shape: &[usize]) -> Operand {
    match op {
        ScanOp::Sum => h.operand(dtype, kind, shape, Spec::standard()),
        ScanOp::Prod => {
            let v = view(kind, shape);
            let base = product_values(h, dtype, v.base_len);
            h.operand_from(dtype, v, &base)
        }
    }
}

/// Launch a scan of `input` into a poisoned output viewed as `out_kind`; check it (exactly when
/// `exact`).
fn scan_case(h: &Harness, op: ScanOp, dtype: DType, input: &Operand, dim: usize, out_kind: ViewKind, exact: bool) {
    let shape = input.layout.shape().to_vec();
    let (out, out_layout) = h.poisoned_view(dtype, out_kind, &shape);
    let what = format!(
        "{} {dtype} {shape:?} dim {dim} ({} into {})",
        op.name(),
        input.kind.name(),
        view(out_kind, &shape).kind.name()
    );
    let kernel = Kernel::Scan {
        op,
        input: input.arg(),
        dim,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, allowed) = reference_model::scan(op, dtype, &shape, &input.values, dim);
        h.check_with(
            &what,
            &out,
            &out_layout,
            &want,
            |i, _| if exact { 0.0 } else { allowed[i] },
        );
    }
}

/// `Scan`: every op × dtype the backend lists over the case table, then the large cases.
pub fn scan(h: &Harness) {
    use ViewKind::*;
    // (shape, dim, input view, output view)
    let cases: Vec<(Vec<usize>, usize, ViewKind, ViewKind)> = vec![
        (vec![7], 0, Contiguous, Contiguous),
        (vec![1], 0, Contiguous, Contiguous),
        (vec![0], 0, Contiguous, Contiguous),
        (vec![3, 0], 1, Contiguous, Contiguous),
        (vec![0, 3], 0, Contiguous, Contiguous),
        (vec![33, 5], 0, Contiguous, Transposed),
        (vec![33, 5], 1, Transposed, Contiguous),
        (vec![3, 4, 5], 0, Permuted, Contiguous),
        (vec![3, 4, 5], 1, Permuted, Narrowed),
        (vec![3, 4, 5], 2, Contiguous, Offset),
        (vec![6, 7], 1, Narrowed, Transposed),
        (vec![5, 7], 0, Broadcast, Contiguous),
        (vec![4, 6], 1, Scalar, Contiguous),
        (vec![2, 33], 1, Offset, Narrowed),
        (vec![3, 1000], 1, Contiguous, Contiguous),
        (vec![300, 3], 0, Contiguous, Contiguous),
    ];
    for op in ScanOp::ALL {
        for dtype in DType::ALL {
            if !h.supports(Op::Scan(op), dtype) {
                let (input, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(dtype, 3));
                let kernel = Kernel::Scan {
                    op,
                    input: input.contiguous(&[3]),
                    dim: 0,
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            for (shape, dim, kind, out_kind) in &cases {
                let input = scan_operand(h, op, dtype, *kind, shape);
                scan_case(h, op, dtype, &input, *dim, *out_kind, false);
            }
        }
    }
    scan_large(h);
}

/// Integer-valued large scans: cumsum of values in -2..=2 over 2^20 + 1 elements (f32 and i32:
/// the prefixes stay far below 2^24, so every one is exact), cumprod of ±1 over as many, and
/// cumsum down the columns of a transposed 1024 × 1025 matrix.
fn scan_large(h: &Harness) {
    let integral = Spec::new((-2.0, 2.0), (-2, 2)).grid(1.0);
    for dtype in [DType::F32, DType::I32] {
        if h.supports(Op::Scan(ScanOp::Sum), dtype) {
            let input = h.operand(dtype, ViewKind::Contiguous, &[LARGE], integral);
            scan_case(h, ScanOp::Sum, dtype, &input, 0, ViewKind::Contiguous, true);
        }
    }
    if h.supports(Op::Scan(ScanOp::Prod), DType::F32) {
        let v = view(ViewKind::Contiguous, &[LARGE]);
        let base: Vec<f64> = (0..LARGE).map(|_| if h.below(2) == 1 { -1.0 } else { 1.0 }).collect();
        let input = h.operand_from(DType::F32, v, &base);
        scan_case(h, ScanOp::Prod, DType::F32, &input, 0, ViewKind::Contiguous, true);
    }
    if h.supports(Op::Scan(ScanOp::Sum), DType::F32) {
        let v: View = view(ViewKind::Transposed, &[1024, 1025]);
        let base = h.random_values(DType::F32, v.base_len, integral);
        let input = h.operand_from(DType::F32, v, &base);
        scan_case(h, ScanOp::Sum, DType::F32, &input, 0, ViewKind::Contiguous, true);
    }
}
