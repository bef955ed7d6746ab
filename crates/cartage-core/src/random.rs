//! Counter-based random numbers: Philox4x32-10, the same stream on every backend.
//!
//! Element `i` of a `Random` kernel uses counter `offset + i` (low word, high word, 0, 0) and key
//! `seed` (low word, high word). From the four output words:
//! - uniform: `u = (w0 >> 8) · 2⁻²⁴` in `[0, 1)` (exact in f32, so bit-identical everywhere),
//!   value `low + (high − low) · u`;
//! - normal (Box–Muller): `u1 = ((w0 >> 8) + 1) · 2⁻²⁴` in `(0, 1]`, `u2 = (w1 >> 8) · 2⁻²⁴`,
//!   `z = sqrt(−2 ln u1) · cos(2π u2)` in f32, value `mean + std · z`.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// The four Philox words for element counter `index` under `seed`.
pub fn philox_words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32_10(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Uniform `[0, 1)` draw of element `index`.
pub fn uniform_unit(seed: u64, index: u64) -> f32 {
    let w = philox_words(seed, index);
    (w[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Standard normal draw of element `index` (Box–Muller in f32).
pub fn normal_unit(seed: u64, index: u64) -> f32 {
    let w = philox_words(seed, index);
    let u1 = ((w[0] >> 8) + 1) as f32 * (1.0 / 16_777_216.0);
    let u2 = (w[1] >> 8) as f32 * (1.0 / 16_777_216.0);
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Random123's published known-answer vectors for philox4x32-10.
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([0xffffffff; 4], [0xffffffff; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn moments_are_right() {
        let n = 100_000u64;
        let mean_u: f64 = (0..n).map(|i| uniform_unit(7, i) as f64).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.01, "{mean_u}");
        let z: Vec<f64> = (0..n).map(|i| normal_unit(7, i) as f64).collect();
        let m = z.iter().sum::<f64>() / n as f64;
        let v = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.02 && (v - 1.0).abs() < 0.03, "{m} {v}");
    }
}
