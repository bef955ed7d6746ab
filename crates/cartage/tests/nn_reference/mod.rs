//! Host f64 references for the neural-network ops, written as naive loops: layer/RMS norm,
//! per-row cross-entropy and its reductions, conv2d, pooling and attention; plus the test
//! inputs and the comparison they share.

#![allow(dead_code)]

use cartage::{Conv2dOptions, Reduction};

pub fn norm_reference(x: &[f32], d: usize, w: Option<&[f32]>, b: Option<&[f32]>, eps: f64, rms: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / d as f64 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            let scale = w.map_or(1.0, |w| w[j] as f64);
            let shift = b.map_or(0.0, |b| b[j] as f64);
            out.push((v - mean) * inv * scale + shift);
        }
    }
    out
}

/// Per-row cross-entropy from logits [n, c]; `None` for an ignored row.
pub fn cross_entropy_reference(logits: &[f32], c: usize, target: &[i64], ignore: i64, s: f64) -> Vec<Option<f64>> {
    logits
        .chunks(c)
        .zip(target)
        .map(|(row, &t)| {
            if t == ignore {
                return None;
            }
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            let logp: Vec<f64> = row.iter().map(|&v| v as f64 - lse).collect();
            Some(-(1.0 - s) * logp[t as usize] - s / c as f64 * logp.iter().sum::<f64>())
        })
        .collect()
}

pub fn reduce_reference(rows: &[Option<f64>], reduction: Reduction) -> Vec<f64> {
    let kept: Vec<f64> = rows.iter().flatten().copied().collect();
    match reduction {
        Reduction::None => rows.iter().map(|r| r.unwrap_or(0.0)).collect(),
        Reduction::Sum => vec![kept.iter().sum()],
        Reduction::Mean => vec![kept.iter().sum::<f64>() / kept.len() as f64],
    }
}

/// Naive conv2d: input [n, c, h, w], weight [o, c/g, kh, kw], bias [o].
#[allow(clippy::too_many_arguments)]
pub fn conv_reference(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    wt: &[f32],
    [o, cg, kh, kw]: [usize; 4],
    bias: Option<&[f32]>,
    opts: Conv2dOptions,
) -> (Vec<f64>, [usize; 4]) {
    let g = opts.groups;
    let og = o / g;
    let oh = (h + 2 * opts.padding[0] - opts.dilation[0] * (kh - 1) - 1) / opts.stride[0] + 1;
    let ow = (w + 2 * opts.padding[1] - opts.dilation[1] * (kw - 1) - 1) / opts.stride[1] + 1;
    let mut out = vec![0.0; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let group = oc / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = bias.map_or(0.0, |bias| bias[oc] as f64);
                    for ci in 0..cg {
                        let ic = group * cg + ci;
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy =
                                    (y * opts.stride[0] + i * opts.dilation[0]) as isize - opts.padding[0] as isize;
                                let ix =
                                    (xx * opts.stride[1] + j * opts.dilation[1]) as isize - opts.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv = x[((b * c + ic) * h + iy as usize) * w + ix as usize] as f64;
                                let wv = wt[((oc * cg + ci) * kh + i) * kw + j] as f64;
                                acc += xv * wv;
                            }
                        }
                    }
                    out[((b * o + oc) * oh + y) * ow + xx] = acc;
                }
            }
        }
    }
    (out, [n, o, oh, ow])
}

#[derive(Clone, Copy, Debug)]
pub enum PoolRef {
    Max,
    Avg { count_include_pad: bool },
}

pub fn pool_reference(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    kind: PoolRef,
) -> (Vec<f64>, [usize; 4]) {
    let oh = (h + 2 * padding[0] - kernel[0]) / stride[0] + 1;
    let ow = (w + 2 * padding[1] - kernel[1]) / stride[1] + 1;
    let mut out = Vec::new();
    for plane in 0..n * c {
        for y in 0..oh {
            for xx in 0..ow {
                let (mut max, mut sum, mut inside) = (f64::NEG_INFINITY, 0.0, 0usize);
                for i in 0..kernel[0] {
                    for j in 0..kernel[1] {
                        let iy = (y * stride[0] + i) as isize - padding[0] as isize;
                        let ix = (xx * stride[1] + j) as isize - padding[1] as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let v = x[(plane * h + iy as usize) * w + ix as usize] as f64;
                        max = max.max(v);
                        sum += v;
                        inside += 1;
                    }
                }
                out.push(match kind {
                    PoolRef::Max => max,
                    PoolRef::Avg {
                        count_include_pad: true,
                    } => sum / (kernel[0] * kernel[1]) as f64,
                    PoolRef::Avg {
                        count_include_pad: false,
                    } => sum / inside as f64,
                });
            }
        }
    }
    (out, [n, c, oh, ow])
}

/// Reference attention on contiguous [b, l, e] × [b, s, e] × [b, s, ev] (batch already
/// broadcast); `mask(bi, i, j)` gives `None` to mask out or `Some(addend)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    [b, l, s, e, ev]: [usize; 5],
    scale: f64,
    mask: impl Fn(usize, usize, usize) -> Option<f64>,
) -> Vec<f64> {
    let mut out = vec![0.0; b * l * ev];
    for bi in 0..b {
        for i in 0..l {
            let scores: Vec<f64> = (0..s)
                .map(|j| {
                    let dot: f64 = (0..e)
                        .map(|d| q[(bi * l + i) * e + d] as f64 * k[(bi * s + j) * e + d] as f64)
                        .sum();
                    mask(bi, i, j).map_or(f64::NEG_INFINITY, |add| dot * scale + add)
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                // A row that sees no key gives 0, as PyTorch's attention does.
                continue;
            }
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..ev {
                out[(bi * l + i) * ev + d] = (0..s)
                    .map(|j| weights[j] / total * v[(bi * s + j) * ev + d] as f64)
                    .sum();
            }
        }
    }
    out
}

/// Deterministic values in [-1, 1) (an xorshift stream), as f32.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `got` (from the device) matches the f64 reference `want` within `tol` (relative to 1 + |want|).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            (g as f64 - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(ok, "{what}: element {i} is {g}, expected {w}");
    }
}

pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}
