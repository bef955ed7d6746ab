//! Element-wise math through the frontend on every device that opens here (the CPU, plus wgpu
//! or CUDA when compiled in), against expectations computed on the host in f64: the new unary
//! functions, clamps, activations, NaN/inf tests, logical ops, `lerp` and the `std::ops`
//! operators, on strided and broadcast inputs, and their refusals of bad input.

mod common;

use cartage::prelude::*;
use cartage::{Error, ErrorKind};

/// i64 integers on `device`.
fn ints(values: &[i64], shape: &[usize], device: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, shape, device)
}

/// Integer values read back (exact below 2^53).
fn int_values(t: &Tensor) -> Result<Vec<i64>> {
    Ok(t.to_vec_f64()?.into_iter().map(|v| v as i64).collect())
}

fn devices(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device(test));
    devices
}

/// A `[n/2, 2]` f32 tensor whose elements (row-major) are `values`, as a transposed view
/// (strided, read in place), plus the values it holds widened to f64.
fn strided(values: &[f32], device: &Device) -> Result<(Tensor, Vec<f64>)> {
    assert!(values.len().is_multiple_of(2));
    let k = values.len() / 2;
    let mut storage = vec![0f32; values.len()];
    for i in 0..k {
        for j in 0..2 {
            storage[j * k + i] = values[i * 2 + j];
        }
    }
    let x = Tensor::from_slice(&storage, &[2, k], device)?.t()?;
    assert!(!x.is_contiguous());
    Ok((x, values.iter().map(|&v| v as f64).collect()))
}

/// Equal within `tol` (relative, plus the same absolute), NaN matching NaN, infinities exact.
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (all: {got:?} vs {want:?})"
        );
    }
}

fn kind(result: Result<Tensor>) -> ErrorKind {
    match result {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e.kind(),
    }
}

/// erf by its Taylor series (|x| < 3) or the asymptotic tail: close to f64 precision.
fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
        if n > 200.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// A function computed on the host.
type Host = fn(f64) -> f64;

/// A tensor method of no argument.
type Method = fn(&Tensor) -> Result<Tensor>;

#[test]
fn unary_functions_match_the_host_on_strided_inputs() -> Result<()> {
    let general: &[f32] = &[-2.5, -1.5, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 3.7, -20.0, 25.0];
    let special: &[f32] = &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
    let positive: &[f32] = &[0.25, 0.5, 1.0, 2.0, 4.0, 9.0, 100.0, 1e-3];
    let cases: [(&str, Method, Host, &[f32]); 15] = [
        ("sin", Tensor::sin, f64::sin, general),
        ("cos", Tensor::cos, f64::cos, general),
        ("floor", Tensor::floor, f64::floor, general),
        ("ceil", Tensor::ceil, f64::ceil, general),
        ("round", Tensor::round, f64::round_ties_even, general),
        ("trunc", Tensor::trunc, f64::trunc, general),
        (
            "sign",
            Tensor::sign,
            |x| if x == 0.0 || x.is_nan() { x } else { x.signum() },
            general,
        ),
        ("rsqrt", Tensor::rsqrt, |x| 1.0 / x.sqrt(), positive),
        ("recip", Tensor::recip, |x| 1.0 / x, general),
        ("square", Tensor::square, |x| x * x, general),
        ("erf", Tensor::erf, erf, general),
        ("log1p", Tensor::log1p, f64::ln_1p, positive),
        ("expm1", Tensor::expm1, f64::exp_m1, general),
        ("silu", Tensor::silu, |x| x / (1.0 + (-x).exp()), general),
        (
            "softplus",
            Tensor::softplus,
            |x| if x > 20.0 { x } else { x.exp().ln_1p() },
            general,
        ),
    ];
    for device in devices("unary_functions") {
        for (name, op, host, values) in cases {
            for input in [values, special] {
                let (x, xs) = strided(input, &device)?;
                let got = op(&x)?;
                assert_eq!(got.shape(), x.shape(), "{name}");
                assert_eq!(got.dtype(), DType::F32, "{name}");
                let want: Vec<f64> = xs.iter().map(|&v| host(v) as f32 as f64).collect();
                // GPU math libraries may be a few ulp off the correctly rounded value.
                let tol = if device.is_cpu() { 2e-6 } else { 1e-4 };
                assert_close(&format!("{name} on {device}"), &got.to_vec_f64()?, &want, tol);
            }
        }
        // Signed zeros: round(-0.5) and sign(-0.0) are -0.0.
        let z = Tensor::from_slice(&[-0.5f32, -0.0], &[2], &device)?;
        let r = z.round()?.to_vec::<f32>()?;
        assert!(r[0] == 0.0 && r[0].is_sign_negative(), "round(-0.5) = {}", r[0]);
        assert!(z.sign()?.to_vec::<f32>()?[1].is_sign_negative());
        // rsqrt and recip of zero are +inf.
        let zero = Tensor::zeros(&[1], DType::F32, &device)?;
        assert_eq!(zero.rsqrt()?.to_vec::<f32>()?, vec![f32::INFINITY]);
        assert_eq!(zero.recip()?.to_vec::<f32>()?, vec![f32::INFINITY]);
    }
    Ok(())
}

#[test]
fn integer_unary_ops_are_identity_or_exact_and_never_views() -> Result<()> {
    for device in devices("integer_unary") {
        let values = [-7i64, -1, 0, 3, 1 << 40];
        let x = ints(&values, &[5], &device)?;
        for (name, op) in [
            ("floor", Tensor::floor as Method),
            ("ceil", Tensor::ceil),
            ("round", Tensor::round),
            ("trunc", Tensor::trunc),
        ] {
            let y = op(&x)?;
            assert_eq!(y.dtype(), DType::I64, "{name}");
            assert_eq!(int_values(&y)?, values, "{name} on {device}");
            assert!(!y.shares_storage(&x), "{name} returns a fresh copy");
        }
        assert_eq!(int_values(&x.sign()?)?, vec![-1, -1, 0, 1, 1]);
        let squares: Vec<i64> = values.iter().map(|v| v.wrapping_mul(*v)).collect();
        assert_eq!(x.square()?.to_vec::<i64>()?, squares);
        let small = Tensor::from_slice(&[-3i32, 4, 46341], &[3], &device)?;
        assert_eq!(small.sign()?.to_vec::<i32>()?, vec![-1, 1, 1]);
        assert_eq!(
            small.square()?.to_vec::<i32>()?,
            vec![9, 16, 46341i32.wrapping_mul(46341)]
        );
        // Float-only functions refuse integers, naming the op and the dtype.
        for (name, op) in [
            ("sin", Tensor::sin as Method),
            ("erf", Tensor::erf),
            ("rsqrt", Tensor::rsqrt),
            ("softplus", Tensor::softplus),
        ] {
            let err = op(&x).unwrap_err();
            assert!(
                matches!(err, Error::WrongDType { op, dtype, .. } if op == name && dtype == DType::I64),
                "{err}"
            );
        }
        let flags = Tensor::from_slice(&[true], &[1], &device)?;
        assert_eq!(kind(flags.floor()), ErrorKind::WrongDType);
    }
    Ok(())
}

#[test]
fn clamps_broadcast_and_keep_nan() -> Result<()> {
    for device in devices("clamps") {
        let (x, xs) = strided(&[-3.0, -0.5, 0.0, 0.25, 2.0, f32::NAN, f32::INFINITY, -1.0], &device)?;
        let clamp = |v: f64, lo: f64, hi: f64| if v.is_nan() { v } else { v.max(lo).min(hi) };
        let want: Vec<f64> = xs.iter().map(|&v| clamp(v, -1.0, 1.0)).collect();
        assert_close("clamp", &x.clamp(-1.0, 1.0)?.to_vec_f64()?, &want, 0.0);
        assert_close("hardtanh", &x.hardtanh(-1.0, 1.0)?.to_vec_f64()?, &want, 0.0);
        let want: Vec<f64> = xs.iter().map(|&v| clamp(v, 0.0, f64::INFINITY)).collect();
        assert_close("clamp_min", &x.clamp_min(0.0)?.to_vec_f64()?, &want, 0.0);
        assert_close("maximum_scalar", &x.maximum_scalar(0.0f32)?.to_vec_f64()?, &want, 0.0);
        let want: Vec<f64> = xs.iter().map(|&v| clamp(v, f64::NEG_INFINITY, 0.5)).collect();
        assert_close("clamp_max", &x.clamp_max(0.5)?.to_vec_f64()?, &want, 0.0);
        assert_close("minimum_scalar", &x.minimum_scalar(0.5)?.to_vec_f64()?, &want, 0.0);
        // lo > hi gives hi everywhere (PyTorch), but hardtanh refuses it.
        let want: Vec<f64> = xs.iter().map(|&v| if v.is_nan() { v } else { -2.0 }).collect();
        assert_close("clamp lo > hi", &x.clamp(3.0, -2.0)?.to_vec_f64()?, &want, 0.0);
        let err = x.hardtanh(3.0, -2.0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "hardtanh", .. }), "{err}");
        assert!(err.to_string().contains('3') && err.to_string().contains("-2"), "{err}");

        // Tensor bounds broadcast: x [4, 2], lo [2] (a row), hi [4, 1] (a column).
        let lo = Tensor::from_slice(&[-0.5f32, 0.0], &[2], &device)?;
        let hi = Tensor::from_slice(&[0.0f32, 1.0, 1.5, 0.1], &[4, 1], &device)?;
        let got = x.clamp_tensor(&lo, &hi)?;
        assert_eq!(got.shape(), &[4, 2]);
        let want: Vec<f64> = (0..8)
            .map(|i| {
                let (r, c) = (i / 2, i % 2);
                let (l, h) = ([-0.5, 0.0][c], [0.0, 1.0, 1.5, 0.1f32 as f64][r]);
                clamp(xs[i], l, h)
            })
            .collect();
        assert_close("clamp_tensor", &got.to_vec_f64()?, &want, 0.0);
        let bad = Tensor::from_slice(&[0.0f32; 3], &[3], &device)?;
        assert_eq!(kind(x.clamp_tensor(&bad, &hi)), ErrorKind::ShapeMismatch);
        let wrong_dtype = Tensor::from_slice(&[0i64, 1], &[2], &device)?;
        assert_eq!(kind(x.clamp_tensor(&wrong_dtype, &hi)), ErrorKind::DTypeMismatch);

        // Integers: bounds convert to the tensor's dtype.
        let whole = ints(&[-5, 0, 7], &[3], &device)?;
        assert_eq!(int_values(&whole.clamp(-1, 2.7)?)?, vec![-1, 0, 2]);
    }
    Ok(())
}

#[test]
fn activations_match_the_host() -> Result<()> {
    for device in devices("activations") {
        let (x, xs) = strided(&[-3.0, -0.5, 0.0, 0.25, 2.0, f32::NAN, -20.0, 5.0], &device)?;
        let want: Vec<f64> = xs.iter().map(|&v| if v > 0.0 { v } else { 0.1f64 * v }).collect();
        assert_close("leaky_relu", &x.leaky_relu(0.1)?.to_vec_f64()?, &want, 1e-6);
        let want: Vec<f64> = xs.iter().map(|&v| if v > 0.0 { v } else { 1.5 * v.exp_m1() }).collect();
        assert_close("elu", &x.elu(1.5)?.to_vec_f64()?, &want, 1e-6);
        let ints = Tensor::from_slice(&[1i64], &[1], &device)?;
        assert_eq!(kind(ints.leaky_relu(0.1)), ErrorKind::WrongDType);
        assert_eq!(kind(ints.elu(1.0)), ErrorKind::WrongDType);
    }
    Ok(())
}

#[test]
fn nan_and_inf_tests_on_every_dtype() -> Result<()> {
    for device in devices("nan_inf") {
        let values = [1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MAX, 7e4];
        let x = Tensor::from_slice(&values, &[7], &device)?;
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let x = x.to_dtype(dtype)?;
            // The expectation is of the values as stored: f32::MAX overflows to inf in f16 and
            // bf16, 7e4 in f16 only.
            let held = x.to_vec_f64()?;
            let want = |f: fn(f64) -> bool| -> Vec<bool> { held.iter().map(|&v| f(v)).collect() };
            assert_eq!(
                x.isnan()?.to_vec::<bool>()?,
                want(f64::is_nan),
                "isnan {dtype} on {device}"
            );
            assert_eq!(
                x.isinf()?.to_vec::<bool>()?,
                want(f64::is_infinite),
                "isinf {dtype} on {device}"
            );
            assert_eq!(
                x.isfinite()?.to_vec::<bool>()?,
                want(f64::is_finite),
                "isfinite {dtype} on {device}"
            );
            let infinities = want(f64::is_infinite).iter().filter(|&&b| b).count();
            assert_eq!(
                infinities,
                if dtype == DType::F16 {
                    4
                } else if dtype == DType::BF16 {
                    3
                } else {
                    2
                }
            );
        }
        // A broadcast view (stride 0) of a column is read in place.
        let col = Tensor::from_slice(&[f32::NAN, 2.0], &[2, 1], &device)?.broadcast_to(&[2, 3])?;
        assert_eq!(
            col.isnan()?.to_vec::<bool>()?,
            vec![true, true, true, false, false, false]
        );
        assert_eq!(col.isfinite()?.shape(), &[2, 3]);
        // Integers and bool hold no NaN or infinity.
        // (Answered without a kernel, so i64 works even where it has no arithmetic.)
        let ints = Tensor::from_slice(&[i64::MAX, 0], &[2], &device)?;
        assert_eq!(ints.isnan()?.to_vec::<bool>()?, vec![false, false]);
        assert_eq!(ints.isinf()?.to_vec::<bool>()?, vec![false, false]);
        assert_eq!(ints.isfinite()?.to_vec::<bool>()?, vec![true, true]);
        let bytes = Tensor::from_slice(&[255u8, 0], &[1, 2], &device)?.broadcast_to(&[3, 2])?;
        assert_eq!(bytes.isfinite()?.shape(), &[3, 2]);
        assert_eq!(bytes.isnan()?.to_vec::<bool>()?, vec![false; 6]);
        let flags = Tensor::from_slice(&[true, false], &[2], &device)?;
        assert_eq!(flags.isfinite()?.to_vec::<bool>()?, vec![true, true]);
    }
    Ok(())
}

#[test]
fn logical_ops_convert_to_bool_and_broadcast() -> Result<()> {
    for device in devices("logical") {
        let a = Tensor::from_slice(&[true, false], &[2, 1], &device)?;
        let b = Tensor::from_slice(&[0.0f32, 2.0, f32::NAN], &[3], &device)?;
        let truthy_b = [false, true, true];
        let expect = |f: fn(bool, bool) -> bool| -> Vec<bool> {
            [true, false]
                .iter()
                .flat_map(|&x| truthy_b.iter().map(move |&y| f(x, y)))
                .collect()
        };
        let and = a.logical_and(&b)?;
        assert_eq!(and.shape(), &[2, 3]);
        assert_eq!(and.dtype(), DType::Bool);
        assert_eq!(and.to_vec::<bool>()?, expect(|x, y| x && y));
        assert_eq!(a.logical_or(&b)?.to_vec::<bool>()?, expect(|x, y| x || y));
        assert_eq!(a.logical_xor(&b)?.to_vec::<bool>()?, expect(|x, y| x != y));
        assert_eq!(b.logical_not()?.to_vec::<bool>()?, vec![true, false, false]);
        assert_eq!(a.logical_not()?.to_vec::<bool>()?, vec![false, true]);
        let ints = ints(&[0, -4, 9, 0], &[2, 2], &device)?.t()?;
        let u = Tensor::from_slice(&[1u8, 0], &[2], &device)?;
        // ints (transposed) is [[0, 9], [-4, 0]].
        assert_eq!(ints.logical_and(&u)?.to_vec::<bool>()?, vec![false, false, true, false]);
        assert_eq!(ints.logical_or(&u)?.to_vec::<bool>()?, vec![true, true, true, false]);
        let bad = Tensor::from_slice(&[true; 4], &[4], &device)?;
        assert_eq!(
            kind(a.logical_and(&bad.reshape(&[4, 1])?.broadcast_to(&[4, 3])?)),
            ErrorKind::ShapeMismatch
        );
        let err = b.logical_or(&bad).unwrap_err();
        assert!(matches!(err, Error::ShapeMismatch { op: "logical_or", .. }), "{err}");
    }
    Ok(())
}

#[test]
fn lerp_with_scalar_and_tensor_weights() -> Result<()> {
    for device in devices("lerp") {
        let (start, s) = strided(&[0.0, 1.0, -2.0, 4.0], &device)?;
        let end = Tensor::from_slice(&[10.0f32, -1.0], &[2], &device)?;
        let e = [10.0, -1.0];
        let got = start.lerp(&end, 0.25)?;
        let want: Vec<f64> = (0..4).map(|i| s[i] + 0.25 * (e[i % 2] - s[i])).collect();
        assert_close("lerp scalar", &got.to_vec_f64()?, &want, 1e-6);
        let w = Tensor::from_slice(&[0.0f32, 0.5, 1.0], &[3, 1, 1], &device)?;
        let got = start.lerp(&end, &w)?;
        assert_eq!(got.shape(), &[3, 2, 2]);
        let want: Vec<f64> = (0..12)
            .map(|i| {
                let (k, j) = (i / 4, i % 4);
                let wk = [0.0, 0.5, 1.0][k];
                s[j] + wk * (e[j % 2] - s[j])
            })
            .collect();
        assert_close("lerp tensor", &got.to_vec_f64()?, &want, 1e-6);
        let ints = Tensor::from_slice(&[1i64, 2], &[2], &device)?;
        assert_eq!(kind(ints.lerp(&ints, 0.5)), ErrorKind::WrongDType);
        let wide = end.to_dtype(DType::F64)?;
        let err = start.lerp(&wide, 0.5).unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { op: "lerp", .. }), "{err}");
    }
    Ok(())
}

#[test]
fn operators_follow_the_methods() -> Result<()> {
    for device in devices("operators") {
        let (a, av) = strided(&[1.0, -2.0, 3.0, 4.0], &device)?;
        let b = Tensor::from_slice(&[10.0f32, 20.0], &[2], &device)?;
        let bv = [10.0, 20.0];
        let pair = |f: fn(f64, f64) -> f64| -> Vec<f64> { (0..4).map(|i| f(av[i], bv[i % 2])).collect() };
        assert_close("&a + &b", &(&a + &b)?.to_vec_f64()?, &pair(|x, y| x + y), 1e-6);
        assert_close("&a - b", &(&a - b.clone())?.to_vec_f64()?, &pair(|x, y| x - y), 1e-6);
        assert_close("a * &b", &(a.clone() * &b)?.to_vec_f64()?, &pair(|x, y| x * y), 1e-6);
        assert_close(
            "a / b",
            &(a.clone() / b.clone())?.to_vec_f64()?,
            &pair(|x, y| x / y),
            1e-6,
        );
        let each = |f: fn(f64) -> f64| -> Vec<f64> { av.iter().map(|&x| f(x)).collect() };
        assert_close("&a * 2.0", &(&a * 2.0)?.to_vec_f64()?, &each(|x| x * 2.0), 1e-6);
        assert_close("&a + 1f32", &(&a + 1f32)?.to_vec_f64()?, &each(|x| x + 1.0), 1e-6);
        assert_close("&a - 3i32", &(&a - 3i32)?.to_vec_f64()?, &each(|x| x - 3.0), 1e-6);
        assert_close("a / 4i64", &(a.clone() / 4i64)?.to_vec_f64()?, &each(|x| x / 4.0), 1e-6);
        assert_close("1.0 - &a", &(1.0 - &a)?.to_vec_f64()?, &each(|x| 1.0 - x), 1e-6);
        assert_close("8.0 / &a", &(8.0 / &a)?.to_vec_f64()?, &each(|x| 8.0 / x), 1e-6);
        assert_close("2 * a", &(2i64 * a.clone())?.to_vec_f64()?, &each(|x| 2.0 * x), 1e-6);
        assert_close("-&a", &(-&a)?.to_vec_f64()?, &each(|x| -x), 0.0);
        // Result operands chain without a `?` at each step.
        let chained = ((&a + &b) * &b - &a)?;
        assert_close("chain", &chained.to_vec_f64()?, &pair(|x, y| (x + y) * y - x), 1e-6);
        let chained = (&a * ((&b + &b) / &b)?)?;
        assert_close("chain right", &chained.to_vec_f64()?, &pair(|x, _| x * 2.0), 1e-6);
        // Integers: scalars convert to the dtype; integer division truncates.
        let i = ints(&[7, -7], &[2], &device)?;
        assert_eq!(int_values(&(&i / 2)?)?, vec![3, -3]);
        assert_eq!(int_values(&(100 - &i)?)?, vec![93, 107]);
        // Errors are those of the methods, through every form.
        let err = (&a + &i).unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { op: "add", .. }), "{err}");
        let failed: Result<Tensor> = Err(Error::invalid("test", "an earlier step failed"));
        assert!(matches!(failed * &a, Err(Error::InvalidArgument { op: "test", .. })));
        let c = Tensor::zeros(&[3], DType::F32, &device)?;
        assert_eq!(kind(&a + &c), ErrorKind::ShapeMismatch);
    }
    Ok(())
}

#[test]
fn mixed_devices_are_refused_by_name() -> Result<()> {
    let Some(other) = common::second_device("mixed_devices") else {
        return Ok(());
    };
    let a = Tensor::ones(&[2], DType::F32, &Device::cpu())?;
    let b = Tensor::ones(&[2], DType::F32, &other)?;
    let err = a.logical_and(&b).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "logical_and", .. }), "{err}");
    let err = a.lerp(&b, &b).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeviceMismatch);
    assert_eq!(kind(a.clamp_tensor(&b, &b)), ErrorKind::DeviceMismatch);
    assert_eq!(kind(&a + &b), ErrorKind::DeviceMismatch);
    Ok(())
}
