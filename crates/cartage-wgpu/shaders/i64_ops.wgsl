// Element-wise i64 functions on vec2<u32>(low, high), exact two's complement, wrapping like
// Rust's `wrapping_*`: add/sub carry and borrow across the word boundary, mul keeps the low 64
// bits of the product (32 x 32 -> 64-bit partial products from 16-bit halves), div truncates
// toward zero with x / 0 = 0 and i64::MIN / -1 = i64::MIN, pow is wrapping repeated squaring
// over all 64 exponent bits (0 for a negative exponent unless the base is 1 or -1). Compares
// are signed: the high words as i32, then the low words as u32.

fn i64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let borrow = select(0u, 1u, a.x < b.x);
    return vec2<u32>(a.x - b.x, a.y - b.y - borrow);
}

// Low 64 bits of the product: the cross terms only reach the high word.
fn i64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = mul_wide(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}

fn u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    if a.y != b.y { return a.y < b.y; }
    return a.x < b.x;
}

fn i64_abs_bits(v: vec2<u32>) -> vec2<u32> { return select(v, i64_neg(v), i64_is_neg(v)); }

// Unsigned 64-bit quotient n / d (d != 0): one u32 division when both fit a word, else
// restoring long division over the significant bits of n.
fn u64_div(n: vec2<u32>, d: vec2<u32>) -> vec2<u32> {
    if n.y == 0u && d.y == 0u { return vec2<u32>(n.x / d.x, 0u); }
    if u64_lt(n, d) { return vec2<u32>(0u, 0u); }
    let bits = select(32u - countLeadingZeros(n.x), 64u - countLeadingZeros(n.y), n.y != 0u);
    var q = vec2<u32>(0u, 0u);
    var r = vec2<u32>(0u, 0u);
    for (var k = bits; k > 0u; k = k - 1u) {
        let i = k - 1u;
        let m = 1u << (i & 31u);
        let bit = select(n.x & m, n.y & m, i >= 32u) != 0u;
        // A bit shifted out of r means r >= 2^64 > d (only possible when d >= 2^63).
        let top = r.y >> 31u;
        r = vec2<u32>((r.x << 1u) | select(0u, 1u, bit), (r.y << 1u) | (r.x >> 31u));
        if top != 0u || !u64_lt(r, d) {
            r = i64_sub(r, d);
            if i >= 32u { q.y = q.y | m; } else { q.x = q.x | m; }
        }
    }
    return q;
}

fn i64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    if a.y != b.y { return bitcast<i32>(a.y) < bitcast<i32>(b.y); }
    return a.x < b.x;
}

fn eq_i64(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }
fn lt_i64(a: vec2<u32>, b: vec2<u32>) -> bool { return i64_lt(a, b); }
fn le_i64(a: vec2<u32>, b: vec2<u32>) -> bool { return !i64_lt(b, a); }
fn gt_i64(a: vec2<u32>, b: vec2<u32>) -> bool { return i64_lt(b, a); }
fn ge_i64(a: vec2<u32>, b: vec2<u32>) -> bool { return !i64_lt(a, b); }

fn neg_i64(x: vec2<u32>) -> vec2<u32> { return i64_neg(x); }
fn abs_i64(x: vec2<u32>) -> vec2<u32> { return i64_abs_bits(x); }
fn relu_i64(x: vec2<u32>) -> vec2<u32> { return select(x, vec2<u32>(0u, 0u), i64_is_neg(x)); }
fn sign_i64(x: vec2<u32>) -> vec2<u32> {
    if i64_is_neg(x) { return vec2<u32>(0xffffffffu, 0xffffffffu); }
    return vec2<u32>(select(0u, 1u, (x.x | x.y) != 0u), 0u);
}
fn square_i64(x: vec2<u32>) -> vec2<u32> { return i64_mul(x, x); }
fn floor_i64(x: vec2<u32>) -> vec2<u32> { return x; }
fn ceil_i64(x: vec2<u32>) -> vec2<u32> { return x; }
fn round_i64(x: vec2<u32>) -> vec2<u32> { return x; }
fn trunc_i64(x: vec2<u32>) -> vec2<u32> { return x; }

fn add_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return i64_add(a, b); }
fn sub_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return i64_sub(a, b); }
fn mul_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return i64_mul(a, b); }
fn div_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (b.x | b.y) == 0u { return vec2<u32>(0u, 0u); }
    let q = u64_div(i64_abs_bits(a), i64_abs_bits(b));
    return select(q, i64_neg(q), i64_is_neg(a) != i64_is_neg(b));
}
fn maximum_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, i64_lt(a, b)); }
fn minimum_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, i64_lt(b, a)); }
fn pow_i64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if i64_is_neg(b) {
        if a.x == 1u && a.y == 0u { return a; }
        if a.x == 0xffffffffu && a.y == 0xffffffffu {
            return select(vec2<u32>(1u, 0u), a, (b.x & 1u) != 0u);
        }
        return vec2<u32>(0u, 0u);
    }
    var r = vec2<u32>(1u, 0u);
    var base = a;
    var e = b;
    loop {
        if (e.x | e.y) == 0u { break; }
        if (e.x & 1u) == 1u { r = i64_mul(r, base); }
        base = i64_mul(base, base);
        e = vec2<u32>((e.x >> 1u) | (e.y << 31u), e.y >> 1u);
    }
    return r;
}
