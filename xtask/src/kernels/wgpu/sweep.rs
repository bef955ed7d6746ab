//! The `matmul-sweep` mode: every matmul variant for every dtype and problem, timed, checked
//! against an f64 product on the host on sampled rows, one JSON line each.

use std::time::Instant;

use anyhow::Result;
use cartage_core::{DType, DeviceBuffer, Layout};

use super::Bench;

/// A host matrix of `rows` × `cols` values in [-1, 1), rounded to `dtype`: the values and their
/// little-endian bytes in `dtype`.
fn host_matrix(rows: usize, cols: usize, dtype: DType, seed: u64) -> (Vec<f64>, Vec<u8>) {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut values = Vec::with_capacity(rows * cols);
    let mut bytes = Vec::with_capacity(rows * cols * dtype.size_in_bytes());
    for _ in 0..rows * cols {
        // xorshift64*: plenty for test data.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let x = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        let v = match dtype {
            DType::F16 => {
                let h = half::f16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                h.to_f64()
            }
            DType::BF16 => {
                let h = half::bf16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                h.to_f64()
            }
            _ => {
                let f = x as f32;
                bytes.extend_from_slice(&f.to_le_bytes());
                f64::from(f)
            }
        };
        values.push(v);
    }
    (values, bytes)
}

/// The elements of `bytes` (in `dtype`) as f64.
fn host_values(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F16 => bytes
            .chunks(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        _ => bytes
            .chunks(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    }
}

/// `matmul-sweep`: every variant for every dtype and problem (or only `only_dtype`, only
/// `only_variant`), one JSON line each.
pub(super) fn run(bench: &Bench, only_dtype: Option<&str>, only_variant: Option<&str>) -> Result<()> {
    // (m, k, n): squares, and a long-sequence projection with a short K.
    let problems = [
        (1024, 1024, 1024),
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (4096, 512, 4096),
    ];
    let started = Instant::now();
    println!("# f16 path: {}", bench.backend.f16_matmul_path());
    for dtype in [DType::F16, DType::F32, DType::BF16] {
        if only_dtype.is_some_and(|d| d != dtype.to_string()) {
            continue;
        }
        for (m, k, n) in problems {
            let (av, ab) = host_matrix(m, k, dtype, 1);
            let (bv, bb) = host_matrix(k, n, dtype, 2);
            let size = dtype.size_in_bytes();
            let a_buf = DeviceBuffer::new(&bench.device, ab.len())?;
            let b_buf = DeviceBuffer::new(&bench.device, bb.len())?;
            let c_buf = DeviceBuffer::new(&bench.device, m * n * size)?;
            a_buf.write(0, &ab)?;
            b_buf.write(0, &bb)?;
            let a = a_buf.arg(Layout::contiguous(&[1, m, k])?, dtype);
            let b = b_buf.arg(Layout::contiguous(&[1, k, n])?, dtype);
            let c = c_buf.arg(Layout::contiguous(&[1, m, n])?, dtype);
            // Sampled rows (whole rows read back) and columns of C.
            let rows: Vec<usize> = (0..8).map(|r| (r * m / 8 + r * 37) % m).collect();
            let cols: Vec<usize> = (0..64).map(|q| (q * n / 64 + q * 11) % n).collect();
            for variant in bench.backend.matmul_variant_names(dtype) {
                if only_variant.is_some_and(|v| v != variant) {
                    continue;
                }
                let mut ran = String::new();
                let t = bench.time(|| {
                    // SAFETY: the operands are views of `a_buf`, `b_buf` and `c_buf`, which
                    // outlive the timing and the read-back below.
                    ran = unsafe { bench.backend.matmul_with_variant(&a, &b, &c, &variant) }?;
                    Ok(())
                });
                let t = match t {
                    Ok(t) => t,
                    Err(e) => {
                        let message = e
                            .to_string()
                            .replace('\\', "\\\\")
                            .replace('"', "\\\"")
                            .replace('\n', " ");
                        println!(
                            "{{\"sweep\":\"matmul\",\"dtype\":\"{dtype}\",\"m\":{m},\"k\":{k},\"n\":{n},\"variant\":\"{variant}\",\"error\":\"{message}\"}}"
                        );
                        continue;
                    }
                };
                let mut worst = 0.0f64;
                for &i in &rows {
                    let mut bytes = vec![0u8; n * size];
                    c_buf.read(i * n * size, &mut bytes)?;
                    let got = host_values(&bytes, dtype);
                    for &j in &cols {
                        let (mut exact, mut scale) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let term = av[i * k + p] * bv[p * n + j];
                            exact += term;
                            scale += term.abs();
                        }
                        // Relative to the sum of the terms' magnitudes (the scale rounding errors
                        // grow with); NaN for a non-finite result.
                        let err = (got[j] - exact).abs() / scale.max(f64::MIN_POSITIVE);
                        worst = if err.is_nan() || worst.is_nan() {
                            f64::NAN
                        } else {
                            worst.max(err)
                        };
                    }
                }
                let tflops = 2.0 * (m * n * k) as f64 / t.as_secs_f64() / 1e12;
                let worst = if worst.is_finite() {
                    format!("{worst:.3e}")
                } else {
                    "null".into()
                };
                println!(
                    "{{\"sweep\":\"matmul\",\"dtype\":\"{dtype}\",\"m\":{m},\"k\":{k},\"n\":{n},\"variant\":\"{variant}\",\"ran\":\"{ran}\",\"tflops\":{tflops:.3},\"median_ns\":{},\"reps\":{},\"max_rel_err\":{worst}}}",
                    t.as_nanos(),
                    bench.reps
                );
            }
        }
    }
    println!("# matmul sweep done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
