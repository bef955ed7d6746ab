//! Every matmul variant a sweep tries (`WgpuBackend::matmul_variant_names`) gives the exact
//! product of small integers in f32, f16 and bf16, and reports the kernel that really ran: a
//! cooperative-matrix variant runs as itself only where the adapter has cooperative matrices
//! (else, as on lavapipe, the tiled kernel), and only on a problem that fits its block.

mod common;

use cartage_core::{DType, Element, ErrorKind, TensorArg};
use common::{backend, download, empty, upload};
use half::{bf16, f16};

/// `[batch, m, k] × [batch, k, n]` of integers in -4..=4, whose products and sums of `k` terms
/// are exact in every dtype here (below 2048); returns the product as f64s and what ran.
fn product<T: Element>(
    b: &std::sync::Arc<cartage_wgpu::WgpuBackend>,
    variant: &str,
    (batch, m, k, n): (usize, usize, usize, usize),
    from: fn(f64) -> T,
) -> (Vec<f64>, Vec<f64>, String) {
    let value = |i: usize, salt: usize| ((i * 7 + salt * 13) % 9) as f64 - 4.0;
    let av: Vec<f64> = (0..batch * m * k).map(|i| value(i, 1)).collect();
    let bv: Vec<f64> = (0..batch * k * n).map(|i| value(i / 3, 2)).collect();
    let (ab, a) = upload(b, &av.iter().map(|&x| from(x)).collect::<Vec<T>>(), &[batch, m, k]);
    let (bb, bt) = upload(b, &bv.iter().map(|&x| from(x)).collect::<Vec<T>>(), &[batch, k, n]);
    let (cb, c): (_, TensorArg) = empty::<T>(b, &[batch, m, n]);
    // SAFETY: the operands are views of `ab`, `bb` and `cb`, alive until after the read below.
    let ran = unsafe { b.matmul_with_variant(&a, &bt, &c, variant) }.unwrap();
    let got: Vec<f64> = download::<T>(&cb, &c).iter().map(|x| x.to_f64()).collect();
    drop((ab, bb));
    let mut want = vec![0.0; batch * m * n];
    for z in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want[(z * m + i) * n + j] = (0..k).map(|p| av[(z * m + i) * k + p] * bv[(z * k + p) * n + j]).sum();
            }
        }
    }
    (got, want, ran)
}

fn check<T: Element>(dtype: DType, from: fn(f64) -> T) {
    let Some(b) = backend(&format!("every_matmul_variant_is_exact_{dtype}")) else {
        return;
    };
    // A multiple of every cooperative block (256 × 256, K a multiple of 32).
    let dims = (2, 256, 64, 256);
    let names = b.matmul_variant_names(dtype);
    assert!(names.iter().any(|v| v.starts_with("tiled:")), "{names:?}");
    let coop = dtype == DType::F16 && b.has_cooperative_matrices();
    assert_eq!(names.iter().any(|v| v.starts_with("coop:")), coop, "{names:?}");
    for variant in &names {
        let (got, want, ran) = product(&b, variant, dims, from);
        eprintln!("{dtype} {variant}: ran {ran} on {}", b.adapter_info().name);
        if variant.starts_with("coop:") {
            assert_eq!(&ran, variant, "a cooperative variant on an adapter that has them");
        } else {
            assert!(ran.starts_with("tiled:"), "{variant} ran {ran}");
        }
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(bad.is_none(), "{dtype} {variant} (ran {ran}): C[{bad:?}] differs");
    }
}

#[test]
fn every_f32_matmul_variant_is_exact() {
    check(DType::F32, |x| x as f32);
}

#[test]
fn every_f16_matmul_variant_is_exact() {
    check(DType::F16, f16::from_f64);
}

#[test]
fn every_bf16_matmul_variant_is_exact() {
    check(DType::BF16, bf16::from_f64);
}

#[test]
fn cooperative_variants_fall_back_to_tiles_where_they_cannot_run() {
    let Some(b) = backend("cooperative_variants_fall_back_to_tiles_where_they_cannot_run") else {
        return;
    };
    // 96 × 80 fits no cooperative block; 256 × 256 fits every one but runs tiled without
    // cooperative matrices.
    for (dims, fits) in [((1, 96, 32, 80), false), ((1, 256, 32, 256), true)] {
        for variant in ["coop:direct", "coop:128x128x32/64x32:2", "coop:64x64x32/32x32:2"] {
            let (got, want, ran) = product(&b, variant, dims, f16::from_f64);
            if fits && b.has_cooperative_matrices() {
                assert_eq!(ran, variant);
            } else {
                assert!(ran.starts_with("tiled:"), "{variant} on {dims:?} ran {ran}");
            }
            assert!(got == want, "{variant} on {dims:?} (ran {ran})");
        }
    }
    let path = b.f16_matmul_path();
    assert_eq!(path.starts_with("cooperative"), b.has_cooperative_matrices(), "{path}");
}

#[test]
fn a_misspelt_variant_is_a_typed_error() {
    let Some(b) = backend("a_misspelt_variant_is_a_typed_error") else {
        return;
    };
    let (_ab, a) = upload(&b, &[1.0f32; 16], &[1, 4, 4]);
    let (_cb, c) = empty::<f32>(&b, &[1, 4, 4]);
    for bad in ["tiles:128x64x16/8x4", "coop:128x128", "tiled:128x64x16/8x4:3x"] {
        // SAFETY: the operands are views of `_ab` and `_cb`, alive for the whole call.
        let e = unsafe { b.matmul_with_variant(&a, &a, &c, bad) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
}
