// Element-wise f32 functions with cartage's semantics (NaN propagates through maximum/minimum,
// pow follows Rust's powf, GELU is the exact erf form). f16/bf16 are computed with these too.

fn neg_f32(x: f32) -> f32 { return -x; }
fn abs_f32(x: f32) -> f32 { return abs(x); }
fn exp_f32(x: f32) -> f32 { return exp(x); }

fn log_f32(x: f32) -> f32 {
    if x < 0.0 { return nan_f32(); }
    if x == 0.0 { return -inf_f32(); }
    return log(x);
}

fn sqrt_f32(x: f32) -> f32 {
    if x < 0.0 { return nan_f32(); }
    return sqrt(x);
}

fn relu_f32(x: f32) -> f32 { return select(x, 0.0, x < 0.0); }

// tanh accurate near zero (odd polynomial) and saturating for large |x| (no inf / inf).
fn tanh_f32(x: f32) -> f32 {
    let a = abs(x);
    if is_nan_f32(x) { return x; }
    if a < 0.625 {
        let z = x * x;
        let p = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
            - 3.33332819422e-1) * z;
        return x + x * p;
    }
    if a > 9.0 { return sign(x); }
    let e = exp(2.0 * a);
    let r = 1.0 - 2.0 / (e + 1.0);
    return select(r, -r, x < 0.0);
}

fn sigmoid_f32(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }

// erfc with fractional error below 1.2e-7 (Chebyshev fit).
fn erfc_f32(z: f32) -> f32 {
    let a = abs(z);
    let t = 1.0 / (1.0 + 0.5 * a);
    let p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807
        + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let r = t * exp(-a * a + p);
    return select(r, 2.0 - r, z < 0.0);
}

fn gelu_f32(x: f32) -> f32 { return 0.5 * x * erfc_f32(-x * 0.70710678118654752); }

fn add_f32(a: f32, b: f32) -> f32 { return a + b; }
fn sub_f32(a: f32, b: f32) -> f32 { return a - b; }
fn mul_f32(a: f32, b: f32) -> f32 { return a * b; }
fn div_f32(a: f32, b: f32) -> f32 { return a / b; }

fn maximum_f32(a: f32, b: f32) -> f32 {
    if is_nan_f32(a) || is_nan_f32(b) { return nan_f32(); }
    return select(b, a, a > b);
}

fn minimum_f32(a: f32, b: f32) -> f32 {
    if is_nan_f32(a) || is_nan_f32(b) { return nan_f32(); }
    return select(b, a, a < b);
}

// Rust's powf: pow(x, 0) = 1 and pow(1, y) = 1 even for NaN; negative bases need integral
// exponents; small integral exponents multiply exactly by squaring.
fn pow_f32(x: f32, y: f32) -> f32 {
    if y == 0.0 || x == 1.0 { return 1.0; }
    if is_nan_f32(x) || is_nan_f32(y) { return nan_f32(); }
    let ay = abs(y);
    let y_int = trunc(y) == y;
    let y_odd = y_int && ay < 16777216.0 && (u32(ay) & 1u) == 1u;
    let ax = abs(x);
    if ax == 1.0 && ay == inf_f32() { return 1.0; }
    if x < 0.0 && !y_int { return nan_f32(); }
    var r: f32;
    if x == 0.0 {
        r = select(0.0, inf_f32(), y < 0.0);
    } else if y_int && ay <= 64.0 {
        var e = u32(ay);
        var base = ax;
        r = 1.0;
        loop {
            if e == 0u { break; }
            if (e & 1u) == 1u { r = r * base; }
            base = base * base;
            e = e >> 1u;
        }
        if y < 0.0 { r = 1.0 / r; }
    } else {
        r = exp2(y * log2(ax));
    }
    let negative = y_odd && (x < 0.0 || (x == 0.0 && (bitcast<u32>(x) & 0x80000000u) != 0u));
    return select(r, -r, negative);
}

// x - 2πk with k = round(x / 2π), 2π split into four parts (three of 8 significant bits, so
// k * part is exact for |k| < 2^16): drivers whose sin/cos lose accuracy with |x| (hardware
// units scaling by 1/2π in f32) then see an argument in [-π, π], absolute error below 3e-7 for
// |x| < 4e5.
fn reduce_two_pi(x: f32) -> f32 {
    let k = round(x * 0.15915494309189535);
    var r = x - k * 6.28125;
    r = r - k * 0.0019378662109375;
    r = r - k * -2.562999725341797e-06;
    return r - k * 3.968374517882012e-09;
}
fn sin_f32(x: f32) -> f32 {
    if abs(x) > 3.0 && abs(x) < 400000.0 { return sin(reduce_two_pi(x)); }
    return sin(x);
}
fn cos_f32(x: f32) -> f32 {
    if abs(x) > 3.0 && abs(x) < 400000.0 { return cos(reduce_two_pi(x)); }
    return cos(x);
}
fn floor_f32(x: f32) -> f32 { return floor(x); }
fn ceil_f32(x: f32) -> f32 { return ceil(x); }
// WGSL's round is half to even.
fn round_f32(x: f32) -> f32 { return round(x); }
fn trunc_f32(x: f32) -> f32 { return trunc(x); }
// -1, 0 or 1; NaN and ±0 are returned as they are.
fn sign_f32(x: f32) -> f32 {
    if x > 0.0 { return 1.0; }
    if x < 0.0 { return -1.0; }
    return x;
}
// 1 / sqrt: +inf at +0, -inf at -0, NaN below 0.
fn rsqrt_f32(x: f32) -> f32 { return 1.0 / sqrt_f32(x); }
fn recip_f32(x: f32) -> f32 { return 1.0 / x; }
fn square_f32(x: f32) -> f32 { return x * x; }

// erf: the odd Taylor series near 0 (relative error below 1e-8 for |x| < 0.5), 1 - erfc above.
fn erf_f32(x: f32) -> f32 {
    let a = abs(x);
    if a < 0.5 {
        let z = x * x;
        let p = 1.0 + z * (-0.333333333333 + z * (0.1 + z * (-0.0238095238095 + z * (0.00462962962963
            + z * (-0.000757575757576 + z * 0.000106837606838)))));
        return 1.1283791670955126 * x * p;
    }
    if is_nan_f32(x) { return x; }
    if a >= 4.0 { return sign(x); }
    let r = 1.0 - erfc_f32(a);
    return select(r, -r, x < 0.0);
}

// log1p without cancellation: 2 atanh(x / (2 + x)) as an odd series for 1 + x in [0.5, 2]
// (|s| <= 1/3, relative error below 1e-9), where drivers' log is only accurate in absolute
// terms; the compensated log(u) * x / (u - 1) elsewhere.
fn log1p_f32(x: f32) -> f32 {
    if is_nan_f32(x) { return x; }
    if x < -1.0 { return nan_f32(); }
    if x == -1.0 { return -inf_f32(); }
    if x == inf_f32() { return x; }
    if x >= -0.5 && x <= 1.0 {
        let s = x / (2.0 + x);
        let z = s * s;
        let p = 1.0 + z * (0.333333333333 + z * (0.2 + z * (0.142857142857 + z * (0.111111111111
            + z * (0.0909090909091 + z * (0.0769230769231 + z * (0.0666666666667 + z * (0.0588235294118
            + z * (0.0526315789474 + z * 0.047619047619)))))))));
        return 2.0 * s * p;
    }
    let u = 1.0 + x;
    return log(u) * (x / (u - 1.0));
}

// expm1 without cancellation: a Taylor polynomial for |x| < 0.35 (relative error below 1e-8),
// exp(x) - 1 elsewhere (where it cannot cancel).
fn expm1_f32(x: f32) -> f32 {
    if abs(x) < 0.35 {
        let p = 1.0 + x * (0.5 + x * (0.166666666667 + x * (0.0416666666667 + x * (0.00833333333333
            + x * (0.00138888888889 + x * (0.000198412698413 + x * (0.0000248015873016
            + x * 0.00000275573192240)))))));
        return x * p;
    }
    if is_nan_f32(x) { return x; }
    if x < -88.0 { return -1.0; }
    return exp(x) - 1.0;
}

fn silu_f32(x: f32) -> f32 { return x / (1.0 + exp(-x)); }

// log1p(exp(x)), x itself above 20.
fn softplus_f32(x: f32) -> f32 {
    if x > 20.0 { return x; }
    return log1p_f32(exp(x));
}
