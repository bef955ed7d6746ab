// Element-wise integer functions: i32 (two's complement, wrapping) and u32 (holding u8 or bool
// values; results are masked to 8 bits when stored). Division by zero gives 0; a negative
// integer exponent gives 0 unless the base is 1 or -1.

fn neg_i32(x: i32) -> i32 { return 0 - x; }
fn abs_i32(x: i32) -> i32 { return select(x, 0 - x, x < 0); }
fn relu_i32(x: i32) -> i32 { return max(x, 0); }
fn add_i32(a: i32, b: i32) -> i32 { return a + b; }
fn sub_i32(a: i32, b: i32) -> i32 { return a - b; }
fn mul_i32(a: i32, b: i32) -> i32 { return a * b; }
fn div_i32(a: i32, b: i32) -> i32 {
    let safe = select(b, 1, b == 0 || (b == -1 && a == (-2147483647 - 1)));
    let q = a / safe;
    if b == 0 { return 0; }
    if b == -1 { return 0 - a; }
    return q;
}
fn maximum_i32(a: i32, b: i32) -> i32 { return max(a, b); }
fn minimum_i32(a: i32, b: i32) -> i32 { return min(a, b); }
fn pow_i32(a: i32, b: i32) -> i32 {
    if b < 0 {
        if a == 1 { return 1; }
        if a == -1 { return select(1, -1, (b & 1) != 0); }
        return 0;
    }
    var r = 1;
    var base = a;
    var e = u32(b);
    loop {
        if e == 0u { break; }
        if (e & 1u) == 1u { r = r * base; }
        base = base * base;
        e = e >> 1u;
    }
    return r;
}

fn neg_u32(x: u32) -> u32 { return 0u - x; }
fn abs_u32(x: u32) -> u32 { return x; }
fn relu_u32(x: u32) -> u32 { return x; }
fn add_u32(a: u32, b: u32) -> u32 { return a + b; }
fn sub_u32(a: u32, b: u32) -> u32 { return a - b; }
fn mul_u32(a: u32, b: u32) -> u32 { return a * b; }
fn div_u32(a: u32, b: u32) -> u32 { return select(a / max(b, 1u), 0u, b == 0u); }
fn maximum_u32(a: u32, b: u32) -> u32 { return max(a, b); }
fn minimum_u32(a: u32, b: u32) -> u32 { return min(a, b); }
fn pow_u32(a: u32, b: u32) -> u32 {
    var r = 1u;
    var base = a;
    var e = b;
    loop {
        if e == 0u { break; }
        if (e & 1u) == 1u { r = r * base; }
        base = base * base;
        e = e >> 1u;
    }
    return r;
}

// Rounding is the identity on integers; sign is -1, 0 or 1; square wraps.
fn floor_i32(x: i32) -> i32 { return x; }
fn ceil_i32(x: i32) -> i32 { return x; }
fn round_i32(x: i32) -> i32 { return x; }
fn trunc_i32(x: i32) -> i32 { return x; }
fn sign_i32(x: i32) -> i32 { return select(select(-1, 1, x > 0), 0, x == 0); }
fn square_i32(x: i32) -> i32 { return x * x; }
fn floor_u32(x: u32) -> u32 { return x; }
fn ceil_u32(x: u32) -> u32 { return x; }
fn round_u32(x: u32) -> u32 { return x; }
fn trunc_u32(x: u32) -> u32 { return x; }
fn sign_u32(x: u32) -> u32 { return select(0u, 1u, x != 0u); }
fn square_u32(x: u32) -> u32 { return x * x; }
