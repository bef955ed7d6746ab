//! The precision section's error: how far a matmul in f32, TF32, f16 or bf16 lands from the
//! exact product, beside how fast it runs (LESSONS R24, R32).
//!
//! Both operands are drawn on the host in f32 (normal values from a fixed seed), moved to the
//! device and converted to the dtype measured, multiplied there, and read back. The reference is
//! the product of the same f32 operands in f64 on the host, over [`SAMPLED_ROWS`] rows spread
//! evenly across the result (every column of each). The error is normwise: the largest
//! difference from the reference divided by the largest reference entry, so an entry that
//! happens to sum to nearly zero does not turn a rounding into an infinite relative error. For
//! f16 and bf16 it includes rounding the operands to the dtype, as a user converting f32 data
//! sees it.

use cartage::{DType, Device, MatmulPrecision, Tensor};

use super::cases::{Case, Section, Task};
use super::report::Row;

/// The counter a precision row's error is stored under (cartage's and the reference's).
pub const COUNTER: &str = "max_rel_error";

/// Rows of the product compared with the f64 reference.
pub const SAMPLED_ROWS: usize = 64;

/// Measure a precision row's error and store it in its counters; a failure is logged and
/// leaves the row without an error (its timing stands).
pub fn attach(row: &mut Row, task: &Task, device: &Device) {
    if task.section != Section::Precision {
        return;
    }
    let Case::Matmul { n, tf32 } = task.case else { return };
    let Some(dtype) = DType::from_name(&task.dtype) else {
        return;
    };
    match error(n, dtype, tf32, device) {
        Ok(e) => {
            row.counters.insert(COUNTER.into(), e);
        }
        Err(e) => tracing::warn!(task = %task.id, "matmul error not measured: {e}"),
    }
}

/// The normwise error of an `n × n` matmul in `dtype` (with TF32 when `tf32`) on `device`.
pub fn error(n: usize, dtype: DType, tf32: bool, device: &Device) -> cartage::Result<f64> {
    let (a, b) = (normal(n * n, 1), normal(n * n, 2));
    let upload = |x: &[f32]| Tensor::from_slice(x, &[n, n], device)?.to_dtype(dtype);
    let (da, db) = (upload(&a)?, upload(&b)?);
    if tf32 {
        cartage::set_matmul_precision(device, MatmulPrecision::High)?;
    }
    let product = da.matmul(&db).and_then(|c| c.to_vec_f64());
    if tf32 {
        cartage::set_matmul_precision(device, MatmulPrecision::Highest)?;
    }
    Ok(normwise(&product?, &a, &b, n))
}

/// Largest |c − exact| over largest |exact| on the sampled rows, exact computed in f64.
pub fn normwise(c: &[f64], a: &[f32], b: &[f32], n: usize) -> f64 {
    let (mut worst, mut largest) = (0.0f64, 0.0f64);
    let mut exact = vec![0.0f64; n];
    for i in sampled_rows(n) {
        exact.iter_mut().for_each(|e| *e = 0.0);
        for k in 0..n {
            let aik = f64::from(a[i * n + k]);
            for (e, &bkj) in exact.iter_mut().zip(&b[k * n..(k + 1) * n]) {
                *e += aik * f64::from(bkj);
            }
        }
        for (j, &e) in exact.iter().enumerate() {
            worst = worst.max((c[i * n + j] - e).abs());
            largest = largest.max(e.abs());
        }
    }
    if largest > 0.0 { worst / largest } else { worst }
}

/// [`SAMPLED_ROWS`] row indices spread evenly over `0..n` (all of them when `n` is smaller).
fn sampled_rows(n: usize) -> Vec<usize> {
    let count = SAMPLED_ROWS.min(n);
    let mut rows: Vec<usize> = (0..count).map(|i| i * n / count.max(1)).collect();
    rows.dedup();
    rows
}

/// `len` standard normal f32 values from `seed` (xorshift and Box–Muller: reproducible, no
/// dependency on any backend's generator).
fn normal(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..len)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_grows_as_the_mantissa_shrinks() {
        let cpu = Device::cpu();
        let n = 96;
        let f32_error = error(n, DType::F32, false, &cpu).unwrap();
        let f16_error = error(n, DType::F16, false, &cpu).unwrap();
        let bf16_error = error(n, DType::BF16, false, &cpu).unwrap();
        // f32 keeps 24 bits, f16 11 and bf16 8: each step loses orders of magnitude.
        assert!(f32_error > 0.0 && f32_error < 1e-5, "f32: {f32_error}");
        assert!(f16_error > 1e-5 && f16_error < 1e-2, "f16: {f16_error}");
        assert!(bf16_error > f16_error && bf16_error < 5e-2, "bf16: {bf16_error}");
    }

    #[test]
    fn the_reference_is_exact_for_an_exact_product() {
        let n = 3;
        let a: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let identity: Vec<f32> = (0..9).map(|i| if i % 4 == 0 { 1.0 } else { 0.0 }).collect();
        let c: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
        assert_eq!(normwise(&c, &a, &identity, n), 0.0);
        let mut off = c.clone();
        off[4] += 0.8;
        assert!(
            (normwise(&off, &a, &identity, n) - 0.1).abs() < 1e-12,
            "0.8 off an entry of 8 at most"
        );
    }

    #[test]
    fn rows_are_sampled_evenly_and_once() {
        assert_eq!(sampled_rows(4), [0, 1, 2, 3]);
        let rows = sampled_rows(4096);
        assert_eq!(rows.len(), SAMPLED_ROWS);
        assert_eq!((rows[0], rows[1], rows[63]), (0, 64, 4032));
    }
}
