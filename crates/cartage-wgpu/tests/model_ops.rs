//! The wgpu kernels of the model ops beyond the conformance suite: scatter-add stays exact when
//! every invocation hits one element (the atomic and compare-exchange paths, packed neighbours
//! untouched), 64-bit scatters neither tear nor lose carries (and f64 sums are refused), i64
//! keys sort, the
//! f64 kernels compile and compute where the adapter has SHADER_F64, and cross-entropy reports
//! a bad target through the index-check flags.

mod common;

use cartage_core::{Backend, DType, Element, Error, Kernel, NormKind, Op, ScanOp, ScatterMode, UnaryOp};
use common::{backend, download, empty, upload};
use half::f16;

#[test]
fn scatter_add_onto_one_element_counts_every_update() {
    let Some(b) = backend("scatter_add_onto_one_element_counts_every_update") else {
        return;
    };
    let n = 3000;
    let (ib, index) = upload(&b, &vec![1i32; n], &[n]);
    fn case<T: Element + Copy + PartialEq + std::fmt::Debug>(
        b: &std::sync::Arc<cartage_wgpu::WgpuBackend>,
        ib: &cartage_core::DeviceBuffer,
        index: &cartage_core::TensorArg,
        one: T,
        start: [T; 3],
        want: [T; 3],
    ) {
        let n = index.layout.numel();
        let (sb, src) = upload(b, &vec![one; n], &[n]);
        let (ob, out) = upload(b, &start, &[3]);
        Kernel::Scatter {
            mode: ScatterMode::Add,
            src,
            index: index.clone(),
            dim: 0,
            out: out.clone(),
        }
        .run(&[&sb, ib, &ob])
        .unwrap();
        b.synchronize().unwrap();
        assert_eq!(download::<T>(&ob, &out), want.to_vec(), "{}", T::DTYPE);
    }
    case(&b, &ib, &index, 1.0f32, [7.0, 0.5, 9.0], [7.0, 3000.5, 9.0]);
    case(&b, &ib, &index, -1i32, [7, 5, 9], [7, -2995, 9]);
    // u8 wraps: 3000 mod 256 = 184; its neighbours in the same word stay as they were.
    case(&b, &ib, &index, 1u8, [7, 0, 9], [7, 184, 9]);
    // f16 sums up to 2048 exactly; beyond, adding 1 rounds back to 2048 (ties to even).
    let h = f16::from_f32;
    case(
        &b,
        &ib,
        &index,
        h(1.0),
        [h(-1.0), h(0.0), h(2.0)],
        [h(-1.0), h(2048.0), h(2.0)],
    );
}

#[test]
fn sixty_four_bit_scatters_neither_tear_nor_lose_carries() {
    let Some(b) = backend("sixty_four_bit_scatters_neither_tear_nor_lose_carries") else {
        return;
    };
    let caps = b.capabilities();
    assert!(!caps.supports(Op::Scatter(ScatterMode::Add), DType::F64));
    assert!(caps.supports(Op::Scatter(ScatterMode::Add), DType::I64));
    assert!(caps.supports(Op::Scatter(ScatterMode::Assign), DType::I64));
    assert!(caps.supports(Op::Scan(ScanOp::Sum), DType::I64));
    // Every source lands on element 1: the sum carries out of the low word many times, and
    // the assignment must leave exactly one of the sources, both words from the same one.
    let n = 2000usize;
    let sources: Vec<i64> = (0..n as i64).map(|i| (i << 32) | 0xffff_fff0 | (i & 7)).collect();
    let (sb, src) = upload(&b, &sources, &[n]);
    let (ib, index) = upload(&b, &vec![1i32; n], &[n]);
    let start = [5i64, -3, 9];
    for mode in ScatterMode::ALL {
        let (ob, out) = upload(&b, &start, &[3]);
        Kernel::Scatter {
            mode,
            src: src.clone(),
            index: index.clone(),
            dim: 0,
            out: out.clone(),
        }
        .run(&[&sb, &ib, &ob])
        .unwrap();
        let got = download::<i64>(&ob, &out);
        assert_eq!((got[0], got[2]), (5, 9), "{mode:?}");
        match mode {
            ScatterMode::Add => {
                let want = sources.iter().fold(-3i64, |a, &v| a.wrapping_add(v));
                assert_eq!(got[1], want);
            }
            ScatterMode::Assign => assert!(sources.contains(&got[1]), "{got:?}"),
        }
    }
    // f64 scatter-add is refused with a typed error naming the missing atomics.
    let (fb, f) = upload(&b, &[1.0f64, 2.0, 3.0], &[3]);
    let (ob, out) = empty::<f64>(&b, &[3]);
    let (jb, j) = upload(&b, &[0i64, 1, 2], &[3]);
    match (Kernel::Scatter {
        mode: ScatterMode::Add,
        src: f,
        index: j,
        dim: 0,
        out,
    })
    .run(&[&fb, &jb, &ob])
    {
        Err(Error::Unsupported { dtype, reason, .. }) => {
            assert_eq!(dtype, Some(DType::F64));
            assert!(reason.contains("atomics") || reason.contains("SHADER_F64"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn i64_keys_sort_descending_and_stably() {
    let Some(b) = backend("i64_keys_sort_descending_and_stably") else {
        return;
    };
    let keys = [3i64, -1, i64::MIN, 2, 3, i64::MAX, -1, 1 << 40];
    let (xb, x) = upload(&b, &keys, &[8]);
    let (vb, values) = empty::<i64>(&b, &[8]);
    let (ob, indices) = empty::<i64>(&b, &[8]);
    Kernel::Sort {
        input: x,
        dim: 0,
        descending: true,
        values: values.clone(),
        indices: indices.clone(),
    }
    .run(&[&xb, &vb, &ob])
    .unwrap();
    assert_eq!(
        download::<i64>(&vb, &values),
        vec![i64::MAX, 1 << 40, 3, 3, 2, -1, -1, i64::MIN]
    );
    assert_eq!(download::<i64>(&ob, &indices), vec![5, 7, 0, 4, 3, 1, 6, 2]);
}

#[test]
fn f64_kernels_run_where_the_adapter_has_shader_f64() {
    let Some(b) = backend("f64_kernels_run_where_the_adapter_has_shader_f64") else {
        return;
    };
    let has_f64 = b.features().contains(wgpu::Features::SHADER_F64);
    for (op, wanted) in [
        (UnaryOp::Round, has_f64),
        (UnaryOp::Sign, has_f64),
        (UnaryOp::Sin, false),
    ] {
        assert_eq!(b.capabilities().supports(Op::Unary(op), DType::F64), wanted, "{op:?}");
    }
    assert!(!b.capabilities().supports(Op::CrossEntropy, DType::F64));
    if !has_f64 {
        eprintln!("SKIP wgpu/f64 kernels: the adapter lacks SHADER_F64");
        return;
    }
    let xs = [0.5f64, 1.5, 2.5, -0.5, -2.5, 3.7, -0.0, f64::INFINITY];
    let (xb, x) = upload(&b, &xs, &[8]);
    let (ob, out) = empty::<f64>(&b, &[8]);
    let unary = |op| {
        Kernel::Unary {
            op,
            input: x.clone(),
            out: out.clone(),
        }
        .run(&[&xb, &ob])
        .unwrap();
        download::<f64>(&ob, &out)
    };
    let round = unary(UnaryOp::Round);
    assert_eq!(round, vec![0.0, 2.0, 2.0, -0.0, -2.0, 4.0, -0.0, f64::INFINITY]);
    assert!(round[3].is_sign_negative() && round[6].is_sign_negative());
    assert_eq!(unary(UnaryOp::Sign), vec![1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -0.0, 1.0]);
    // Scan, sort and norm in f64.
    let ys = [1.0f64, 0.25, -1.0, 4.0];
    let (yb, y) = upload(&b, &ys, &[4]);
    let (sb, s) = empty::<f64>(&b, &[4]);
    Kernel::Scan {
        op: ScanOp::Sum,
        input: y.clone(),
        dim: 0,
        out: s.clone(),
    }
    .run(&[&yb, &sb])
    .unwrap();
    assert_eq!(download::<f64>(&sb, &s), vec![1.0, 1.25, 0.25, 4.25]);
    let (ib, idx) = empty::<i64>(&b, &[4]);
    Kernel::Sort {
        input: y.clone(),
        dim: 0,
        descending: false,
        values: s.clone(),
        indices: idx.clone(),
    }
    .run(&[&yb, &sb, &ib])
    .unwrap();
    assert_eq!(download::<f64>(&sb, &s), vec![-1.0, 0.25, 1.0, 4.0]);
    assert_eq!(download::<i64>(&ib, &idx), vec![2, 1, 0, 3]);
    Kernel::Norm {
        kind: NormKind::Rms,
        input: y,
        weight: None,
        bias: None,
        eps: 0.0,
        out: s.clone(),
    }
    .run(&[&yb, &sb])
    .unwrap();
    let rms = ((1.0 + 0.0625 + 1.0 + 16.0) / 4.0f64).sqrt();
    let got = download::<f64>(&sb, &s);
    for (g, v) in got.iter().zip(ys) {
        assert!((g - v / rms).abs() <= 1e-15 * (v / rms).abs(), "{got:?}");
    }
}

#[test]
fn a_bad_cross_entropy_target_is_an_index_error_at_the_next_sync() {
    let Some(b) = backend("a_bad_cross_entropy_target_is_an_index_error_at_the_next_sync") else {
        return;
    };
    let (lb, logits) = upload(&b, &[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    let (ob, out) = empty::<f32>(&b, &[2]);
    let run = |targets: &[i64]| {
        let (tb, target) = upload(&b, targets, &[2]);
        Kernel::CrossEntropy {
            logits: logits.clone(),
            target,
            ignore_index: -100,
            label_smoothing: 0.0,
            out: out.clone(),
        }
        .run(&[&lb, &tb, &ob])
        .and_then(|()| b.synchronize())
    };
    run(&[2, -100]).unwrap();
    let got = download::<f32>(&ob, &out);
    let lse = (1.0f64 + 1f64.exp() + 2f64.exp()).ln();
    assert!((f64::from(got[0]) - (lse - 2.0)).abs() < 1e-6, "{got:?}");
    assert_eq!(got[1], 0.0);
    match run(&[1, 3]) {
        Err(Error::IndexOutOfRange {
            op, index, dim, size, ..
        }) => assert_eq!((op, index, dim, size), ("cross_entropy", 3, 1, 3)),
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    // The error is reported once; the device stays usable.
    run(&[0, 1]).unwrap();
}

/// An op, its f64 reference, and the allowed relative and absolute errors.
type Check = (UnaryOp, fn(f64) -> f64, f64, f64);

#[test]
fn f32_functions_keep_their_accuracy_at_the_awkward_arguments() {
    let Some(b) = backend("f32_functions_keep_their_accuracy_at_the_awkward_arguments") else {
        return;
    };
    // Large sin/cos arguments (sinusoidal position embeddings), and log1p/expm1/erf where the
    // naive formulas cancel: relative precision near 0 and in the middle of the log1p range.
    let xs: Vec<f32> = vec![1000.5, -12345.678, 98765.43, 3.5, 1e-6, -3e-5, 0.3, -0.45, 0.9, 1e-20];
    let (xb, x) = upload(&b, &xs, &[xs.len()]);
    let (ob, out) = empty::<f32>(&b, &[xs.len()]);
    let cases: [Check; 5] = [
        (UnaryOp::Sin, f64::sin, 2e-6, 1e-6),
        (UnaryOp::Cos, f64::cos, 2e-6, 1e-6),
        (UnaryOp::Log1p, f64::ln_1p, 2e-6, 0.0),
        (UnaryOp::Expm1, f64::exp_m1, 2e-6, 0.0),
        (UnaryOp::Erf, libm_erf, 2e-6, 0.0),
    ];
    for (op, reference, rel, abs) in cases {
        Kernel::Unary {
            op,
            input: x.clone(),
            out: out.clone(),
        }
        .run(&[&xb, &ob])
        .unwrap();
        let got = download::<f32>(&ob, &out);
        for (&v, &g) in xs.iter().zip(&got) {
            if op == UnaryOp::Log1p && v <= -1.0 {
                continue;
            }
            let want = reference(f64::from(v));
            if f64::from(g) == want {
                continue;
            }
            let err = (f64::from(g) - want).abs();
            assert!(err <= abs + rel * want.abs(), "{op:?}({v}) = {g}, want {want}");
        }
    }
}

/// erf to double precision for |x| <= 5 (its Maclaurin series, summed until negligible), ±1
/// beyond.
fn libm_erf(x: f64) -> f64 {
    if x.abs() > 5.0 {
        return x.signum();
    }
    // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)), summed until negligible.
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}
