//! The row-wise kernels (softmax, log-softmax, layer norm, RMS norm, cross-entropy) at every row
//! length from 64 to 32768 and at lengths that are not whole 16-byte vectors, in f32 and bf16,
//! against a float64 reference: each length takes a different register layout (a warp per row,
//! blocks of 128–1024 threads, 1–8 vectors per thread) or the strided kernels.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use common::{arg, backend, download, poisoned, round, upload, values};

use cartage_core::{DType, Kernel, NormKind};

/// Largest error relative to the reference's scale, per element: |got - want| / (1 + |want|).
fn check(what: &str, got: &[f64], want: &[f64], dtype: DType) {
    common::check_within(what, got, want, if dtype == DType::BF16 { 2e-2 } else { 1e-5 });
}

/// Row lengths: every power of two from 64 to 32768, and lengths that are not whole vectors.
const LENGTHS: [usize; 13] = [
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 100, 4097, 40000,
];

fn rows_for(cols: usize) -> usize {
    (1 << 18) / cols + 3
}

#[test]
fn softmax_and_log_softmax_at_every_row_length() {
    let Some(b) = backend("softmax_and_log_softmax_at_every_row_length") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for cols in LENGTHS {
            let rows = rows_for(cols);
            let x = values(rows * cols, cols as u64, dtype);
            let input = upload(&b, &x, dtype);
            for log in [false, true] {
                let out = poisoned(&b, rows * cols, dtype);
                Kernel::Softmax {
                    input: arg(&input, &[rows, cols], dtype),
                    dim: 1,
                    log,
                    causal: false,
                    out: arg(&out, &[rows, cols], dtype),
                }
                .run(&[&input, &out])
                .expect("softmax");
                let mut want = Vec::with_capacity(x.len());
                for row in x.chunks(cols) {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    want.extend(row.iter().map(|v| if log { v - m - s.ln() } else { (v - m).exp() / s }));
                }
                let want: Vec<f64> = want.iter().map(|&v| round(v, dtype)).collect();
                let got = download(&out, rows * cols, dtype);
                check(&format!("softmax log={log} {dtype} cols {cols}"), &got, &want, dtype);
            }
        }
    }
}

#[test]
fn layer_and_rms_norm_at_every_row_length() {
    let Some(b) = backend("layer_and_rms_norm_at_every_row_length") else {
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
            let w = values(cols, 1, dtype);
            let bias = values(cols, 2, dtype);
            let (input, wb, bb) = (upload(&b, &x, dtype), upload(&b, &w, dtype), upload(&b, &bias, dtype));
            for kind in [NormKind::Layer, NormKind::Rms] {
                let out = poisoned(&b, rows * cols, dtype);
                let eps = 1e-5;
                Kernel::Norm {
                    kind,
                    input: arg(&input, &[rows, cols], dtype),
                    weight: Some(arg(&wb, &[cols], dtype)),
                    bias: (kind == NormKind::Layer).then(|| arg(&bb, &[cols], dtype)),
                    eps,
                    out: arg(&out, &[rows, cols], dtype),
                }
                .run(&[&input, &wb, &bb, &out])
                .expect("norm");
                let mut want = Vec::with_capacity(x.len());
                for row in x.chunks(cols) {
                    let n = cols as f64;
                    let (mean, shift) = match kind {
                        NormKind::Layer => (row.iter().sum::<f64>() / n, 1.0),
                        NormKind::Rms => (0.0, 0.0),
                    };
                    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
                    let r = 1.0 / (var + eps).sqrt();
                    want.extend(
                        row.iter()
                            .enumerate()
                            .map(|(c, v)| round((v - mean) * r * w[c] + shift * bias[c], dtype)),
                    );
                }
                let got = download(&out, rows * cols, dtype);
                check(&format!("{} {dtype} cols {cols}", kind.name()), &got, &want, dtype);
            }
        }
    }
}

#[test]
fn cross_entropy_at_every_row_length() {
    let Some(b) = backend("cross_entropy_at_every_row_length") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for cols in LENGTHS {
            let rows = rows_for(cols);
            let x = values(rows * cols, cols as u64 + 3, dtype);
            // Every fifth row is ignored (-100); the others aim at a spread of classes.
            let targets: Vec<f64> = (0..rows)
                .map(|r| if r % 5 == 4 { -100.0 } else { ((r * 7919) % cols) as f64 })
                .collect();
            let (logits, target) = (upload(&b, &x, dtype), upload(&b, &targets, DType::I64));
            for smoothing in [0.0, 0.1] {
                let out = poisoned(&b, rows, dtype);
                Kernel::CrossEntropy {
                    logits: arg(&logits, &[rows, cols], dtype),
                    target: arg(&target, &[rows], DType::I64),
                    ignore_index: -100,
                    label_smoothing: smoothing,
                    out: arg(&out, &[rows], dtype),
                }
                .run(&[&logits, &target, &out])
                .expect("cross_entropy");
                let want: Vec<f64> = x
                    .chunks(cols)
                    .zip(&targets)
                    .map(|(row, &t)| {
                        if t < 0.0 {
                            return 0.0;
                        }
                        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                        let mean_logp = row.iter().map(|v| v - lse).sum::<f64>() / cols as f64;
                        round(
                            -(1.0 - smoothing) * (row[t as usize] - lse) - smoothing * mean_logp,
                            dtype,
                        )
                    })
                    .collect();
                let got = download(&out, rows, dtype);
                check(
                    &format!("cross_entropy {dtype} cols {cols} s {smoothing}"),
                    &got,
                    &want,
                    dtype,
                );
            }
        }
    }
}
