//! Helpers shared by the CUDA row-kernel tests: opening `cuda:0` (a SKIP line without it, a
//! failure under `CARTAGE_REQUIRE=cuda`), deterministic inputs rounded to their dtype, and
//! uploads and read-backs of f32, bf16, f16 and i64 buffers; [`attention`] for the attention
//! tests.

#![allow(dead_code)]

pub mod attention;

use std::sync::Arc;

use cartage_core::{Backend, DType, DeviceBuffer, Layout, TensorArg};
use half::{bf16, f16};

/// True when `CARTAGE_REQUIRE` names cuda.
pub fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE")
        .map(|v| v.split(',').any(|k| k.trim() == "cuda"))
        .unwrap_or(false)
}

/// `cuda:0`, or `None` after one SKIP line per binary (a panic when cuda is required).
pub fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    match cartage_cuda::open(0) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !required(),
                "CARTAGE_REQUIRE names cuda but {test} cannot open cuda:0: {e}"
            );
            cartage_core::testsuite::skip::device_missing(&format!("cuda/{test}"), "cuda:0", &e.to_string());
            None
        }
    }
}

/// Deterministic values in [-4, 4) (an LCG), rounded to `dtype`.
pub fn values(n: usize, seed: u64, dtype: DType) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = ((state >> 40) as f64 / (1u64 << 24) as f64) * 8.0 - 4.0;
            round(v, dtype)
        })
        .collect()
}

/// `v` rounded to `dtype` (bf16, f16, else f32).
pub fn round(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F16 => f16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

/// A buffer holding `v` in `dtype` (bf16, f16, i64, else f32).
pub fn upload(b: &Arc<dyn Backend>, v: &[f64], dtype: DType) -> DeviceBuffer {
    let bytes: Vec<u8> = match dtype {
        DType::BF16 => v.iter().flat_map(|&x| bf16::from_f64(x).to_le_bytes()).collect(),
        DType::F16 => v.iter().flat_map(|&x| f16::from_f64(x).to_le_bytes()).collect(),
        DType::I64 => v.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
        _ => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
    };
    let buf = DeviceBuffer::new(b, bytes.len().max(1)).expect("alloc");
    buf.write(0, &bytes).expect("write");
    buf
}

/// A poisoned output: every element NaN, so an element left unwritten fails the comparison.
pub fn poisoned(b: &Arc<dyn Backend>, n: usize, dtype: DType) -> DeviceBuffer {
    upload(b, &vec![f64::NAN; n], dtype)
}

/// `n` elements of `dtype` (bf16, f16, else f32) read back as f64.
pub fn download(buf: &DeviceBuffer, n: usize, dtype: DType) -> Vec<f64> {
    let mut bytes = vec![0u8; n * dtype.size_in_bytes()];
    buf.read(0, &mut bytes).expect("read");
    match dtype {
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::F16 => bytes
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        _ => bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
    }
}

/// The contiguous operand of `shape` in `buf`.
pub fn arg(buf: &DeviceBuffer, shape: &[usize], dtype: DType) -> TensorArg {
    buf.arg(Layout::contiguous(shape).expect("layout"), dtype)
}

/// Assert every element is within `tol` of the reference, relative to its scale:
/// `|got - want| / (1 + |want|) ≤ tol`.
pub fn check_within(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        assert!(err <= tol, "{what}: element {i}: got {g}, want {w} (error {err:e})");
    }
}
