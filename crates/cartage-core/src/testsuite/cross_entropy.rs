//! `CrossEntropy` (per-row loss with `ignore_index` and label smoothing): every float dtype the
//! backend lists, i32 and i64 targets, rows of 1 to 32768 classes, strided, offset and broadcast
//! logits and targets into strided losses, logits large enough to need the max subtraction,
//! smoothing 0, 0.1 and 1, `ignore_index` outside and inside `[0, C)` (those rows give 0); then
//! targets outside `[0, C)` other than `ignore_index` → `Error::IndexOutOfRange`.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};

use super::Spec;
use super::buffers::encode_ints;
use super::harness::Harness;
use super::index::{INDEX_DTYPES, expect_out_of_range};
use super::reference_model;
use super::views::{Line, ViewKind};

/// Targets for `rows` rows: valid classes below `classes`, a quarter of them `ignore_index`.
fn targets(h: &Harness, rows: usize, classes: usize, ignore_index: i64) -> Vec<f64> {
    (0..rows)
        .map(|_| {
            if h.below(4) == 0 {
                ignore_index as f64
            } else {
                h.below(classes.max(1)) as f64
            }
        })
        .collect()
}

/// One cross-entropy case: logits `[rows, classes]` viewed as `logits_kind`, targets laid out as
/// `target_line`, the loss written through `out_line`.
#[allow(clippy::too_many_arguments)]
fn cross_entropy_case(
    h: &Harness,
    dtype: DType,
    index_dtype: DType,
    [rows, classes]: [usize; 2],
    (logits_kind, target_line, out_line): (ViewKind, Line, Line),
    ignore_index: i64,
    smoothing: f64,
    spec: Spec,
) {
    let logits = h.operand(dtype, logits_kind, &[rows, classes], spec);
    let tv = target_line.view(rows);
    // A broadcast target view reads one buffer element for every row.
    let base = targets(h, tv.base_len, classes, ignore_index);
    let target = h.operand_from(index_dtype, tv, &base);
    let out_view = out_line.view(rows);
    let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
    let what = format!(
        "cross_entropy {dtype} [{rows}, {classes}] ({}) target {index_dtype} ({}) into ({}), ignore_index {ignore_index}, smoothing {smoothing}",
        logits.kind.name(),
        target_line.name(),
        out_line.name()
    );
    let kernel = Kernel::CrossEntropy {
        logits: logits.arg(),
        target: target.arg(),
        ignore_index,
        label_smoothing: smoothing,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, allowed) =
            reference_model::cross_entropy(dtype, &logits.values, classes, &target.values, ignore_index, smoothing);
        h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
    }
}

/// `CrossEntropy`: every float dtype the backend lists, both target dtypes, smoothing 0, 0.1 and
/// 1, `ignore_index` outside and inside `[0, C)`; then out-of-range targets.
pub fn cross_entropy(h: &Harness) {
    use ViewKind::*;
    let standard = Spec::standard();
    type CeCase = ([usize; 2], (ViewKind, Line, Line), Spec);
    let cases: Vec<CeCase> = vec![
        (
            [4, 7],
            (Contiguous, Line::Kind(Contiguous), Line::Kind(Contiguous)),
            standard,
        ),
        (
            [1, 1],
            (Contiguous, Line::Kind(Contiguous), Line::Kind(Contiguous)),
            standard,
        ),
        (
            [0, 5],
            (Contiguous, Line::Kind(Contiguous), Line::Kind(Contiguous)),
            standard,
        ),
        ([9, 5], (Transposed, Line::Stride2, Line::Stride2), standard),
        ([6, 7], (Narrowed, Line::Kind(Offset), Line::Kind(Narrowed)), standard),
        ([5, 7], (Broadcast, Line::Kind(Broadcast), Line::Kind(Offset)), standard),
        (
            [4, 33],
            (Offset, Line::Kind(Contiguous), Line::Stride2),
            Spec::new((50.0, 100.0), (0, 0)),
        ),
        (
            [8, 1000],
            (Contiguous, Line::Kind(Offset), Line::Kind(Contiguous)),
            standard,
        ),
    ];
    let settings = [(-100i64, 0.0), (-100, 0.1), (3, 0.1), (-1, 1.0)];
    for dtype in DType::ALL {
        if !h.supports(Op::CrossEntropy, dtype) {
            let (logits, target, out) = (
                h.upload(dtype, &[1.0; 6]),
                h.upload(DType::I64, &[0.0, 1.0]),
                h.poisoned(dtype, 2),
            );
            let kernel = Kernel::CrossEntropy {
                logits: logits.contiguous(&[2, 3]),
                target: target.contiguous(&[2]),
                ignore_index: -100,
                label_smoothing: 0.0,
                out: out.contiguous(&[2]),
            };
            h.expect_unsupported(&format!("cross_entropy {dtype}"), &kernel);
            continue;
        }
        for index_dtype in INDEX_DTYPES {
            for (shape, kinds, spec) in &cases {
                for (ignore_index, smoothing) in settings {
                    cross_entropy_case(h, dtype, index_dtype, *shape, *kinds, ignore_index, smoothing, *spec);
                }
            }
        }
        // Long rows.
        let kinds = (Contiguous, Line::Kind(Contiguous), Line::Kind(Contiguous));
        cross_entropy_case(h, dtype, DType::I64, [3, 32768], kinds, -100, 0.1, standard);
    }
    cross_entropy_out_of_range(h);
}

/// Targets ≥ C or negative (other than `ignore_index`) give `IndexOutOfRange` naming the target,
/// dim 1 (the class dim of the logits) and C; the backend works afterwards.
fn cross_entropy_out_of_range(h: &Harness) {
    let Some(dtype) = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::CrossEntropy, d))
    else {
        return;
    };
    let classes = 5usize;
    for index_dtype in INDEX_DTYPES {
        // (bad target, ignore_index)
        let mut bad = vec![
            (5i64, -100i64),
            (12, -100),
            (-1, -100),
            (-100, -1),
            (i32::MIN as i64, -100),
        ];
        if index_dtype == DType::I64 {
            bad.extend([(1i64 << 40, -100), ((1i64 << 32) + 2, -100)]);
        }
        for (trial, &(value, ignore_index)) in bad.iter().enumerate() {
            let rows = if trial % 2 == 0 { 4 } else { 3000 };
            let mut t: Vec<i64> = (0..rows).map(|_| h.below(classes) as i64).collect();
            let at = if rows == 4 { h.below(rows) } else { rows - 1 };
            t[at] = value;
            // One valid row holds the ignore index too.
            t[(at + 1) % rows] = ignore_index;
            let target = h.upload_bytes(index_dtype, &encode_ints(index_dtype, &t));
            let logits = h.operand(dtype, ViewKind::Contiguous, &[rows, classes], Spec::standard());
            let out = h.poisoned(dtype, rows);
            let kernel = Kernel::CrossEntropy {
                logits: logits.arg(),
                target: target.contiguous(&[rows]),
                ignore_index,
                label_smoothing: 0.1,
                out: out.contiguous(&[rows]),
            };
            let what = format!(
                "cross_entropy {dtype} [{rows}, {classes}] target {index_dtype} holding {value} at {at} (ignore_index {ignore_index})"
            );
            expect_out_of_range(h, &what, &kernel, &out, value, Some(1), classes);
        }
        let kinds = (
            ViewKind::Contiguous,
            Line::Kind(ViewKind::Contiguous),
            Line::Kind(ViewKind::Contiguous),
        );
        cross_entropy_case(h, dtype, index_dtype, [6, classes], kinds, -100, 0.1, Spec::standard());
    }
}
