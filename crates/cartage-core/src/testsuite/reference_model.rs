//! The f64 host reference of the model kernels (`Scan`, `Sort`, `Scatter`, `Norm`,
//! `CrossEntropy`), following the semantics in `kernel.rs`: each function takes row-major
//! logical values (already rounded to their dtype) and returns the exact expected values with,
//! for float results, the allowed error of each element.

use std::cmp::Ordering;

use crate::dtype::DType;
use crate::kernel::{NormKind, ScanOp, ScatterMode};

use super::reference::{Tolerance, accumulation_eps, strides_of, unravel, wrap_int};

/// The element offsets (row-major positions) of every line along `dim` of `shape`, line by line.
pub fn lines(shape: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let size = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            out.push((0..size).map(|k| (o * size + k) * inner + i).collect());
        }
    }
    out
}

/// Inclusive scan of `values` (row-major, `shape`) along `dim`, with the allowed error of each
/// element: integers wrap exactly; float sums are allowed `accumulation_eps · sqrt(k) · ‖prefix‖₂`
/// and products `accumulation_eps · k · |prefix product|` after `k` terms, on top of `dtype`'s
/// rounding.
pub fn scan(op: ScanOp, dtype: DType, shape: &[usize], values: &[f64], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let mut want = vec![0.0; values.len()];
    let mut allowed = vec![0.0; values.len()];
    if values.is_empty() {
        return (want, allowed);
    }
    let eps = accumulation_eps(dtype);
    for line in lines(shape, dim) {
        let (mut acc_int, mut acc, mut squares) = (
            match op {
                ScanOp::Sum => 0i64,
                ScanOp::Prod => 1i64,
            },
            match op {
                ScanOp::Sum => 0.0,
                ScanOp::Prod => 1.0,
            },
            0.0,
        );
        for (k, &at) in line.iter().enumerate() {
            let x = values[at];
            if dtype.is_float() {
                acc = match op {
                    ScanOp::Sum => acc + x,
                    ScanOp::Prod => acc * x,
                };
                squares += x * x;
                let n = (k + 1) as f64;
                let extra = match op {
                    ScanOp::Sum => eps * n.sqrt() * squares.sqrt(),
                    ScanOp::Prod => eps * n * acc.abs(),
                };
                want[at] = acc;
                allowed[at] = Tolerance::of(dtype).allowed(acc) + extra;
            } else {
                acc_int = wrap_int(
                    dtype,
                    match op {
                        ScanOp::Sum => acc_int.wrapping_add(x as i64),
                        ScanOp::Prod => acc_int.wrapping_mul(x as i64),
                    },
                );
                want[at] = acc_int as f64;
            }
        }
    }
    (want, allowed)
}

/// The order of sort keys: NaN above everything (+inf included), NaNs equal to each other.
pub fn sort_order(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).expect("neither is NaN"),
    }
}

/// Stable sort of `values` (row-major, `shape`) along `dim`: the sorted values and the positions
/// along `dim` they came from (equal keys keep their input order in both directions).
pub fn sort(shape: &[usize], values: &[f64], dim: usize, descending: bool) -> (Vec<f64>, Vec<f64>) {
    let mut sorted = vec![0.0; values.len()];
    let mut indices = vec![0.0; values.len()];
    if values.is_empty() {
        return (sorted, indices);
    }
    for line in lines(shape, dim) {
        let mut order: Vec<usize> = (0..line.len()).collect();
        // `sort_by` is stable; comparing (b, a) for descending keeps equal keys in input order.
        if descending {
            order.sort_by(|&i, &j| sort_order(values[line[j]], values[line[i]]));
        } else {
            order.sort_by(|&i, &j| sort_order(values[line[i]], values[line[j]]));
        }
        for (k, &from) in order.iter().enumerate() {
            sorted[line[k]] = values[line[from]];
            indices[line[k]] = from as f64;
        }
    }
    (sorted, indices)
}

/// `Scatter` into `out` (row-major values of `out_shape`, the destination's contents before the
/// launch) from `src` (row-major, `src_shape`) at `index` (row-major, `index_shape`) along `dim`.
/// Returns the expected destination and the allowed error of each element: exact for `Assign`
/// (the suite gives it no duplicate targets) and for integers (which wrap); for float `Add`,
/// `count · rel · max|term|` for `count` contributions, as each add may round once.
#[allow(clippy::too_many_arguments)]
pub fn scatter(
    mode: ScatterMode,
    dtype: DType,
    out_shape: &[usize],
    out: &[f64],
    src_shape: &[usize],
    src: &[f64],
    index_shape: &[usize],
    index: &[f64],
    dim: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut want = out.to_vec();
    let mut count = vec![0usize; out.len()];
    let mut largest: Vec<f64> = out.iter().map(|x| x.abs()).collect();
    let (out_strides, src_strides) = (strides_of(out_shape), strides_of(src_shape));
    for (linear, &target) in index.iter().enumerate() {
        let mut at = unravel(linear, index_shape);
        let from: usize = at.iter().zip(&src_strides).map(|(i, s)| i * s).sum();
        at[dim] = target as usize;
        let to: usize = at.iter().zip(&out_strides).map(|(i, s)| i * s).sum();
        let x = src[from];
        want[to] = match mode {
            ScatterMode::Assign => x,
            ScatterMode::Add if dtype.is_float() => want[to] + x,
            ScatterMode::Add => wrap_int(dtype, (want[to] as i64).wrapping_add(x as i64)) as f64,
        };
        count[to] += 1;
        largest[to] = largest[to].max(want[to].abs()).max(x.abs());
    }
    let tol = Tolerance::of(dtype);
    let allowed = (0..out.len())
        .map(|i| match mode {
            ScatterMode::Add if dtype.is_float() => {
                tol.allowed(want[i]) + count[i] as f64 * (tol.rel + accumulation_eps(dtype)) * largest[i]
            }
            _ => 0.0,
        })
        .collect();
    (want, allowed)
}

/// Layer or RMS norm of `values` (row-major, `shape`) over the last dim with optional `weight`
/// and `bias` (logical values of length `shape.last()`), and the allowed error of each element:
/// `dtype`'s transcendental tolerance plus `4 · accumulation_eps · sqrt(n) · (|x̂| + 1) · |w|`
/// for the row statistics (`x̂` the normalised value, `w` the weight or 1).
pub fn norm(
    kind: NormKind,
    dtype: DType,
    shape: &[usize],
    values: &[f64],
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    let n = *shape.last().expect("norm inputs have rank ≥ 1");
    let mut want = vec![0.0; values.len()];
    let mut allowed = vec![0.0; values.len()];
    if values.is_empty() {
        return (want, allowed);
    }
    let tol = Tolerance::transcendental(dtype);
    let stats = 4.0 * accumulation_eps(dtype) * (n as f64).sqrt();
    for (r, row) in values.chunks(n).enumerate() {
        let (shift, scale) = match kind {
            NormKind::Layer => {
                let mean = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
                (mean, 1.0 / (var + eps).sqrt())
            }
            NormKind::Rms => {
                let mean_square = row.iter().map(|x| x * x).sum::<f64>() / n as f64;
                (0.0, 1.0 / (mean_square + eps).sqrt())
            }
        };
        for (j, &x) in row.iter().enumerate() {
            let normalised = (x - shift) * scale;
            let w = weight.map_or(1.0, |w| w[j]);
            let y = normalised * w + bias.map_or(0.0, |b| b[j]);
            want[r * n + j] = y;
            allowed[r * n + j] = tol.allowed(y) + stats * (normalised.abs() + 1.0) * w.abs();
        }
    }
    (want, allowed)
}

/// Per-row cross-entropy of `logits` (row-major `[rows, classes]`) against `target`, with
/// `ignore_index` rows giving 0 and label smoothing `smoothing`, and the allowed error of each
/// row. Targets must be valid classes or `ignore_index` (the suite tests others separately).
pub fn cross_entropy(
    dtype: DType,
    logits: &[f64],
    classes: usize,
    target: &[f64],
    ignore_index: i64,
    smoothing: f64,
) -> (Vec<f64>, Vec<f64>) {
    let tol = Tolerance::transcendental(dtype);
    let acc = 8.0 * accumulation_eps(dtype) * (classes as f64).sqrt();
    let mut want = Vec::with_capacity(target.len());
    let mut allowed = Vec::with_capacity(target.len());
    for (r, &t) in target.iter().enumerate() {
        if t as i64 == ignore_index {
            want.push(0.0);
            allowed.push(0.0);
            continue;
        }
        let row = &logits[r * classes..(r + 1) * classes];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let logp = |x: f64| x - lse;
        let mean_logp = row.iter().map(|&x| logp(x)).sum::<f64>() / classes as f64;
        let mean_abs = row.iter().map(|&x| logp(x).abs()).sum::<f64>() / classes as f64;
        let loss = -(1.0 - smoothing) * logp(row[t as usize]) - smoothing * mean_logp;
        want.push(loss);
        allowed.push(tol.allowed(loss) + acc * (1.0 + loss.abs() + mean_abs + (lse - m).abs()));
    }
    (want, allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_wrap_and_accumulate_along_the_dim() {
        let (want, _) = scan(ScanOp::Sum, DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 1);
        assert_eq!(want, [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
        let (want, _) = scan(ScanOp::Sum, DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0);
        assert_eq!(want, [1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
        let (want, _) = scan(ScanOp::Prod, DType::U8, &[3], &[16.0, 16.0, 3.0], 0);
        assert_eq!(want, [16.0, 0.0, 0.0]);
        let (want, _) = scan(ScanOp::Sum, DType::I32, &[2], &[i32::MAX as f64, 1.0], 0);
        assert_eq!(want, [i32::MAX as f64, i32::MIN as f64]);
    }

    #[test]
    fn sort_is_stable_with_nan_last_ascending_and_first_descending() {
        let nan = f64::NAN;
        let values = [2.0, nan, 1.0, 2.0, f64::INFINITY, nan, 1.0];
        let (v, i) = sort(&[7], &values, 0, false);
        assert_eq!(i, [2.0, 6.0, 0.0, 3.0, 4.0, 1.0, 5.0]);
        assert_eq!(&v[..5], &[1.0, 1.0, 2.0, 2.0, f64::INFINITY]);
        assert!(v[5].is_nan() && v[6].is_nan());
        let (_, i) = sort(&[7], &values, 0, true);
        assert_eq!(i, [1.0, 5.0, 4.0, 0.0, 3.0, 2.0, 6.0]);
        // Along dim 0 of a [2, 2].
        let (v, i) = sort(&[2, 2], &[3.0, 1.0, 2.0, 1.0], 0, false);
        assert_eq!((v, i), (vec![2.0, 1.0, 3.0, 1.0], vec![1.0, 0.0, 0.0, 1.0]));
    }

    #[test]
    fn scatter_assigns_and_adds() {
        // out [2, 3], dim 1, index [2, 2], src [2, 2].
        let out = [0.0; 6];
        let src = [1.0, 2.0, 3.0, 4.0];
        let index = [2.0, 0.0, 1.0, 1.0];
        let (want, _) = scatter(
            ScatterMode::Add,
            DType::F32,
            &[2, 3],
            &out,
            &[2, 2],
            &src,
            &[2, 2],
            &index,
            1,
        );
        assert_eq!(want, [2.0, 0.0, 1.0, 0.0, 7.0, 0.0]);
        let index = [2.0, 0.0, 1.0, 0.0];
        let (want, _) = scatter(
            ScatterMode::Assign,
            DType::I32,
            &[2, 3],
            &out,
            &[2, 2],
            &src,
            &[2, 2],
            &index,
            1,
        );
        assert_eq!(want, [2.0, 0.0, 1.0, 4.0, 3.0, 0.0]);
    }

    #[test]
    fn norms_and_cross_entropy() {
        let (want, _) = norm(NormKind::Layer, DType::F64, &[1, 2], &[1.0, 3.0], None, None, 0.0);
        assert_eq!(want, [-1.0, 1.0]);
        let (want, _) = norm(
            NormKind::Layer,
            DType::F64,
            &[1, 2],
            &[1.0, 3.0],
            Some(&[2.0, 3.0]),
            Some(&[0.5, 0.5]),
            0.0,
        );
        assert_eq!(want, [-1.5, 3.5]);
        let (want, _) = norm(NormKind::Rms, DType::F64, &[1, 2], &[3.0, 4.0], None, None, 0.0);
        let r = (12.5f64).sqrt();
        assert_eq!(want, [3.0 / r, 4.0 / r]);
        // Uniform logits: -log(1/C) whatever the smoothing; the ignored row is 0.
        let (want, _) = cross_entropy(DType::F64, &[0.0; 8], 4, &[1.0, -100.0], -100, 0.1);
        assert!((want[0] - 4f64.ln()).abs() < 1e-12 && want[1] == 0.0, "{want:?}");
        let (want, _) = cross_entropy(DType::F64, &[0.0, 2f64.ln()], 2, &[1.0], -100, 0.0);
        assert!((want[0] - (1.5f64).ln()).abs() < 1e-12, "{want:?}");
    }
}
