//! `NormBackward`, an optional fused kernel: where the backend lists it for a dtype, the input
//! gradient and the optional weight and bias gradients of one call are compared with the
//! composed formula of the module docs of `kernel.rs`, evaluated in f64 on the same (rounded)
//! inputs; every other dtype must be refused with `Unsupported`.
//!
//! [`norm_backward`] runs the row cases of the other backward kernels (strided, offset,
//! transposed and broadcast inputs into strided outputs, with and without a strided weight),
//! asking for the weight and bias gradients in every other case. [`norm_backward_params`] runs
//! every combination of weight, weight gradient and bias gradient over shapes chosen for the
//! gradients' column sums: no rows, one column, odd column counts (3, 1000, 4097) and thousands
//! of rows (so that a backend summing per-block partials has many blocks to combine); then
//! malformed kernels, which must be refused with typed errors.
//!
//! Allowed errors: the input gradient as in the other row kernels; a column sum one rounding of
//! the result plus the compute type's accumulation error over the rows and over each row's
//! statistics, scaled by the magnitudes that enter it.

use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::kernel::{Kernel, NormBackwardArgs, NormKind, Op, TensorArg};

use super::Spec;
use super::backward::row_cases;
use super::buffers::{DeviceBuffer, Operand};
use super::harness::Harness;
use super::reference::{Tolerance, accumulation_eps};
use super::reference_model::lines;
use super::views::{Line, ViewKind, view};

/// Which of the optional operands a case passes.
#[derive(Clone, Copy, Debug)]
struct Wants {
    /// The forward's weight, laid out as this line.
    weight: Option<Line>,
    /// The weight gradient, written into this line.
    grad_weight: Option<Line>,
    /// The bias gradient (layer norm only), written into this line.
    grad_bias: Option<Line>,
}

impl Wants {
    const NONE: Wants = Wants {
        weight: None,
        grad_weight: None,
        grad_bias: None,
    };

    fn describe(&self) -> String {
        let part = |name: &str, line: Option<Line>| match line {
            Some(l) => format!("{name} ({})", l.name()),
            None => format!("no {name}"),
        };
        format!(
            "{}, {}, {}",
            part("weight", self.weight),
            part("weight gradient", self.grad_weight),
            part("bias gradient", self.grad_bias)
        )
    }
}

/// A one-element-per-column output: its buffer, its view.
struct Column {
    buf: DeviceBuffer,
    line: Line,
}

impl Column {
    fn new(h: &Harness, dtype: DType, line: Line, n: usize) -> Self {
        let v = line.view(n);
        Column {
            buf: h.poisoned(dtype, v.base_len),
            line,
        }
    }

    fn arg(&self, n: usize) -> TensorArg {
        self.buf.arg(&self.line.view(n).layout)
    }
}

/// The f64 reference of one call: each gradient with its allowed error per element.
struct Reference {
    dx: Vec<f64>,
    dx_allowed: Vec<f64>,
    dw: Vec<f64>,
    dw_allowed: Vec<f64>,
    db: Vec<f64>,
    db_allowed: Vec<f64>,
}

/// The composed formula over the rows of `shape` (row-major values), in f64.
fn reference(
    kind: NormKind,
    dtype: DType,
    shape: &[usize],
    x: &[f64],
    g: &[f64],
    w: Option<&[f64]>,
    eps: f64,
) -> Reference {
    let n = *shape.last().expect("rank ≥ 1");
    let rows = x.len().checked_div(n).unwrap_or(0);
    let tol = Tolerance::transcendental(dtype);
    let acc = 8.0 * accumulation_eps(dtype) * (n.max(1) as f64).sqrt();
    let row_acc = 16.0 * accumulation_eps(dtype) * (rows.max(1) as f64).sqrt();
    let weight = |j: usize| w.map_or(1.0, |w| w[j]);
    let mut dx = vec![0.0; x.len()];
    let mut dx_allowed = vec![0.0; x.len()];
    // Per column: Σ g·x̂, Σ |g·x̂|, Σ (g·x̂)², Σ g, Σ g².
    let mut sums = vec![[0.0f64; 5]; n];
    for line in lines(shape, shape.len() - 1) {
        let xs: Vec<f64> = line.iter().map(|&i| x[i]).collect();
        let gh: Vec<f64> = line.iter().enumerate().map(|(j, &i)| g[i] * weight(j)).collect();
        let len = n as f64;
        let (mean, rstd) = match kind {
            NormKind::Layer => {
                let mean = xs.iter().sum::<f64>() / len;
                let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len;
                (mean, 1.0 / (var + eps).sqrt())
            }
            NormKind::Rms => (0.0, 1.0 / (xs.iter().map(|v| v * v).sum::<f64>() / len + eps).sqrt()),
        };
        let xhat: Vec<f64> = xs.iter().map(|v| (v - mean) * rstd).collect();
        let mean_g = if kind == NormKind::Layer {
            gh.iter().sum::<f64>() / len
        } else {
            0.0
        };
        let mean_gx = gh.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / len;
        let scale = gh.iter().map(|v| v.abs()).sum::<f64>() / len + gh.iter().map(|v| v.abs()).fold(0.0, f64::max);
        for (j, &i) in line.iter().enumerate() {
            dx[i] = rstd * (gh[j] - mean_g - xhat[j] * mean_gx);
            dx_allowed[i] = tol.allowed(dx[i]) + acc * rstd * scale * (1.0 + xhat[j].abs()) * (1.0 + rstd);
            let term = g[i] * xhat[j];
            let s = &mut sums[j];
            s[0] += term;
            s[1] += term.abs();
            s[2] += term * term;
            s[3] += g[i];
            s[4] += g[i] * g[i];
        }
    }
    let dw: Vec<f64> = sums.iter().map(|s| s[0]).collect();
    let db: Vec<f64> = sums.iter().map(|s| s[3]).collect();
    // A column sum: one rounding, the accumulation over the rows, and each x̂'s own error (from
    // its row's statistics) times the magnitude of its term.
    let dw_allowed = sums
        .iter()
        .map(|s| tol.allowed(s[0]) + row_acc * s[2].sqrt() + 2.0 * acc * s[1])
        .collect();
    let db_allowed = sums.iter().map(|s| tol.allowed(s[3]) + row_acc * s[4].sqrt()).collect();
    Reference {
        dx,
        dx_allowed,
        dw,
        dw_allowed,
        db,
        db_allowed,
    }
}

/// One call: the input, incoming gradient and input gradient viewed as `kinds`, the optional
/// operands as `wants`; every requested gradient checked against [`reference`].
fn run_case(h: &Harness, kind: NormKind, dtype: DType, shape: &[usize], kinds: [ViewKind; 3], wants: Wants, eps: f64) {
    let n = *shape.last().expect("rank ≥ 1");
    let input = h.operand(dtype, kinds[0], shape, Spec::standard());
    let grad = h.operand(dtype, kinds[1], shape, Spec::standard());
    let weight: Option<Operand> = wants.weight.map(|line| {
        let v = line.view(n);
        let base = h.random_values(dtype, v.base_len, Spec::new((0.5, 1.5), (1, 3)).signed());
        h.operand_from(dtype, v, &base)
    });
    let out_view = view(kinds[2], shape);
    let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
    let grad_weight = wants.grad_weight.map(|line| Column::new(h, dtype, line, n));
    let grad_bias = wants.grad_bias.map(|line| Column::new(h, dtype, line, n));
    let what = format!(
        "{}_backward {dtype} {shape:?} ({}, {} into {}), {}, eps {eps}",
        kind.name(),
        kinds[0].name(),
        kinds[1].name(),
        kinds[2].name(),
        wants.describe()
    );
    let kernel = Kernel::NormBackward(Box::new(NormBackwardArgs {
        kind,
        input: input.arg(),
        weight: weight.as_ref().map(Operand::arg),
        grad: grad.arg(),
        eps,
        grad_input: out.arg(&out_layout),
        grad_weight: grad_weight.as_ref().map(|c| c.arg(n)),
        grad_bias: grad_bias.as_ref().map(|c| c.arg(n)),
    }));
    if !h.launch(&what, &kernel) {
        return;
    }
    let w = weight.as_ref().map(|w| w.values.as_slice());
    let r = reference(kind, dtype, shape, &input.values, &grad.values, w, eps);
    h.check_with(&what, &out, &out_layout, &r.dx, |i, _| r.dx_allowed[i]);
    if let Some(c) = &grad_weight {
        let layout = c.line.view(n).layout;
        h.check_with(&format!("{what}: weight gradient"), &c.buf, &layout, &r.dw, |i, _| {
            r.dw_allowed[i]
        });
    }
    if let Some(c) = &grad_bias {
        let layout = c.line.view(n).layout;
        h.check_with(&format!("{what}: bias gradient"), &c.buf, &layout, &r.db, |i, _| {
            r.db_allowed[i]
        });
    }
}

/// A listed dtype, or `false` after checking that the backend refuses the op for it.
fn listed(h: &Harness, kind: NormKind, dtype: DType) -> bool {
    let op = Op::NormBackward(kind);
    if h.supports(op, dtype) {
        return true;
    }
    let (x, g, out) = (
        h.upload(dtype, &[1.0, 2.0, 3.0]),
        h.upload(dtype, &[1.0; 3]),
        h.poisoned(dtype, 3),
    );
    let gw = h.poisoned(dtype, 3);
    let kernel = Kernel::NormBackward(Box::new(NormBackwardArgs {
        kind,
        input: x.contiguous(&[3]),
        weight: None,
        grad: g.contiguous(&[3]),
        eps: 1e-5,
        grad_input: out.contiguous(&[3]),
        grad_weight: Some(gw.contiguous(&[3])),
        grad_bias: None,
    }));
    h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
    false
}

/// `NormBackward` over the row cases: both kinds, with and without a (strided) weight, the weight
/// and bias gradients asked for in every other case.
pub fn norm_backward(h: &Harness) {
    let lines = [
        Line::Kind(ViewKind::Contiguous),
        Line::Stride2,
        Line::Kind(ViewKind::Offset),
    ];
    for kind in [NormKind::Layer, NormKind::Rms] {
        for dtype in DType::ALL {
            if !listed(h, kind, dtype) {
                continue;
            }
            for (c, (shape, _, kinds)) in row_cases().into_iter().enumerate() {
                let line = lines[c % lines.len()];
                for (i, weight) in [None, Some(line)].into_iter().enumerate() {
                    let gradients = (c + i) % 2 == 1;
                    let wants = Wants {
                        weight,
                        grad_weight: gradients.then_some(lines[(c + 1) % lines.len()]),
                        grad_bias: (gradients && kind == NormKind::Layer).then_some(lines[(c + 2) % lines.len()]),
                    };
                    run_case(h, kind, dtype, &shape, kinds, wants, [1e-5, 0.1][c % 2]);
                }
            }
        }
    }
}

/// The shapes of [`norm_backward_params`]: no rows, one column, odd column counts, many rows.
const PARAM_SHAPES: [&[usize]; 8] = [
    &[0, 5],
    &[1, 1],
    &[6, 1],
    &[7, 3],
    &[3000, 3],
    &[2, 3, 1000],
    &[3000, 64],
    &[9, 4097],
];

/// Shapes of at most this many elements run every combination of optional operands.
const SMALL: usize = 20_000;

/// Larger shapes, run once per dtype and kind with every operand: 1200 rows of an odd 1000
/// columns, and a few hundred rows of 4097.
const LARGE_PARAM_SHAPES: [&[usize]; 2] = [&[1200, 1000], &[300, 4097]];

/// `NormBackward`'s weight and bias gradients: every combination of weight and gradients over
/// `PARAM_SHAPES`, the full set over `LARGE_PARAM_SHAPES`; then malformed kernels.
pub fn norm_backward_params(h: &Harness) {
    use ViewKind::Contiguous;
    let dense = Some(Line::Kind(Contiguous));
    for kind in [NormKind::Layer, NormKind::Rms] {
        for dtype in DType::ALL {
            if !listed(h, kind, dtype) {
                continue;
            }
            let biases: &[Option<Line>] = match kind {
                NormKind::Layer => &[None, Some(Line::Kind(Contiguous))],
                NormKind::Rms => &[None],
            };
            for (s, shape) in PARAM_SHAPES.iter().enumerate() {
                // Every combination on small shapes; on larger ones, all or one at a time.
                let small = shape.iter().product::<usize>() <= SMALL;
                for weight in [None, dense] {
                    for grad_weight in [None, dense] {
                        for &grad_bias in biases {
                            let some = [weight, grad_weight, grad_bias].iter().filter(|o| o.is_some()).count();
                            if !small && some != 1 && some != biases.len() + 1 {
                                continue;
                            }
                            let wants = Wants {
                                weight,
                                grad_weight,
                                grad_bias,
                            };
                            run_case(h, kind, dtype, shape, [Contiguous; 3], wants, [1e-5, 0.1][s % 2]);
                        }
                    }
                }
            }
            for shape in LARGE_PARAM_SHAPES {
                let wants = Wants {
                    weight: dense,
                    grad_weight: dense,
                    grad_bias: (kind == NormKind::Layer).then_some(Line::Stride2),
                };
                run_case(h, kind, dtype, shape, [Contiguous; 3], wants, 1e-5);
            }
            // Transposed rows with strided gradients (the strided kernels, with gradients).
            let wants = Wants {
                weight: Some(Line::Stride2),
                grad_weight: Some(Line::Kind(ViewKind::Offset)),
                ..Wants::NONE
            };
            let kinds = [ViewKind::Transposed, ViewKind::Contiguous, ViewKind::Transposed];
            run_case(h, kind, dtype, &[1500, 37], kinds, wants, 0.1);
        }
    }
    malformed(h);
}

/// Require `kernel` to fail validation with `kind`, and the launch with `kind` too.
fn refused(h: &Harness, what: &str, kernel: &Kernel, kind: ErrorKind) {
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
    match h.run(kernel).and_then(|()| h.backend().synchronize()) {
        Err(e) if e.kind() == kind => {}
        Err(e) => h.fail(format!(
            "{what}: launch gave {} ({e}), expected {}",
            e.kind_name(),
            kind.name()
        )),
        Ok(()) => h.fail(format!("{what}: the malformed kernel was accepted")),
    }
}

/// Malformed calls over an input `[4, 5]`: wrong shapes, dtypes, a bias gradient for RMS norm, a
/// broadcast gradient, and gradients that share memory with an input or with each other.
fn malformed(h: &Harness) {
    use ErrorKind::{InvalidArgument, ShapeMismatch};
    let Some(f) = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::NormBackward(NormKind::Layer), d) && h.supports(Op::NormBackward(NormKind::Rms), d))
    else {
        return;
    };
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let zeros = |dtype, len: usize| h.upload(dtype, &vec![0.0; len]);
    let (x, g, w, dx) = (zeros(f, 20), zeros(f, 20), zeros(f, 5), zeros(f, 20));
    let (dw, db, wide, long) = (zeros(f, 5), zeros(f, 5), zeros(other, 5), zeros(f, 6));
    let base = |kind| NormBackwardArgs {
        kind,
        input: x.contiguous(&[4, 5]),
        weight: Some(w.contiguous(&[5])),
        grad: g.contiguous(&[4, 5]),
        eps: 1e-5,
        grad_input: dx.contiguous(&[4, 5]),
        grad_weight: None,
        grad_bias: None,
    };
    let broadcast = {
        let mut arg = dw.contiguous(&[1]);
        arg.layout = arg.layout.broadcast_to(&[5]).expect("broadcastable");
        arg
    };
    let (gw, gb) = (Some(dw.contiguous(&[5])), Some(db.contiguous(&[5])));
    // (what, the error, the kind, the weight gradient, the bias gradient)
    let cases = [
        (
            "a bias gradient for RMS norm",
            InvalidArgument,
            NormKind::Rms,
            gw.clone(),
            gb.clone(),
        ),
        (
            "a weight gradient of 6 columns",
            ShapeMismatch,
            NormKind::Layer,
            Some(long.contiguous(&[6])),
            gb.clone(),
        ),
        (
            "a bias gradient of shape [1, 5]",
            ShapeMismatch,
            NormKind::Layer,
            gw.clone(),
            Some(db.contiguous(&[1, 5])),
        ),
        (
            "a weight gradient of another dtype",
            InvalidArgument,
            NormKind::Layer,
            Some(wide.contiguous(&[5])),
            None,
        ),
        (
            "a broadcast weight gradient",
            InvalidArgument,
            NormKind::Layer,
            Some(broadcast),
            None,
        ),
        (
            "a weight gradient in the weight's memory",
            InvalidArgument,
            NormKind::Layer,
            Some(w.contiguous(&[5])),
            None,
        ),
        (
            "a bias gradient in the input's memory",
            InvalidArgument,
            NormKind::Layer,
            None,
            Some(x.contiguous(&[5])),
        ),
        (
            "a weight gradient in the incoming gradient's memory",
            InvalidArgument,
            NormKind::Rms,
            Some(g.contiguous(&[5])),
            None,
        ),
        (
            "weight and bias gradients in one buffer",
            InvalidArgument,
            NormKind::Layer,
            gw.clone(),
            gw.clone(),
        ),
        (
            "a weight gradient inside the input gradient",
            InvalidArgument,
            NormKind::Layer,
            Some(dx.contiguous(&[5])),
            None,
        ),
    ];
    for (what, error, kind, grad_weight, grad_bias) in cases {
        let kernel = Kernel::NormBackward(Box::new(NormBackwardArgs {
            grad_weight,
            grad_bias,
            ..base(kind)
        }));
        refused(h, &format!("{}_backward {f}: {what}", kind.name()), &kernel, error);
    }
}
