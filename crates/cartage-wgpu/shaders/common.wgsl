// Helpers every cartage kernel may use: NaN/infinity without fast-math assumptions, exact
// f16/bf16 codecs (round to nearest even, as the `half` crate), 64-bit integers as two u32
// words (low, high), and the saturating float -> integer conversions of Rust's `as`.

fn nan_f32() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn inf_f32() -> f32 { return bitcast<f32>(0x7f800000u); }
fn is_nan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }

// f16 bits (low 16) -> f32, exact.
fn f16_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, s != 0u);
    }
    if e == 31u {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

// f32 -> f16 bits, round to nearest even; overflow gives infinity, NaN stays NaN.
fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return s | 0x7e00u | ((a >> 13u) & 0x1ffu);
    }
    if a >= 0x477ff000u {
        return s | 0x7c00u;
    }
    if a < 0x38800000u {
        // Subnormal (or zero) in f16: units of 2^-24, exact scaling, then ties-to-even.
        let v = bitcast<f32>(a) * 16777216.0;
        return s | u32(round(v));
    }
    let r = a + 0xfffu + ((a >> 13u) & 1u);
    return s | ((r - 0x38000000u) >> 13u);
}

fn bf16_to_f32(h: u32) -> f32 { return bitcast<f32>(h << 16u); }

// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
fn f32_to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return ((b >> 16u) | 0x40u) & 0xffffu;
    }
    return ((b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u) & 0xffffu;
}

// Four f16 values in two words (low half first) -> f32, exactly.
fn unpack4_f16(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(f16_to_f32(w.x & 0xffffu), f16_to_f32(w.x >> 16u), f16_to_f32(w.y & 0xffffu), f16_to_f32(w.y >> 16u));
}

// Four bf16 values in two words (low half first) -> f32.
fn unpack4_bf16(w: vec2<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}

// f32 -> four f16 in two words, as f32_to_f16 lane by lane (branch-free).
fn pack4_f16(x: vec4<f32>) -> vec2<u32> {
    let b = bitcast<vec4<u32>>(x);
    let s = (b >> vec4<u32>(16u)) & vec4<u32>(0x8000u);
    let a = b & vec4<u32>(0x7fffffffu);
    let nan = s | vec4<u32>(0x7e00u) | ((a >> vec4<u32>(13u)) & vec4<u32>(0x1ffu));
    let inf = s | vec4<u32>(0x7c00u);
    let sub = s | vec4<u32>(round(bitcast<vec4<f32>>(min(a, vec4<u32>(0x38800000u))) * 16777216.0));
    let r = a + vec4<u32>(0xfffu) + ((a >> vec4<u32>(13u)) & vec4<u32>(1u));
    let norm = s | ((r - vec4<u32>(0x38000000u)) >> vec4<u32>(13u));
    var h = select(norm, sub, a < vec4<u32>(0x38800000u));
    h = select(h, inf, a >= vec4<u32>(0x477ff000u));
    h = select(h, nan, a > vec4<u32>(0x7f800000u));
    return vec2<u32>(h.x | (h.y << 16u), h.z | (h.w << 16u));
}

// f32 -> four bf16 in two words, as f32_to_bf16 lane by lane.
fn pack4_bf16(x: vec4<f32>) -> vec2<u32> {
    let b = bitcast<vec4<u32>>(x);
    let nan = (b & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    let rounded = (b + vec4<u32>(0x7fffu) + ((b >> vec4<u32>(16u)) & vec4<u32>(1u))) >> vec4<u32>(16u);
    let h = select(rounded, (b >> vec4<u32>(16u)) | vec4<u32>(0x40u), nan) & vec4<u32>(0xffffu);
    return vec2<u32>(h.x | (h.y << 16u), h.z | (h.w << 16u));
}

// Rust `as i32` from f32: truncate toward zero, saturate, NaN -> 0.
fn f32_to_i32(x: f32) -> i32 {
    if is_nan_f32(x) { return 0; }
    if x >= 2147483648.0 { return 2147483647; }
    if x <= -2147483648.0 { return -2147483647 - 1; }
    return i32(x);
}

// Rust `as u8` from f32 (result in 0..=255).
fn f32_to_u8(x: f32) -> u32 {
    if is_nan_f32(x) || x <= 0.0 { return 0u; }
    if x >= 255.0 { return 255u; }
    return u32(x);
}

// ---- 64-bit integers as vec2<u32>(low, high) ----

fn i64_from_i32(v: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0));
}

fn i64_neg(v: vec2<u32>) -> vec2<u32> {
    let lo = ~v.x + 1u;
    let hi = ~v.y + select(0u, 1u, lo == 0u);
    return vec2<u32>(lo, hi);
}

fn i64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    let carry = select(0u, 1u, lo < a.x);
    return vec2<u32>(lo, a.y + b.y + carry);
}

// Full 32 x 32 -> 64-bit unsigned product.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}

fn i64_is_neg(v: vec2<u32>) -> bool { return (v.y & 0x80000000u) != 0u; }

// u32 -> f32 rounded to nearest even (exact below 2^24).
fn u32_to_f32(v: u32) -> f32 {
    if v < 16777216u { return f32(v); }
    let lz = countLeadingZeros(v);
    let shift = 8u - lz;
    let keep = v >> shift;
    let rest = v & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    var m = keep;
    if rest > half || (rest == half && (keep & 1u) == 1u) { m = m + 1u; }
    return f32(m) * exp2(f32(shift));
}

// Rust `as f32` from i64: correctly rounded (nearest even).
fn i64_to_f32(v: vec2<u32>) -> f32 {
    let neg = i64_is_neg(v);
    let a = select(v, i64_neg(v), neg);
    var r: f32;
    if a.y == 0u {
        r = u32_to_f32(a.x);
    } else {
        // Keep the top 32 significant bits, fold the rest into a sticky bit, round once.
        let lz = countLeadingZeros(a.y);
        let shift = 32u - lz;
        let top = select((a.y << lz) | (a.x >> shift), a.y, lz == 0u);
        let lost = select(a.x << lz, a.x, lz == 0u);
        let top_sticky = top | select(0u, 1u, lost != 0u && (top & 0xffu) == 0x80u);
        r = u32_to_f32(top_sticky) * exp2(f32(shift));
    }
    return select(r, -r, neg);
}

// Rust `as i64` from f32: truncate toward zero, saturate, NaN -> 0.
fn f32_to_i64(x: f32) -> vec2<u32> {
    if is_nan_f32(x) { return vec2<u32>(0u, 0u); }
    if x >= 9223372036854775808.0 { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if x <= -9223372036854775808.0 { return vec2<u32>(0u, 0x80000000u); }
    let t = abs(trunc(x));
    let hi = floor(t * 2.3283064365386963e-10);
    let lo = t - hi * 4294967296.0;
    let m = vec2<u32>(u32(lo), u32(hi));
    return select(m, i64_neg(m), x < 0.0);
}
