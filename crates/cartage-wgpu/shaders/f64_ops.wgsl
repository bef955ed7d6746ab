// f64 helpers and element-wise functions (only compiled into kernels of f64 tensors, on adapters
// with SHADER_F64). Vulkan has no 64-bit exp/log/tanh, so those ops are not offered for f64.

// Ordered equality is false only for NaN (`!=` may be an ordered compare, false for NaN too).
fn is_nan_f64(x: f64) -> bool { return !(x == x); }
fn nan_f64() -> f64 { return f64(nan_f32()); }

fn f64_to_i32(x: f64) -> i32 {
    if is_nan_f64(x) { return 0; }
    if x >= 2147483647.0lf { return 2147483647; }
    if x <= -2147483648.0lf { return -2147483647 - 1; }
    return i32(x);
}

fn f64_to_u8(x: f64) -> u32 {
    if is_nan_f64(x) || x <= 0.0lf { return 0u; }
    if x >= 255.0lf { return 255u; }
    return u32(x);
}

fn f64_to_i64(x: f64) -> vec2<u32> {
    if is_nan_f64(x) { return vec2<u32>(0u, 0u); }
    if x >= 9223372036854775808.0lf { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if x <= -9223372036854775808.0lf { return vec2<u32>(0u, 0x80000000u); }
    let t = abs(trunc(x));
    let hi = floor(t / 4294967296.0lf);
    let lo = t - hi * 4294967296.0lf;
    let m = vec2<u32>(u32(lo), u32(hi));
    return select(m, i64_neg(m), x < 0.0lf);
}

fn i64_to_f64(v: vec2<u32>) -> f64 {
    return f64(bitcast<i32>(v.y)) * 4294967296.0lf + f64(v.x);
}

fn neg_f64(x: f64) -> f64 { return -x; }
fn abs_f64(x: f64) -> f64 { return abs(x); }
fn sqrt_f64(x: f64) -> f64 {
    if x < 0.0lf { return nan_f64(); }
    return sqrt(x);
}
fn relu_f64(x: f64) -> f64 { return select(x, 0.0lf, x < 0.0lf); }
fn add_f64(a: f64, b: f64) -> f64 { return a + b; }
fn sub_f64(a: f64, b: f64) -> f64 { return a - b; }
fn mul_f64(a: f64, b: f64) -> f64 { return a * b; }
fn div_f64(a: f64, b: f64) -> f64 { return a / b; }
fn maximum_f64(a: f64, b: f64) -> f64 {
    if is_nan_f64(a) || is_nan_f64(b) { return nan_f64(); }
    return select(b, a, a > b);
}
fn minimum_f64(a: f64, b: f64) -> f64 {
    if is_nan_f64(a) || is_nan_f64(b) { return nan_f64(); }
    return select(b, a, a < b);
}
fn floor_f64(x: f64) -> f64 { return floor(x); }
fn ceil_f64(x: f64) -> f64 { return ceil(x); }
fn trunc_f64(x: f64) -> f64 { return trunc(x); }
// Half to even, written out (round() of 64-bit floats is not available everywhere).
fn round_f64(x: f64) -> f64 {
    if !(abs(x) < 4503599627370496.0lf) || x == 0.0lf { return x; }
    let f = floor(x);
    let d = x - f;
    let half = f * 0.5lf;
    var r = f;
    if d > 0.5lf || (d == 0.5lf && floor(half) != half) { r = f + 1.0lf; }
    // A zero result keeps the input's sign (a select, which no optimiser folds as it may x * 0).
    if r == 0.0lf { return select(0.0lf, -0.0lf, x < 0.0lf); }
    return r;
}
fn sign_f64(x: f64) -> f64 {
    if x > 0.0lf { return 1.0lf; }
    if x < 0.0lf { return -1.0lf; }
    return x;
}
fn rsqrt_f64(x: f64) -> f64 { return 1.0lf / sqrt_f64(x); }
fn recip_f64(x: f64) -> f64 { return 1.0lf / x; }
fn square_f64(x: f64) -> f64 { return x * x; }
