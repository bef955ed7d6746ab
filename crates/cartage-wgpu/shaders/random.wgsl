// Philox4x32-10, word for word the generator of cartage_core::random: element i draws from
// counter (offset + i) as (low, high, 0, 0) with key (seed low, seed high).

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var r = 0u; r < 10u; r = r + 1u) {
        let p0 = mul_wide(0xD2511F53u, c.x);
        let p1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

// The four words of logical element `i` (P.extra[0]: offset low/high, seed low/high).
fn philox_words(i: u32) -> vec4<u32> {
    let n = P.base + i;
    let lo = P.extra[0].x + n;
    let hi = P.extra[0].y + select(0u, 1u, lo < n);
    return philox4x32_10(vec4<u32>(lo, hi, 0u, 0u), P.extra[0].zw);
}

// Uniform [0, 1): (w0 >> 8) * 2^-24, exact in f32.
fn uniform_unit(w: vec4<u32>) -> f32 {
    return f32(w.x >> 8u) * 5.9604644775390625e-8;
}

// ln(x) for x in (0, 1], accurate near 1 where Box-Muller takes the square root of it: there
// x - 1 is exact and ln x = 2 atanh((x - 1) / (x + 1)) by its series.
fn ln_unit(x: f32) -> f32 {
    if x <= 0.5 {
        return log(x);
    }
    let s = (x - 1.0) / (x + 1.0);
    let s2 = s * s;
    let series = 1.0 + s2 * (0.33333333 + s2 * (0.2 + s2 * (0.14285714 + s2 * (0.11111111 + s2 * (0.09090909 + s2 * 0.07692308)))));
    return 2.0 * s * series;
}

// Standard normal by Box-Muller in f32; the cosine's argument is folded into [-pi, pi].
fn normal_unit(w: vec4<u32>) -> f32 {
    let u1 = f32((w.x >> 8u) + 1u) * 5.9604644775390625e-8;
    let u2 = f32(w.y >> 8u) * 5.9604644775390625e-8;
    let turn = select(u2, u2 - 1.0, u2 > 0.5);
    return sqrt(-2.0 * ln_unit(u1)) * cos(6.283185307179586 * turn);
}
