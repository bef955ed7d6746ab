//! `Random`: values equal [`crate::random::uniform_unit`] / [`crate::random::normal_unit`] at
//! counter `offset + i` (uniform on [0, 1) bit-exact, normal within 1e-5, f16/bf16 after
//! rounding), `offset` shifts the stream (across the 2^32 counter word too), strided outputs
//! count row-major positions, and the moments of 2^20 + 1 draws are right.

use crate::dtype::DType;
use crate::kernel::{Distribution, Kernel, Op};
use crate::layout::Layout;
use crate::random::{normal_unit, uniform_unit};

use super::harness::Harness;
use super::reference::Tolerance;
use super::views::{LARGE, ViewKind};

/// Launch one `Random` kernel into a poisoned view and return its values (row-major), or `None`
/// after recording a failure.
fn draw(
    h: &Harness,
    dtype: DType,
    kind: ViewKind,
    shape: &[usize],
    distribution: Distribution,
    seed: u64,
    offset: u64,
) -> Option<(super::DeviceBuffer, Layout)> {
    let (out, layout) = h.poisoned_view(dtype, kind, shape);
    let what = format!("{distribution:?} {dtype} {shape:?} seed {seed} offset {offset}");
    let kernel = Kernel::Random {
        out: out.arg(&layout),
        distribution,
        seed,
        offset,
    };
    h.launch(&what, &kernel).then_some((out, layout))
}

fn expect_unsupported(h: &Harness, dtype: DType, distribution: Distribution) {
    let out = h.poisoned(dtype, 3);
    let kernel = Kernel::Random {
        out: out.contiguous(&[3]),
        distribution,
        seed: 1,
        offset: 0,
    };
    h.expect_unsupported(&format!("{distribution:?} {dtype}"), &kernel);
}

/// The shapes and offsets every distribution runs: the seed is random per case.
fn random_cases(h: &Harness) -> Vec<(ViewKind, Vec<usize>, u64)> {
    vec![
        (ViewKind::Contiguous, vec![0], 0),
        (ViewKind::Contiguous, vec![], 0),
        (ViewKind::Contiguous, vec![1023], h.next_u64() >> 20),
        (ViewKind::Contiguous, vec![33, 31], 0),
        (ViewKind::Transposed, vec![9, 5], 17),
        (ViewKind::Narrowed, vec![6, 7], 3),
        (ViewKind::Contiguous, vec![10], (1u64 << 32) - 5),
    ]
}

/// Uniform draws: bit-exact on [0, 1), within rounding on other ranges; offset shifts the
/// stream; moments of a large draw.
pub fn random_uniform(h: &Harness) {
    for dtype in DType::ALL {
        let unit = Distribution::Uniform { low: 0.0, high: 1.0 };
        if !h.supports(Op::RandomUniform, dtype) {
            expect_unsupported(h, dtype, unit);
            continue;
        }
        for (kind, shape, offset) in random_cases(h) {
            let seed = h.next_u64();
            let what = format!(
                "uniform [0, 1) {dtype} {shape:?} ({}) seed {seed} offset {offset}",
                kind.name()
            );
            if let Some((out, layout)) = draw(h, dtype, kind, &shape, unit, seed, offset) {
                let want: Vec<f64> = (0..layout.numel() as u64)
                    .map(|i| dtype.round_trip(uniform_unit(seed, offset + i) as f64))
                    .collect();
                // Bit-exact for every dtype but the two 16-bit floats: the reference rounds with the
                // `half` crate's f64 conversion, which rounds a value just above a tie to even (it
                // looks at the top 32 bits of the f64 only), while a backend rounding the f32 draw
                // correctly goes up. One unit in the last place of the dtype is allowed there.
                let mantissa = match dtype {
                    DType::BF16 => Some(7),
                    DType::F16 => Some(10),
                    _ => None,
                };
                h.check_with(&what, &out, &layout, &want, |_, w| match mantissa {
                    Some(m) if w != 0.0 => 2f64.powi(w.abs().log2().floor() as i32 - m),
                    _ => 0.0,
                });
            }
            let (low, high) = (-2.5, 3.0);
            let ranged = Distribution::Uniform { low, high };
            let what = format!("uniform [{low}, {high}) {dtype} {shape:?} seed {seed} offset {offset}");
            if let Some((out, layout)) = draw(h, dtype, kind, &shape, ranged, seed, offset) {
                let want: Vec<f64> = (0..layout.numel() as u64)
                    .map(|i| low + (high - low) * uniform_unit(seed, offset + i) as f64)
                    .collect();
                h.check(&what, &out, &layout, &want, Tolerance::of(dtype));
            }
        }
        shifted_stream(h, dtype, unit);
    }
    if h.supports(Op::RandomUniform, DType::F32) {
        let seed = h.next_u64();
        if let Some(values) = large_draw(h, Distribution::Uniform { low: 0.0, high: 1.0 }, seed) {
            let (mean, var) = moments(&values);
            let n = values.len() as f64;
            h.count_check();
            // Six standard errors: 1/12 is the variance of U[0, 1); 1/180 that of the sample variance.
            if (mean - 0.5).abs() > 6.0 * (1.0 / 12.0 / n).sqrt()
                || (var - 1.0 / 12.0).abs() > 6.0 * (1.0 / 180.0 / n).sqrt()
            {
                h.fail(format!(
                    "uniform moments of {n} draws (seed {seed}): mean {mean}, variance {var}"
                ));
            }
            if values.iter().any(|&v| !(0.0..1.0).contains(&v)) {
                h.fail(format!("uniform draws (seed {seed}) left [0, 1)"));
            }
        }
    }
}

/// Normal draws: within 1e-5 of the f32 Box–Muller reference; offset shifts the stream; moments.
pub fn random_normal(h: &Harness) {
    for dtype in DType::ALL {
        let standard = Distribution::Normal { mean: 0.0, std: 1.0 };
        if !h.supports(Op::RandomNormal, dtype) {
            expect_unsupported(h, dtype, standard);
            continue;
        }
        for (kind, shape, offset) in random_cases(h) {
            let seed = h.next_u64();
            for (mean, std) in [(0.0, 1.0), (2.0, 0.5)] {
                let distribution = Distribution::Normal { mean, std };
                let what = format!(
                    "normal({mean}, {std}) {dtype} {shape:?} ({}) seed {seed} offset {offset}",
                    kind.name()
                );
                if let Some((out, layout)) = draw(h, dtype, kind, &shape, distribution, seed, offset) {
                    let want: Vec<f64> = (0..layout.numel() as u64)
                        .map(|i| mean + std * normal_unit(seed, offset + i) as f64)
                        .collect();
                    let tol = Tolerance::of(dtype);
                    h.check_with(&what, &out, &layout, &want, |_, w| {
                        tol.allowed(w).max(1e-5 * w.abs().max(1.0))
                    });
                }
            }
        }
        shifted_stream(h, dtype, standard);
    }
    if h.supports(Op::RandomNormal, DType::F32) {
        let seed = h.next_u64();
        if let Some(values) = large_draw(h, Distribution::Normal { mean: 0.0, std: 1.0 }, seed) {
            let (mean, var) = moments(&values);
            let n = values.len() as f64;
            h.count_check();
            if mean.abs() > 6.0 / n.sqrt() || (var - 1.0).abs() > 6.0 * (2.0 / n).sqrt() {
                h.fail(format!(
                    "normal moments of {n} draws (seed {seed}): mean {mean}, variance {var}"
                ));
            }
        }
    }
}

/// Drawing `n` values at offset `k` gives elements `k..k + n` of the stream at offset 0.
fn shifted_stream(h: &Harness, dtype: DType, distribution: Distribution) {
    let seed = h.next_u64();
    let shift = 1 + h.below(50) as u64;
    let (Some((whole, wl)), Some((tail, tl))) = (
        draw(h, dtype, ViewKind::Contiguous, &[100], distribution, seed, 0),
        draw(
            h,
            dtype,
            ViewKind::Contiguous,
            &[100 - shift as usize],
            distribution,
            seed,
            shift,
        ),
    ) else {
        return;
    };
    let what = format!("{distribution:?} {dtype} offset {shift} against offset 0 (seed {seed})");
    let (Some(whole), Some(tail)) = (h.read_values(&what, &whole, &wl), h.read_values(&what, &tail, &tl)) else {
        return;
    };
    h.count_check();
    if whole[shift as usize..]
        .iter()
        .zip(&tail)
        .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        h.fail(format!("{what}: the shifted stream differs"));
    }
    let other_seed = draw(h, dtype, ViewKind::Contiguous, &[100], distribution, seed ^ 1, 0)
        .and_then(|(buf, layout)| h.read_values(&what, &buf, &layout));
    if other_seed.is_some_and(|o| o == whole) {
        h.fail(format!("{what}: seeds {seed} and {} give the same values", seed ^ 1));
    }
}

/// [`LARGE`] f32 draws at offset 0, checked against the reference, returned as f64.
fn large_draw(h: &Harness, distribution: Distribution, seed: u64) -> Option<Vec<f64>> {
    let (out, layout) = draw(h, DType::F32, ViewKind::Contiguous, &[LARGE], distribution, seed, 0)?;
    let what = format!("{distribution:?} f32 [{LARGE}] seed {seed}");
    let values = h.read_values(&what, &out, &layout)?;
    let normal = matches!(distribution, Distribution::Normal { .. });
    let wrong = (0..LARGE)
        .filter(|&i| {
            let want = if normal {
                normal_unit(seed, i as u64)
            } else {
                uniform_unit(seed, i as u64)
            } as f64;
            let allowed = if normal { 1e-5 * want.abs().max(1.0) } else { 0.0 };
            (values[i] - want).abs() > allowed || values[i].is_nan()
        })
        .count();
    h.count_check();
    if wrong > 0 {
        h.fail(format!("{what}: {wrong} values differ from the reference stream"));
    }
    Some(values)
}

fn moments(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var)
}
