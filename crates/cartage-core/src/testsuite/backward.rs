//! The backward kernels, optional fused kernels: where the backend lists `SoftmaxBackward`,
//! `LogSoftmaxBackward`, `CrossEntropyBackward` or `GeluBackward` for a dtype, each case is
//! compared with the f64 formula of the module docs of `kernel.rs` on the same (rounded)
//! inputs; every other dtype must be refused with `Unsupported`.
//!
//! The cases cover rows of 1 to 4096, both dims of a matrix, strided, offset and broadcast
//! inputs into strided outputs, cross-entropy with i32 and i64 targets, ignored rows and label
//! smoothing; then targets outside `[0, C)`. `NormBackward` has its own module
//! ([`super::norm_backward`]).
//! The allowed error is one rounding of the result plus the compute type's accumulation error
//! over the row, scaled by the magnitudes that enter each sum.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};

use super::Spec;
use super::buffers::encode_ints;
use super::harness::Harness;
use super::index::{INDEX_DTYPES, expect_out_of_range};
use super::reference::{Tolerance, accumulation_eps, erf};
use super::reference_model::lines;
use super::views::{Line, ViewKind, view};

/// Shapes, the dim, and the views of (forward values, incoming gradient, output).
pub(super) type RowCase = (Vec<usize>, usize, [ViewKind; 3]);

pub(super) fn row_cases() -> Vec<RowCase> {
    use ViewKind::*;
    vec![
        (vec![3, 7], 1, [Contiguous, Contiguous, Contiguous]),
        (vec![3, 7], 0, [Contiguous, Offset, Contiguous]),
        (vec![5, 1], 1, [Contiguous, Contiguous, Contiguous]),
        (vec![7], 0, [Offset, Contiguous, Offset]),
        (vec![0, 7], 1, [Contiguous, Contiguous, Contiguous]),
        (vec![4, 9], 1, [Transposed, Narrowed, Transposed]),
        (vec![3, 4, 5], 2, [Permuted, Contiguous, Transposed]),
        (vec![3, 4, 5], 1, [Contiguous, Permuted, Contiguous]),
        (vec![5, 7], 1, [Broadcast, Contiguous, Narrowed]),
        (vec![2, 33], 1, [Contiguous, Broadcast, Contiguous]),
        (vec![3, 4096], 1, [Contiguous, Contiguous, Narrowed]),
    ]
}

/// `SoftmaxBackward` for softmax and log-softmax.
pub fn softmax_backward(h: &Harness) {
    for (log, op) in [(false, Op::SoftmaxBackward), (true, Op::LogSoftmaxBackward)] {
        for dtype in DType::ALL {
            if !h.supports(op, dtype) {
                let (a, b, out) = (
                    h.upload(dtype, &[0.5; 3]),
                    h.upload(dtype, &[1.0; 3]),
                    h.poisoned(dtype, 3),
                );
                let kernel = Kernel::SoftmaxBackward {
                    output: a.contiguous(&[3]),
                    grad: b.contiguous(&[3]),
                    dim: 0,
                    log,
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            for (shape, dim, kinds) in row_cases() {
                softmax_case(h, dtype, log, &shape, dim, kinds);
            }
        }
    }
}

fn softmax_case(h: &Harness, dtype: DType, log: bool, shape: &[usize], dim: usize, kinds: [ViewKind; 3]) {
    // Softmax values lie in (0, 1), log-softmax values below 0.
    let values = if log {
        Spec::new((-6.0, 0.0), (0, 0))
    } else {
        Spec::new((0.0, 1.0), (0, 0))
    };
    let output = h.operand(dtype, kinds[0], shape, values);
    let grad = h.operand(dtype, kinds[1], shape, Spec::standard());
    let out_view = view(kinds[2], shape);
    let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
    let name = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let what = format!(
        "{name} {dtype} {shape:?} dim {dim} ({}, {} into {})",
        kinds[0].name(),
        kinds[1].name(),
        kinds[2].name()
    );
    let kernel = Kernel::SoftmaxBackward {
        output: output.arg(),
        grad: grad.arg(),
        dim,
        log,
        out: out.arg(&out_layout),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let tol = Tolerance::transcendental(dtype);
    let acc = 4.0 * accumulation_eps(dtype) * (shape[dim].max(1) as f64).sqrt();
    let mut want = vec![0.0; output.values.len()];
    let mut allowed = vec![0.0; output.values.len()];
    for line in lines(shape, dim) {
        let (y, g): (Vec<f64>, Vec<f64>) = line.iter().map(|&i| (output.values[i], grad.values[i])).unzip();
        if log {
            let (total, magnitude) = (g.iter().sum::<f64>(), g.iter().map(|v| v.abs()).sum::<f64>());
            for (k, &i) in line.iter().enumerate() {
                let p = y[k].exp();
                want[i] = g[k] - p * total;
                allowed[i] = tol.allowed(want[i]) + p * (acc * magnitude + tol.rel * total.abs());
            }
        } else {
            let inner: f64 = y.iter().zip(&g).map(|(a, b)| a * b).sum();
            let magnitude: f64 = y.iter().zip(&g).map(|(a, b)| (a * b).abs()).sum();
            for (k, &i) in line.iter().enumerate() {
                want[i] = y[k] * (g[k] - inner);
                allowed[i] = tol.allowed(want[i]) + y[k].abs() * (acc * (magnitude + g[k].abs()));
            }
        }
    }
    h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
}

/// `GeluBackward`: `g·(Φ(x) + x·φ(x))` element by element, over inputs spread across ±5 (both
/// tails and the turn near −0.75), in every view of the softmax cases.
pub fn gelu_backward(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::GeluBackward, dtype) {
            let (a, b, out) = (
                h.upload(dtype, &[0.5; 3]),
                h.upload(dtype, &[1.0; 3]),
                h.poisoned(dtype, 3),
            );
            let kernel = Kernel::GeluBackward {
                input: a.contiguous(&[3]),
                grad: b.contiguous(&[3]),
                out: out.contiguous(&[3]),
            };
            h.expect_unsupported(&format!("gelu_backward {dtype}"), &kernel);
            continue;
        }
        for (shape, _, kinds) in row_cases() {
            let input = h.operand(dtype, kinds[0], &shape, Spec::new((-5.0, 5.0), (0, 0)));
            let grad = h.operand(dtype, kinds[1], &shape, Spec::standard());
            let out_view = view(kinds[2], &shape);
            let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
            let what = format!(
                "gelu_backward {dtype} {shape:?} ({}, {} into {})",
                kinds[0].name(),
                kinds[1].name(),
                kinds[2].name()
            );
            let kernel = Kernel::GeluBackward {
                input: input.arg(),
                grad: grad.arg(),
                out: out.arg(&out_layout),
            };
            if !h.launch(&what, &kernel) {
                continue;
            }
            let tol = Tolerance::transcendental(dtype);
            let density = 1.0 / (2.0 * std::f64::consts::PI).sqrt();
            let (mut want, mut allowed) = (Vec::new(), Vec::new());
            for (&x, &g) in input.values.iter().zip(&grad.values) {
                let slope = 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2)) + x * density * (-0.5 * x * x).exp();
                want.push(g * slope);
                // One rounding of the result, and the slope's own error relative to its size
                // (at most about 1.13) times the gradient.
                allowed.push(tol.allowed(g * slope) + tol.rel * 1.2 * g.abs());
            }
            h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
        }
    }
}

/// `CrossEntropyBackward`: both target dtypes, smoothing 0, 0.1 and 1, ignored rows; then
/// out-of-range targets.
pub fn cross_entropy_backward(h: &Harness) {
    use ViewKind::*;
    type CeCase = ([usize; 2], ViewKind, Line, Line, ViewKind);
    let cases: Vec<CeCase> = vec![
        (
            [4, 7],
            Contiguous,
            Line::Kind(Contiguous),
            Line::Kind(Contiguous),
            Contiguous,
        ),
        (
            [1, 1],
            Contiguous,
            Line::Kind(Contiguous),
            Line::Kind(Contiguous),
            Contiguous,
        ),
        (
            [0, 5],
            Contiguous,
            Line::Kind(Contiguous),
            Line::Kind(Contiguous),
            Contiguous,
        ),
        ([9, 5], Transposed, Line::Stride2, Line::Kind(Broadcast), Narrowed),
        ([6, 7], Narrowed, Line::Kind(Offset), Line::Stride2, Transposed),
        ([5, 7], Broadcast, Line::Kind(Broadcast), Line::Kind(Offset), Offset),
        (
            [8, 1000],
            Contiguous,
            Line::Kind(Contiguous),
            Line::Kind(Contiguous),
            Contiguous,
        ),
    ];
    for dtype in DType::ALL {
        if !h.supports(Op::CrossEntropyBackward, dtype) {
            let (logits, target, grad, out) = (
                h.upload(dtype, &[1.0; 6]),
                h.upload(DType::I64, &[0.0, 1.0]),
                h.upload(dtype, &[1.0; 2]),
                h.poisoned(dtype, 6),
            );
            let kernel = Kernel::CrossEntropyBackward {
                logits: logits.contiguous(&[2, 3]),
                target: target.contiguous(&[2]),
                grad: grad.contiguous(&[2]),
                ignore_index: -100,
                label_smoothing: 0.0,
                out: out.contiguous(&[2, 3]),
            };
            h.expect_unsupported(&format!("cross_entropy_backward {dtype}"), &kernel);
            continue;
        }
        for index_dtype in INDEX_DTYPES {
            for case in &cases {
                for (ignore_index, smoothing) in [(-100i64, 0.0), (3, 0.1), (-1, 1.0)] {
                    cross_entropy_case(h, dtype, index_dtype, case, ignore_index, smoothing);
                }
            }
        }
    }
    cross_entropy_out_of_range(h);
}

fn cross_entropy_case(
    h: &Harness,
    dtype: DType,
    index_dtype: DType,
    case: &([usize; 2], ViewKind, Line, Line, ViewKind),
    ignore_index: i64,
    smoothing: f64,
) {
    let &([rows, classes], logits_kind, target_line, grad_line, out_kind) = case;
    let logits = h.operand(dtype, logits_kind, &[rows, classes], Spec::standard());
    let tv = target_line.view(rows);
    let base: Vec<f64> = (0..tv.base_len)
        .map(|_| {
            if h.below(4) == 0 {
                ignore_index as f64
            } else {
                h.below(classes.max(1)) as f64
            }
        })
        .collect();
    let target = h.operand_from(index_dtype, tv, &base);
    let gv = grad_line.view(rows);
    let gbase = h.random_values(dtype, gv.base_len, Spec::standard());
    let grad = h.operand_from(dtype, gv, &gbase);
    let out_view = view(out_kind, &[rows, classes]);
    let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
    let what = format!(
        "cross_entropy_backward {dtype} [{rows}, {classes}] ({}) target {index_dtype} ({}) grad ({}) into ({}), ignore_index {ignore_index}, smoothing {smoothing}",
        logits_kind.name(),
        target_line.name(),
        grad_line.name(),
        out_kind.name()
    );
    let kernel = Kernel::CrossEntropyBackward {
        logits: logits.arg(),
        target: target.arg(),
        grad: grad.arg(),
        ignore_index,
        label_smoothing: smoothing,
        out: out.arg(&out_layout),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let tol = Tolerance::transcendental(dtype);
    let acc = 8.0 * accumulation_eps(dtype) * (classes.max(1) as f64).sqrt();
    let mut want = vec![0.0; rows * classes];
    let mut allowed = vec![0.0; rows * classes];
    for r in 0..rows {
        let t = target.values[r] as i64;
        if t == ignore_index {
            continue;
        }
        let row = &logits.values[r * classes..(r + 1) * classes];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|x| (x - m).exp()).sum();
        let g = grad.values[r];
        for (c, &x) in row.iter().enumerate() {
            let p = (x - m).exp() / total;
            let hit = if c as i64 == t { 1.0 - smoothing } else { 0.0 };
            let i = r * classes + c;
            want[i] = g * (p - hit - smoothing / classes as f64);
            allowed[i] = tol.allowed(want[i]) + g.abs() * (acc * (p + 1.0 / classes as f64) + tol.rel * (p + 1.0));
        }
    }
    h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
}

/// Targets ≥ C or negative (other than `ignore_index`) give `IndexOutOfRange` naming the target,
/// dim 1 and C.
fn cross_entropy_out_of_range(h: &Harness) {
    let Some(dtype) = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::CrossEntropyBackward, d))
    else {
        return;
    };
    let classes = 5usize;
    for index_dtype in INDEX_DTYPES {
        for (trial, &(value, ignore_index)) in [(5i64, -100i64), (-1, -100), (-100, -1), (i32::MIN as i64, -100)]
            .iter()
            .enumerate()
        {
            let rows = if trial % 2 == 0 { 4 } else { 3000 };
            let mut t: Vec<i64> = (0..rows).map(|_| h.below(classes) as i64).collect();
            let at = if rows == 4 { h.below(rows) } else { rows - 1 };
            t[at] = value;
            t[(at + 1) % rows] = ignore_index;
            let target = h.upload_bytes(index_dtype, &encode_ints(index_dtype, &t));
            let logits = h.operand(dtype, ViewKind::Contiguous, &[rows, classes], Spec::standard());
            let grad = h.operand(dtype, ViewKind::Contiguous, &[rows], Spec::standard());
            let out = h.poisoned(dtype, rows * classes);
            let kernel = Kernel::CrossEntropyBackward {
                logits: logits.arg(),
                target: target.contiguous(&[rows]),
                grad: grad.arg(),
                ignore_index,
                label_smoothing: 0.1,
                out: out.contiguous(&[rows, classes]),
            };
            let what = format!(
                "cross_entropy_backward {dtype} [{rows}, {classes}] target {index_dtype} holding {value} at {at} (ignore_index {ignore_index})"
            );
            expect_out_of_range(h, &what, &kernel, &out, value, Some(1), classes);
        }
    }
}
