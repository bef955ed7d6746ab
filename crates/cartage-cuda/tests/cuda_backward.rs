//! The fused backward kernels (softmax, log-softmax, layer norm and RMS norm with and without
//! their weight and bias gradients, cross-entropy) at every row length from 8 to 40000, in f32
//! and bf16, and the fused optimizer step on aligned and
//! unaligned parameters, against a float64 reference on the same rounded inputs: each length takes
//! a different path (register layouts of 1–4 vectors per thread and 2–512 threads per row, the
//! streaming kernels for rows too long to hold, the strided kernels for rows that are not whole
//! 16-byte vectors; a warp, 256 or 1024 threads per cross-entropy row), and each parameter the
//! vector or the element-wise loop.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use common::{arg, download, poisoned, round, upload, values};

use cartage_core::{AdamUpdate, Backend, DType, Kernel, Layout, NormBackwardArgs, NormKind, SgdUpdate, UpdateRule};

/// `cuda:0` with the fused backward kernels listed, or `None` after a SKIP line.
fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    let b = common::backend(test)?;
    if b.capabilities().supports(cartage_core::Op::SoftmaxBackward, DType::F32) {
        return Some(b);
    }
    panic!("cuda/{test}: the fused backward kernels are not listed on cuda:0, which builds them for every float dtype");
}

/// Largest error relative to the reference's scale, per element: |got - want| / (1 + |want|).
fn check(what: &str, got: &[f64], want: &[f64], dtype: DType) {
    common::check_within(what, got, want, if dtype == DType::BF16 { 2e-2 } else { 2e-5 });
}

/// Row lengths: small rows (a pair of lanes, one or two vectors each), powers of two up to
/// 32768 (held, then streamed), and lengths that are not whole vectors (strided).
const LENGTHS: [usize; 16] = [
    8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 100, 4097, 40000,
];

fn rows_for(cols: usize) -> usize {
    (1 << 17) / cols + 3
}

/// Softmax rows of random logits, rounded to `dtype` (as the forward would store them).
fn softmax_rows(x: &[f64], cols: usize, log: bool, dtype: DType) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(
            row.iter()
                .map(|v| round(if log { v - m - s.ln() } else { (v - m).exp() / s }, dtype)),
        );
    }
    out
}

#[test]
fn softmax_backward_at_every_row_length() {
    let Some(b) = backend("softmax_backward_at_every_row_length") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for cols in LENGTHS {
            let rows = rows_for(cols);
            let x = values(rows * cols, cols as u64, dtype);
            let g = values(rows * cols, cols as u64 + 1, dtype);
            let gb = upload(&b, &g, dtype);
            for log in [false, true] {
                let y = softmax_rows(&x, cols, log, dtype);
                let (yb, out) = (upload(&b, &y, dtype), poisoned(&b, rows * cols, dtype));
                Kernel::SoftmaxBackward {
                    output: arg(&yb, &[rows, cols], dtype),
                    grad: arg(&gb, &[rows, cols], dtype),
                    dim: 1,
                    log,
                    out: arg(&out, &[rows, cols], dtype),
                }
                .run(&[&yb, &gb, &out])
                .expect("softmax_backward");
                let mut want = Vec::with_capacity(y.len());
                for (yr, gr) in y.chunks(cols).zip(g.chunks(cols)) {
                    if log {
                        let total: f64 = gr.iter().sum();
                        want.extend(yr.iter().zip(gr).map(|(y, g)| g - y.exp() * total));
                    } else {
                        let inner: f64 = yr.iter().zip(gr).map(|(y, g)| y * g).sum();
                        want.extend(yr.iter().zip(gr).map(|(y, g)| y * (g - inner)));
                    }
                }
                let got = download(&out, rows * cols, dtype);
                check(
                    &format!("softmax_backward log={log} {dtype} cols {cols}"),
                    &got,
                    &want,
                    dtype,
                );
            }
        }
    }
}

/// The f64 reference of a norm's gradients over `rows` rows of `cols`: the input gradient, then
/// per column `Σ g·x̂`, `Σ g` and the root of the sum of squares of each (their scales).
struct NormReference {
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    dw_scale: Vec<f64>,
    db_scale: Vec<f64>,
}

fn norm_reference(kind: NormKind, x: &[f64], g: &[f64], w: Option<&[f64]>, cols: usize, eps: f64) -> NormReference {
    let mut dx = Vec::with_capacity(x.len());
    let (mut dw, mut db) = (vec![0.0; cols], vec![0.0; cols]);
    let (mut dw_scale, mut db_scale) = (vec![0.0; cols], vec![0.0; cols]);
    for (xr, gr) in x.chunks(cols).zip(g.chunks(cols)) {
        let n = cols as f64;
        let mean = match kind {
            NormKind::Layer => xr.iter().sum::<f64>() / n,
            NormKind::Rms => 0.0,
        };
        let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        let gh: Vec<f64> = (0..cols).map(|c| gr[c] * w.map_or(1.0, |w| w[c])).collect();
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean) * r).collect();
        let mean_g = match kind {
            NormKind::Layer => gh.iter().sum::<f64>() / n,
            NormKind::Rms => 0.0,
        };
        let mean_gx = gh.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        dx.extend((0..cols).map(|c| r * (gh[c] - mean_g - xhat[c] * mean_gx)));
        for c in 0..cols {
            dw[c] += gr[c] * xhat[c];
            db[c] += gr[c];
            dw_scale[c] += (gr[c] * xhat[c]).powi(2);
            db_scale[c] += gr[c] * gr[c];
        }
    }
    for s in dw_scale.iter_mut().chain(&mut db_scale) {
        *s = s.sqrt();
    }
    NormReference {
        dx,
        dw,
        db,
        dw_scale,
        db_scale,
    }
}

/// Column sums within `tol` relative to the scale of their terms: `|got - want| / (1 + scale)`
/// (a sum of thousands of terms that nearly cancel is still held to its terms' size).
fn check_sums(what: &str, got: &[f64], want: &[f64], scale: &[f64], dtype: DType) {
    let tol = if dtype == DType::BF16 { 2e-2 } else { 2e-5 };
    assert_eq!(got.len(), want.len());
    for (c, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (g - w).abs() / (1.0 + s.max(w.abs()));
        assert!(err <= tol, "{what}: column {c}: got {g}, want {w} (error {err:e})");
    }
}

/// The norms' backward at every row length, with and without a weight, with only the input
/// gradient (`norm_backward_*` kernels) and with the weight and bias gradients too
/// (`norm_grads_*`, then `norm_grads_reduce_*`).
#[test]
fn norm_backward_at_every_row_length() {
    let Some(b) = backend("norm_backward_at_every_row_length") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for cols in LENGTHS {
            let rows = rows_for(cols);
            // An offset mean, so that the variance is not E[x²].
            let x: Vec<f64> = values(rows * cols, cols as u64 + 7, dtype)
                .iter()
                .map(|v| round(v + 3.0, dtype))
                .collect();
            let g = values(rows * cols, cols as u64 + 8, dtype);
            let w = values(cols, 1, dtype);
            let (xb, gb, wb) = (upload(&b, &x, dtype), upload(&b, &g, dtype), upload(&b, &w, dtype));
            for kind in [NormKind::Layer, NormKind::Rms] {
                for weighted in [true, false] {
                    let eps = 1e-5;
                    let r = norm_reference(kind, &x, &g, weighted.then_some(w.as_slice()), cols, eps);
                    for grads in [false, true] {
                        let out = poisoned(&b, rows * cols, dtype);
                        let (dw, db) = (poisoned(&b, cols, dtype), poisoned(&b, cols, dtype));
                        let with_bias = grads && kind == NormKind::Layer;
                        Kernel::NormBackward(Box::new(NormBackwardArgs {
                            kind,
                            input: arg(&xb, &[rows, cols], dtype),
                            weight: weighted.then(|| arg(&wb, &[cols], dtype)),
                            grad: arg(&gb, &[rows, cols], dtype),
                            eps,
                            grad_input: arg(&out, &[rows, cols], dtype),
                            grad_weight: grads.then(|| arg(&dw, &[cols], dtype)),
                            grad_bias: with_bias.then(|| arg(&db, &[cols], dtype)),
                        }))
                        .run(&[&xb, &gb, &wb, &out, &dw, &db])
                        .expect("norm_backward");
                        let what = format!(
                            "{}_backward {dtype} cols {cols} weight {weighted} parameter gradients {grads}",
                            kind.name()
                        );
                        check(&what, &download(&out, rows * cols, dtype), &r.dx, dtype);
                        if grads {
                            let got = download(&dw, cols, dtype);
                            check_sums(&format!("{what}: weight gradient"), &got, &r.dw, &r.dw_scale, dtype);
                        }
                        if with_bias {
                            let got = download(&db, cols, dtype);
                            check_sums(&format!("{what}: bias gradient"), &got, &r.db, &r.db_scale, dtype);
                        }
                    }
                }
            }
        }
    }
}

/// The parameter gradients do not depend on timing: two runs give the same bits.
#[test]
fn norm_parameter_gradients_are_bitwise_repeatable() {
    let Some(b) = backend("norm_parameter_gradients_are_bitwise_repeatable") else {
        return;
    };
    let (rows, cols, dtype) = (8192, 1024, DType::F32);
    let x = values(rows * cols, 11, dtype);
    let g = values(rows * cols, 12, dtype);
    let (xb, gb) = (upload(&b, &x, dtype), upload(&b, &g, dtype));
    let run = || {
        let (out, dw, db) = (
            poisoned(&b, rows * cols, dtype),
            poisoned(&b, cols, dtype),
            poisoned(&b, cols, dtype),
        );
        Kernel::NormBackward(Box::new(NormBackwardArgs {
            kind: NormKind::Layer,
            input: arg(&xb, &[rows, cols], dtype),
            weight: None,
            grad: arg(&gb, &[rows, cols], dtype),
            eps: 1e-5,
            grad_input: arg(&out, &[rows, cols], dtype),
            grad_weight: Some(arg(&dw, &[cols], dtype)),
            grad_bias: Some(arg(&db, &[cols], dtype)),
        }))
        .run(&[&xb, &gb, &out, &dw, &db])
        .expect("norm_backward");
        (download(&dw, cols, dtype), download(&db, cols, dtype))
    };
    let first = run();
    for _ in 0..3 {
        let again = run();
        let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same(&first.0, &again.0) && same(&first.1, &again.1),
            "the sums changed between runs"
        );
    }
}

#[test]
fn cross_entropy_backward_at_every_row_length() {
    let Some(b) = backend("cross_entropy_backward_at_every_row_length") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for cols in LENGTHS {
            let rows = rows_for(cols);
            let x = values(rows * cols, cols as u64 + 3, dtype);
            let g = values(rows, cols as u64 + 4, dtype);
            // Every fifth row is ignored (-100); the others aim at a spread of classes.
            let targets: Vec<f64> = (0..rows)
                .map(|r| if r % 5 == 4 { -100.0 } else { ((r * 7919) % cols) as f64 })
                .collect();
            let (logits, target, grad) = (
                upload(&b, &x, dtype),
                upload(&b, &targets, DType::I64),
                upload(&b, &g, dtype),
            );
            for smoothing in [0.0, 0.1] {
                let out = poisoned(&b, rows * cols, dtype);
                Kernel::CrossEntropyBackward {
                    logits: arg(&logits, &[rows, cols], dtype),
                    target: arg(&target, &[rows], DType::I64),
                    grad: arg(&grad, &[rows], dtype),
                    ignore_index: -100,
                    label_smoothing: smoothing,
                    out: arg(&out, &[rows, cols], dtype),
                }
                .run(&[&logits, &target, &grad, &out])
                .expect("cross_entropy_backward");
                let mut want = Vec::with_capacity(x.len());
                for ((row, &t), &gr) in x.chunks(cols).zip(&targets).zip(&g) {
                    if t < 0.0 {
                        want.extend(std::iter::repeat_n(0.0, cols));
                        continue;
                    }
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    want.extend(row.iter().enumerate().map(|(c, v)| {
                        let hit = if c == t as usize { 1.0 - smoothing } else { 0.0 };
                        gr * ((v - m).exp() / s - hit - smoothing / cols as f64)
                    }));
                }
                let got = download(&out, rows * cols, dtype);
                check(
                    &format!("cross_entropy_backward {dtype} cols {cols} s {smoothing}"),
                    &got,
                    &want,
                    dtype,
                );
            }
        }
    }
}

/// One parameter's reference step in f64 (core's formulas); returns (param, first, second).
fn reference_step(rule: &UpdateRule, p: f64, g: f64, s0: f64, s1: f64, dtype: DType) -> (f64, f64, f64) {
    match rule {
        UpdateRule::Adam(adam) => {
            let c = adam.coefficients();
            let g = g + c.l2 * p;
            let m = s0 + c.one_minus_beta1 * (g - s0);
            let v = s1 + c.one_minus_beta2 * (g * g - s1);
            let p = p * c.decay - c.step_size * m / (v.sqrt() * c.inv_sqrt_bc2 + c.eps);
            (p, m, v)
        }
        UpdateRule::Sgd(sgd) => {
            let c = sgd.coefficients();
            let g = g + c.weight_decay * p;
            let b = if c.first_step {
                g
            } else {
                c.momentum * s0 + c.grad_scale * g
            };
            // The step reads the buffer as stored.
            let stored = round(b, dtype);
            let step = if c.nesterov { g + c.momentum * stored } else { stored };
            (p - c.lr * step, b, s1)
        }
    }
}

#[test]
fn update_on_aligned_and_unaligned_parameters() {
    let Some(b) = backend("update_on_aligned_and_unaligned_parameters") else {
        return;
    };
    let adam = AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
        step: 3,
    };
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 1e-3,
        nesterov: true,
        first_step: false,
    };
    let rules = [
        UpdateRule::Adam(adam),
        UpdateRule::Adam(AdamUpdate {
            decoupled: false,
            ..adam
        }),
        UpdateRule::Sgd(sgd),
        UpdateRule::Sgd(SgdUpdate {
            nesterov: false,
            dampening: 0.1,
            first_step: true,
            ..sgd
        }),
    ];
    // A whole number of vectors and one with a tail, each at element 0 (16-byte aligned: vector
    // loads) and at element 1 (not aligned: one element at a time).
    for dtype in [DType::F32, DType::BF16] {
        for rule in rules {
            for (n, offset) in [(1 << 16, 0), (4099, 0), (4099, 1)] {
                let len = n + offset;
                let p = values(len, 11, dtype);
                let g = values(len, 12, dtype);
                let s0 = values(len, 13, dtype);
                let s1: Vec<f64> = values(len, 14, dtype).iter().map(|v| v.abs()).collect();
                let bufs = [
                    upload(&b, &p, dtype),
                    upload(&b, &g, dtype),
                    upload(&b, &s0, dtype),
                    upload(&b, &s1, dtype),
                ];
                let layout = Layout::from_parts(&[n], &[1], offset).expect("layout");
                let view = |i: usize| bufs[i].arg(layout.clone(), dtype);
                let state = match rule {
                    UpdateRule::Adam(_) => [Some(view(2)), Some(view(3))],
                    UpdateRule::Sgd(_) => [Some(view(2)), None],
                };
                Kernel::Update {
                    rule,
                    grad: view(1),
                    state,
                    param: view(0),
                }
                .run(&[&bufs[0], &bufs[1], &bufs[2], &bufs[3]])
                .expect("update");
                let got: Vec<Vec<f64>> = bufs.iter().map(|buf| download(buf, len, dtype)).collect();
                let mut want = [p.clone(), g.clone(), s0.clone(), s1.clone()];
                for i in offset..len {
                    let (np, n0, n1) = reference_step(&rule, p[i], g[i], s0[i], s1[i], dtype);
                    (want[0][i], want[2][i], want[3][i]) = (np, n0, n1);
                }
                for (k, name) in [(0, "param"), (1, "grad"), (2, "first state"), (3, "second state")] {
                    check(
                        &format!("{rule:?} {dtype} n {n} offset {offset}: {name}"),
                        &got[k],
                        &want[k],
                        dtype,
                    );
                }
            }
        }
    }
}
