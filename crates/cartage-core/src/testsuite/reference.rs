//! The f64 host reference: every kernel's semantics from `kernel.rs`, computed in f64 on inputs
//! already rounded to their dtype, and the per-dtype tolerances results are compared with.
//!
//! Float results are returned unrounded; [`close`] accepts a backend's value when it equals the
//! reference rounded to the dtype (which also covers overflow to infinity) or lies within the
//! tolerance. Integer results are exact: the reference wraps them the way the kernel must.

use crate::dtype::DType;
use crate::kernel::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

/// An allowed error `abs + rel · |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative part.
    pub rel: f64,
    /// Absolute part.
    pub abs: f64,
}

impl Tolerance {
    /// No error at all (integers, bools, and float ops that only move or compare values).
    pub const EXACT: Tolerance = Tolerance { rel: 0.0, abs: 0.0 };

    /// Basic arithmetic (add, mul, div, casts between floats): a rounding or two of `dtype`.
    pub const fn of(dtype: DType) -> Tolerance {
        match dtype {
            DType::F64 => Tolerance { rel: 1e-12, abs: 1e-12 },
            DType::F32 => Tolerance { rel: 1e-5, abs: 1e-6 },
            DType::F16 => Tolerance { rel: 1e-3, abs: 1e-4 },
            DType::BF16 => Tolerance { rel: 1e-2, abs: 1e-3 },
            _ => Tolerance::EXACT,
        }
    }

    /// Transcendental functions (exp, log, tanh, erf, pow…): f32 and f64 a little looser, as GPU
    /// math libraries are allowed a few ulps.
    pub const fn transcendental(dtype: DType) -> Tolerance {
        match dtype {
            DType::F64 => Tolerance { rel: 1e-11, abs: 1e-12 },
            DType::F32 => Tolerance { rel: 5e-5, abs: 5e-6 },
            other => Tolerance::of(other),
        }
    }

    /// The allowed error for a reference value `want`.
    pub fn allowed(&self, want: f64) -> f64 {
        self.abs + self.rel * want.abs()
    }
}

/// Relative error of one accumulation step in the precision `dtype` is computed in (f32 for f16
/// and bf16, which accumulate in f32), with room for a few ulps; sums of `n` terms are allowed
/// `accumulation_eps · sqrt(n) · ‖terms‖₂`.
pub const fn accumulation_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-14,
        DType::F32 => 1e-6,
        _ => 4e-6,
    }
}

/// True when a backend's `got` is acceptable for the reference `want` with allowance `allowed`.
pub fn close(dtype: DType, got: f64, want: f64, allowed: f64) -> bool {
    if dtype == DType::Bool {
        return (got == 0.0 || got == 1.0) && got == (want != 0.0) as u8 as f64;
    }
    if want.is_nan() {
        return got.is_nan();
    }
    if got == dtype.round_trip(want) {
        return true;
    }
    got.is_finite() && (got - want).abs() <= allowed
}

/// `v` stored as `dtype` the way integer arithmetic stores it: wrapping for integers (`v` must be
/// integral and exact in f64), rounding for floats, `!= 0` for bool.
pub fn wrap(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::I32 => v as i64 as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::U8 => v as i64 as u8 as f64,
        other => other.round_trip(v),
    }
}

/// The exact 64-bit result `v` of integer arithmetic stored as the integer `dtype`: its low
/// bits, two's complement (wrapping happens before any conversion to f64, which would lose them).
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        _ => v,
    }
}

/// NaN-propagating maximum (PyTorch's `maximum`, not IEEE `fmax`).
pub fn maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

/// NaN-propagating minimum (PyTorch's `minimum`, not IEEE `fmin`).
pub fn minimum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
}

/// The error function (for exact GELU).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// A unary op on one value of `dtype`.
pub fn unary(op: UnaryOp, dtype: DType, x: f64) -> f64 {
    if !dtype.is_float() {
        let v = match op {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Sign => x.signum() * if x == 0.0 { 0.0 } else { 1.0 },
            UnaryOp::Square => return wrap_int(dtype, (x as i64).wrapping_mul(x as i64)) as f64,
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => x,
            other => panic!("suite bug: {} on integers", other.name()),
        };
        return wrap(dtype, v);
    }
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Gelu => x * 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Sign => {
            if x.is_nan() || x == 0.0 {
                x
            } else {
                x.signum()
            }
        }
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        UnaryOp::Erf => erf(x),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Softplus => {
            if x > 20.0 {
                x
            } else {
                x.exp().ln_1p()
            }
        }
    }
}

/// Integer power with the kernel's rules, in 64-bit two's complement (store the result with
/// [`wrap_int`]: the low bits of a wrapping product are those of the narrower product, so this
/// is the dtype's own wrapping power for bases and exponents of i32 and u8 too). An exponent
/// ≥ 0 gives `base.wrapping_pow(exp)` — every exponent, not only those below 2^32; a negative
/// exponent gives 0 unless the base is 1 (1) or −1 (±1).
pub fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    // exp = high · 2^32 + low, and base^(2^32) = base^(2^32 - 1) · base.
    let (high, low) = ((exp >> 32) as u32, exp as u32);
    let base_2_32 = base.wrapping_pow(u32::MAX).wrapping_mul(base);
    base_2_32.wrapping_pow(high).wrapping_mul(base.wrapping_pow(low))
}

/// A binary op on two values of `dtype`.
pub fn binary(op: BinaryOp, dtype: DType, a: f64, b: f64) -> f64 {
    if dtype == DType::Bool {
        return match op {
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            other => panic!("suite bug: {} on bool", other.name()),
        };
    }
    if !dtype.is_float() {
        let (x, y) = (a as i64, b as i64);
        let v = match op {
            BinaryOp::Add => x.wrapping_add(y),
            BinaryOp::Sub => x.wrapping_sub(y),
            BinaryOp::Mul => x.wrapping_mul(y),
            BinaryOp::Div if y == 0 => 0,
            BinaryOp::Div => x.wrapping_div(y),
            BinaryOp::Pow => int_pow(x, y),
            BinaryOp::Maximum => x.max(y),
            BinaryOp::Minimum => x.min(y),
        };
        return wrap_int(dtype, v) as f64;
    }
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => maximum(a, b),
        BinaryOp::Minimum => minimum(a, b),
    }
}

/// A comparison, as 0 or 1.
pub fn compare(op: CompareOp, a: f64, b: f64) -> f64 {
    let r = match op {
        CompareOp::Eq => a == b,
        CompareOp::Ne => a != b,
        CompareOp::Lt => a < b,
        CompareOp::Le => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::Ge => a >= b,
    };
    r as u8 as f64
}

/// A cast from `src` to `dst` with Rust `as` semantics: float→int truncates and saturates (NaN →
/// 0), int→int wraps, anything→bool is `!= 0`, bool→number is 0 or 1. Float targets are returned
/// unrounded.
pub fn cast(src: DType, dst: DType, v: f64) -> f64 {
    match dst {
        DType::Bool => (v != 0.0) as u8 as f64,
        d if d.is_float() => v,
        d if src.is_float() => d.round_trip(v),
        d => wrap(d, v),
    }
}

/// Row-major strides of `shape` (plain, for index arithmetic).
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// The multi-index of row-major position `linear` in `shape`.
pub fn unravel(mut linear: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        if shape[i] > 0 {
            index[i] = linear % shape[i];
            linear /= shape[i];
        }
    }
    index
}

/// Output shape of a reduction: the input shape with reduced dimensions set to 1.
pub fn reduced_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
        .collect()
}

/// The elements of each output position of a reduction, in input order.
fn reduction_groups(shape: &[usize], values: &[f64], dims: &[usize]) -> Vec<Vec<f64>> {
    let out_shape = reduced_shape(shape, dims);
    // The step in the output for a step along each input dimension (0 along reduced ones).
    let steps: Vec<usize> = strides_of(&out_shape)
        .iter()
        .enumerate()
        .map(|(d, &s)| if dims.contains(&d) { 0 } else { s })
        .collect();
    let per_group: usize = dims.iter().map(|&d| shape[d]).product();
    let suffix = dims.iter().enumerate().all(|(i, &d)| d == shape.len() - dims.len() + i);
    if suffix && per_group > 0 {
        // The reduced dimensions are the innermost ones: each group is one run.
        return values.chunks(per_group).map(<[f64]>::to_vec).collect();
    }
    let mut groups = vec![Vec::new(); out_shape.iter().product()];
    let (mut index, mut out) = (vec![0usize; shape.len()], 0usize);
    for &v in values {
        groups[out].push(v);
        // Advance the row-major multi-index like an odometer, keeping `out` in step.
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            out += steps[d];
            if index[d] < shape[d] {
                break;
            }
            out -= steps[d] * index[d];
            index[d] = 0;
        }
    }
    groups
}

/// A reduction of `values` (row-major, `shape`) over `dims`, with the allowed error of each
/// output element for an input of `dtype`.
pub fn reduce(op: ReduceOp, dtype: DType, shape: &[usize], values: &[f64], dims: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let groups = reduction_groups(shape, values, dims);
    let out_tol = match op {
        ReduceOp::LogSumExp => Tolerance::transcendental(dtype),
        _ => Tolerance::of(dtype),
    };
    let mut want = Vec::with_capacity(groups.len());
    let mut allowed = Vec::with_capacity(groups.len());
    for g in &groups {
        let n = g.len() as f64;
        let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        let accumulated = accumulation_eps(dtype) * n.sqrt() * norm;
        let (w, extra) = match op {
            ReduceOp::Sum => (wrap(dtype, g.iter().sum()), accumulated),
            ReduceOp::Mean => (g.iter().sum::<f64>() / n, accumulated / n.max(1.0)),
            ReduceOp::Max => (extreme(g, |a, b| a > b), 0.0),
            ReduceOp::Min => (extreme(g, |a, b| a < b), 0.0),
            ReduceOp::ArgMax => (arg_extreme(g, |a, b| a > b), 0.0),
            ReduceOp::ArgMin => (arg_extreme(g, |a, b| a < b), 0.0),
            ReduceOp::Prod if !dtype.is_float() => (
                wrap_int(dtype, g.iter().fold(1i64, |p, &x| p.wrapping_mul(x as i64))) as f64,
                0.0,
            ),
            ReduceOp::Prod => {
                let p: f64 = g.iter().product();
                (p, accumulation_eps(dtype) * n * p.abs())
            }
            ReduceOp::LogSumExp => {
                let m = extreme(g, |a, b| a > b);
                let s: f64 = g.iter().map(|x| (x - m).exp()).sum();
                (m + s.ln(), accumulation_eps(dtype) * n.sqrt() * 4.0)
            }
        };
        let tol = if dtype.is_float() && !matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            out_tol.allowed(w) + extra
        } else {
            0.0
        };
        want.push(w);
        allowed.push(tol);
    }
    (want, allowed)
}

/// Max or min with NaN propagation (`better(a, b)`: a replaces b).
fn extreme(g: &[f64], better: impl Fn(f64, f64) -> bool) -> f64 {
    let mut best = f64::NAN;
    for (i, &x) in g.iter().enumerate() {
        if x.is_nan() {
            return f64::NAN;
        }
        if i == 0 || better(x, best) {
            best = x;
        }
    }
    best
}

/// The index of the first extreme element; NaN counts as the extreme, so the first NaN wins
/// (PyTorch's argmax/argmin).
fn arg_extreme(g: &[f64], better: impl Fn(f64, f64) -> bool) -> f64 {
    if let Some(first_nan) = g.iter().position(|x| x.is_nan()) {
        return first_nan as f64;
    }
    let mut best = 0;
    for (i, &x) in g.iter().enumerate() {
        if better(x, g[best]) {
            best = i;
        }
    }
    best as f64
}

/// Softmax (or log-softmax) of `values` (row-major, `shape`) along `dim`, max-subtracted.
pub fn softmax(shape: &[usize], values: &[f64], dim: usize, log: bool) -> Vec<f64> {
    let size = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![0.0; values.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * size * inner + k * inner + i;
            let m = (0..size).map(|k| values[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..size).map(|k| (values[at(k)] - m).exp()).sum();
            for k in 0..size {
                let x = values[at(k)] - m;
                out[at(k)] = if log { x - s.ln() } else { x.exp() / s };
            }
        }
    }
    out
}

/// Batched matrix product of row-major `[b, m, k]` and `[b, k, n]` values, with the allowed error
/// of each output element: `accumulation_eps · sqrt(k) · ‖products‖₂` on top of `dtype`'s
/// rounding.
pub fn matmul(dtype: DType, lhs: &[f64], rhs: &[f64], [b, m, k, n]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let mut want = vec![0.0; b * m * n];
    let mut allowed = vec![0.0; b * m * n];
    for batch in 0..b {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut squares) = (0.0, 0.0);
                for p in 0..k {
                    let prod = lhs[(batch * m + i) * k + p] * rhs[(batch * k + p) * n + j];
                    sum += prod;
                    squares += prod * prod;
                }
                let at = (batch * m + i) * n + j;
                want[at] = sum;
                allowed[at] = Tolerance::of(dtype).allowed(sum)
                    + 4.0 * accumulation_eps(dtype) * (k as f64).sqrt() * squares.sqrt();
            }
        }
    }
    (want, allowed)
}

/// torch.gather: `out[i] = input[i with i[dim] = index[i]]`; `out` is shaped like `index`.
pub fn gather(input_shape: &[usize], input: &[f64], index_shape: &[usize], index: &[f64], dim: usize) -> Vec<f64> {
    let strides = strides_of(input_shape);
    (0..index.len())
        .map(|linear| {
            let mut at = unravel(linear, index_shape);
            at[dim] = index[linear] as usize;
            input[at.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]
        })
        .collect()
}

/// index_select: entries of `input` along `dim` chosen by the 1-D `index`.
pub fn index_select(input_shape: &[usize], input: &[f64], index: &[f64], dim: usize) -> (Vec<usize>, Vec<f64>) {
    let mut out_shape = input_shape.to_vec();
    out_shape[dim] = index.len();
    let strides = strides_of(input_shape);
    let values = (0..out_shape.iter().product())
        .map(|linear| {
            let mut at = unravel(linear, &out_shape);
            at[dim] = index[at[dim]] as usize;
            input[at.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]
        })
        .collect();
    (out_shape, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics_follow_kernel_docs() {
        assert_eq!(binary(BinaryOp::Div, DType::I32, -7.0, 2.0), -3.0);
        assert_eq!(binary(BinaryOp::Div, DType::I32, 7.0, 0.0), 0.0);
        assert_eq!(
            binary(BinaryOp::Div, DType::I32, i32::MIN as f64, -1.0),
            i32::MIN as f64
        );
        assert_eq!(binary(BinaryOp::Add, DType::U8, 200.0, 100.0), 44.0);
        assert_eq!(binary(BinaryOp::Sub, DType::U8, 3.0, 5.0), 254.0);
        assert_eq!(binary(BinaryOp::Pow, DType::I64, -1.0, -3.0), -1.0);
        assert_eq!(binary(BinaryOp::Pow, DType::I64, -1.0, -2.0), 1.0);
        assert_eq!(binary(BinaryOp::Pow, DType::I64, 2.0, -1.0), 0.0);
        assert_eq!(binary(BinaryOp::Pow, DType::I32, 0.0, 0.0), 1.0);
        assert_eq!(unary(UnaryOp::Neg, DType::U8, 5.0), 251.0);
        assert_eq!(unary(UnaryOp::Abs, DType::I32, i32::MIN as f64), i32::MIN as f64);
    }

    /// Square and multiply with a 64-bit exponent, modulo 2^64 (an oracle independent of
    /// `int_pow`'s split of the exponent).
    fn pow_mod_2_64(base: i64, mut exp: u64) -> i64 {
        let (mut acc, mut b) = (1u64, base as u64);
        while exp > 0 {
            if exp & 1 == 1 {
                acc = acc.wrapping_mul(b);
            }
            b = b.wrapping_mul(b);
            exp >>= 1;
        }
        acc as i64
    }

    #[test]
    fn integer_pow_wraps_for_every_exponent() {
        assert_eq!(int_pow(2, 64), 0);
        assert_eq!(int_pow(2, 63), i64::MIN);
        assert_eq!(int_pow(2, i64::MAX), 0);
        assert_eq!(int_pow(-1, i64::MAX), -1);
        assert_eq!(int_pow(-1, i64::MAX - 1), 1);
        assert_eq!(int_pow(0, 0), 1);
        for (base, exp) in [
            (3i64, 1i64 << 32),
            (3, (1 << 40) + 5),
            (-7, i64::MAX),
            (i64::MAX, u32::MAX as i64 + 2),
            (12_345, 987_654_321_012),
        ] {
            assert_eq!(int_pow(base, exp), pow_mod_2_64(base, exp as u64), "{base}^{exp}");
        }
        // Stored as i32 and u8: the dtype's own wrapping power.
        assert_eq!(
            binary(BinaryOp::Pow, DType::I32, 3.0, 40.0),
            3i32.wrapping_pow(40) as f64
        );
        assert_eq!(
            binary(BinaryOp::Pow, DType::I32, -123.0, i32::MAX as f64),
            (-123i32).wrapping_pow(i32::MAX as u32) as f64
        );
        assert_eq!(
            binary(BinaryOp::Pow, DType::U8, 3.0, 255.0),
            3u8.wrapping_pow(255) as f64
        );
        // Wrapped in integers before any f64 conversion: (2^31 - 1)^2 = 2^62 - 2^32 + 1.
        let max = i32::MAX as f64;
        assert_eq!(binary(BinaryOp::Mul, DType::I32, max, max), 1.0);
    }

    #[test]
    fn maximum_and_minimum_propagate_nan() {
        for (a, b) in [
            (f64::NAN, 1.0),
            (1.0, f64::NAN),
            (f64::NAN, f64::INFINITY),
            (f64::NEG_INFINITY, f64::NAN),
        ] {
            assert!(binary(BinaryOp::Maximum, DType::F32, a, b).is_nan(), "max({a}, {b})");
            assert!(binary(BinaryOp::Minimum, DType::F64, a, b).is_nan(), "min({a}, {b})");
        }
        let inf = f64::INFINITY;
        assert_eq!(binary(BinaryOp::Maximum, DType::F32, -inf, 3.0), 3.0);
        assert_eq!(binary(BinaryOp::Minimum, DType::F32, -inf, 3.0), -inf);
        assert_eq!(binary(BinaryOp::Maximum, DType::Bool, 0.0, 1.0), 1.0);
    }

    #[test]
    fn arg_reductions_pick_the_first_nan() {
        let nan = f64::NAN;
        let values = [1.0, nan, f64::INFINITY, nan, -2.0, f64::NEG_INFINITY];
        for op in [ReduceOp::ArgMax, ReduceOp::ArgMin] {
            let (want, _) = reduce(op, DType::F32, &[6], &values, &[0]);
            assert_eq!(want, vec![1.0], "{}", op.name());
        }
        // Without NaN, infinities are ordinary extremes and ties keep the first.
        let values = [1.0, f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY];
        assert_eq!(reduce(ReduceOp::ArgMax, DType::F32, &[5], &values, &[0]).0, vec![1.0]);
        assert_eq!(reduce(ReduceOp::ArgMin, DType::F32, &[5], &values, &[0]).0, vec![2.0]);
        let (want, _) = reduce(ReduceOp::Min, DType::F32, &[2, 2], &[nan, 1.0, 2.0, 3.0], &[1]);
        assert!(want[0].is_nan() && want[1] == 2.0, "{want:?}");
    }

    #[test]
    fn casts_follow_as() {
        assert_eq!(cast(DType::F32, DType::I32, -2.7), -2.0);
        assert_eq!(cast(DType::F32, DType::U8, -3.0), 0.0);
        assert_eq!(cast(DType::F32, DType::U8, 300.5), 255.0);
        assert_eq!(cast(DType::F64, DType::I32, f64::NAN), 0.0);
        assert_eq!(cast(DType::F64, DType::Bool, f64::NAN), 1.0);
        assert_eq!(cast(DType::I32, DType::U8, 300.0), 44.0);
        assert_eq!(cast(DType::I64, DType::I32, (1i64 << 32) as f64 + 5.0), 5.0);
        assert_eq!(cast(DType::Bool, DType::F16, 1.0), 1.0);
    }

    #[test]
    fn reductions_and_gelu() {
        let (want, _) = reduce(
            ReduceOp::ArgMax,
            DType::F32,
            &[2, 3],
            &[1.0, 5.0, 5.0, 2.0, 0.0, 2.0],
            &[1],
        );
        assert_eq!(want, vec![1.0, 0.0]);
        let (want, _) = reduce(
            ReduceOp::Sum,
            DType::F32,
            &[2, 3],
            &[1.0, 5.0, 5.0, 2.0, 0.0, 2.0],
            &[0],
        );
        assert_eq!(want, vec![3.0, 5.0, 7.0]);
        let (want, _) = reduce(ReduceOp::Max, DType::F32, &[3], &[1.0, f64::NAN, 2.0], &[0]);
        assert!(want[0].is_nan());
        let (want, _) = reduce(ReduceOp::Mean, DType::F32, &[0], &[], &[0]);
        assert!(want[0].is_nan());
        assert!((unary(UnaryOp::Gelu, DType::F64, 1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
        let sm = softmax(&[2, 2], &[0.0, 0.0, 1.0, 1.0], 1, false);
        assert_eq!(sm, vec![0.5; 4]);
    }

    #[test]
    fn closeness_rounds_and_propagates_nan() {
        assert!(close(DType::F16, f64::INFINITY, 70000.0, 0.0));
        assert!(!close(DType::F32, f64::NAN, 1.0, 1.0));
        assert!(close(DType::F32, f64::NAN, f64::NAN, 0.0));
        assert!(!close(DType::Bool, 255.0, 1.0, 0.0));
        assert!(close(DType::I32, 3.0, 3.0, 0.0));
        assert!(!close(DType::I32, 4.0, 3.0, 0.0));
    }
}
