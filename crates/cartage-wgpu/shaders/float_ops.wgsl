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
