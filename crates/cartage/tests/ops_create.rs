//! Constructors against host-computed expectations, on the CPU and on every other device that
//! opens: linspace (exact endpoints), eye, zeros/ones/full_like, randint and randint_with,
//! rand_with/randn_with and the Generator stream, Tensor::new from nested arrays, and the
//! shape-checked reads to_vec2/to_vec3.

mod common;

use cartage::{DType, Device, Error, Generator, Result, Tensor};
use half::{bf16, f16};

/// The CPU and every other device that opens here.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device("ops_create"));
    devices
}

#[test]
fn linspace_hits_both_endpoints_exactly() -> Result<()> {
    for d in devices() {
        for (start, end, steps) in [(0.0, 1.0, 5usize), (-3.0, 0.1, 7), (0.1, 0.7, 3), (2.0, -2.0, 9)] {
            let x = Tensor::linspace(start, end, steps, DType::F64, &d)?.to_vec::<f64>()?;
            assert_eq!(x.len(), steps);
            assert_eq!(x[0], start);
            assert_eq!(x[steps - 1], end, "the last element is `end` itself");
            let step = (end - start) / (steps - 1) as f64;
            for (i, v) in x.iter().enumerate() {
                assert!((v - (start + i as f64 * step)).abs() <= 1e-12, "{x:?}");
            }
        }
        let f = Tensor::linspace(0.1, 0.7, 4, DType::F32, &d)?.to_vec::<f32>()?;
        assert_eq!((f[0], f[3]), (0.1f32, 0.7f32));
        assert_eq!(
            Tensor::linspace(2.0, 9.0, 1, DType::F32, &d)?.to_vec::<f32>()?,
            vec![2.0]
        );
        assert_eq!(Tensor::linspace(2.0, 9.0, 0, DType::F32, &d)?.shape(), &[0]);
        assert_eq!(
            Tensor::linspace(0.0, 10.0, 6, DType::I64, &d)?.to_vec::<i64>()?,
            vec![0, 2, 4, 6, 8, 10]
        );
    }
    assert!(matches!(
        Tensor::linspace(0.0, f64::NAN, 3, DType::F32, &Device::cpu()),
        Err(Error::InvalidArgument { op: "linspace", .. })
    ));
    Ok(())
}

#[test]
fn eye_and_like_constructors() -> Result<()> {
    for d in devices() {
        let n = 4;
        let expected: Vec<f32> = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect();
        assert_eq!(Tensor::eye(n, DType::F32, &d)?.to_vec::<f32>()?, expected);
        assert_eq!(
            Tensor::eye(2, DType::Bool, &d)?.to_vec::<bool>()?,
            vec![true, false, false, true]
        );
        assert_eq!(Tensor::eye(0, DType::I64, &d)?.shape(), &[0, 0]);

        let x = Tensor::arange(0.0, 6.0, 1.0, DType::I32, &d)?.reshape(&[2, 3])?.t()?;
        for (like, value) in [(x.zeros_like()?, 0), (x.ones_like()?, 1), (x.full_like(-4)?, -4)] {
            assert_eq!(like.shape(), &[3, 2]);
            assert_eq!(like.dtype(), DType::I32);
            assert_eq!(like.device(), d);
            assert!(!like.shares_storage(&x));
            assert_eq!(like.to_vec::<i32>()?, vec![value; 6]);
        }
        let h = Tensor::zeros(&[2], DType::F16, &d)?.full_like(0.5)?;
        assert_eq!(h.to_vec::<f16>()?, vec![f16::from_f32(0.5); 2]);
    }
    Ok(())
}

#[test]
fn randint_is_uniform_in_range_and_reproducible() -> Result<()> {
    for d in devices() {
        let (low, high) = (-3i64, 4i64);
        let n = 7000;
        let x = Tensor::randint(low, high, &[n], DType::I64, 11, &d)?.to_vec::<i64>()?;
        let mut counts = [0usize; 7];
        for v in &x {
            assert!((low..high).contains(v), "{v} outside [{low}, {high})");
            counts[(v - low) as usize] += 1;
        }
        // Each of the 7 values expects 1000 hits; 5 standard deviations is about ±150.
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
        let again = Tensor::randint(low, high, &[n], DType::I64, 11, &d)?.to_vec::<i64>()?;
        assert_eq!(x, again, "one seed, one draw");
        let other = Tensor::randint(low, high, &[n], DType::I64, 12, &d)?.to_vec::<i64>()?;
        assert_ne!(x, other);
        // Bounds beyond i32 are shifted in i64 on every device.
        let base = 1i64 << 40;
        let far = Tensor::randint(base, base + 5, &[64], DType::I64, 3, &d)?.to_vec::<i64>()?;
        assert!(far.iter().all(|v| (base..base + 5).contains(v)), "{far:?}");
        for dtype in [DType::I32, DType::F32, DType::U8] {
            let y = Tensor::randint(0, 5, &[64], dtype, 1, &d)?;
            assert_eq!(y.dtype(), dtype);
            assert!(
                y.to_vec_f64()?
                    .iter()
                    .all(|v| (0.0..5.0).contains(v) && v.fract() == 0.0)
            );
        }

        let mut rng = Generator::new(5);
        let a = Tensor::randint_with(0, 100, &[32], DType::I64, &mut rng, &d)?.to_vec::<i64>()?;
        assert_eq!(rng.offset(), 32);
        let b = Tensor::randint_with(0, 100, &[32], DType::I64, &mut rng, &d)?.to_vec::<i64>()?;
        assert_ne!(a, b, "the stream moved on");
        let mut replay = Generator::new(5);
        let a2 = Tensor::randint_with(0, 100, &[32], DType::I64, &mut replay, &d)?.to_vec::<i64>()?;
        assert_eq!(a, a2);
    }
    let d = Device::cpu();
    assert!(matches!(
        Tensor::randint(3, 3, &[2], DType::I64, 0, &d),
        Err(Error::InvalidArgument { op: "randint", .. })
    ));
    assert!(matches!(
        Tensor::randint(0, 2, &[2], DType::Bool, 0, &d),
        Err(Error::WrongDType { op: "randint", .. })
    ));
    Ok(())
}

#[test]
fn generator_streams_advance_and_replay() -> Result<()> {
    for d in devices() {
        let mut rng = Generator::new(42);
        let a = Tensor::rand_with(&[10], DType::F32, &mut rng, &d)?.to_vec::<f32>()?;
        // 10 counters round up to a whole Philox block of 4.
        assert_eq!(rng.offset(), 12);
        let b = Tensor::rand_with(&[10], DType::F32, &mut rng, &d)?.to_vec::<f32>()?;
        assert!(a.iter().chain(&b).all(|v| (0.0..1.0).contains(v)));
        assert_ne!(a, b);
        // The first draw of a fresh stream is the seed-per-call constructor's draw.
        assert_eq!(a, Tensor::rand(&[10], DType::F32, 42, &d)?.to_vec::<f32>()?);
        // Draws are disjoint: a stream started where `b` began gives `b`.
        let n = Tensor::randn_with(&[4000], DType::F32, &mut Generator::new(9), &d)?.to_vec::<f32>()?;
        let mean = n.iter().map(|&v| f64::from(v)).sum::<f64>() / n.len() as f64;
        let var = n.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n.len() as f64;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.1, "mean {mean}, var {var}");
        let mut g = Generator::new(9);
        let first = Tensor::randn_with(&[8], DType::F32, &mut g, &d)?.to_vec::<f32>()?;
        assert_eq!(first[..], n[..8]);
        let second = Tensor::randn_with(&[8], DType::F32, &mut g, &d)?.to_vec::<f32>()?;
        assert_eq!(second[..], n[8..16]);
        assert!(matches!(
            Tensor::rand_with(&[2], DType::I64, &mut g, &d),
            Err(Error::WrongDType { .. })
        ));
    }
    Ok(())
}

#[test]
fn new_builds_from_nested_arrays() -> Result<()> {
    for d in devices() {
        let v = Tensor::new([1i64, -2, 3], &d)?;
        assert_eq!((v.shape(), v.dtype()), (&[3usize][..], DType::I64));
        assert_eq!(v.to_vec::<i64>()?, vec![1, -2, 3]);
        let m = Tensor::new([[1.5f64, 2.0], [3.0, 4.0], [5.0, 6.0]], &d)?;
        assert_eq!(m.shape(), &[3, 2]);
        assert_eq!(
            m.to_vec2::<f64>()?,
            vec![vec![1.5, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]]
        );
        let cube = [[[true, false]], [[false, true]]];
        let c = Tensor::new(cube, &d)?;
        assert_eq!(c.shape(), &[2, 1, 2]);
        let nested: Vec<Vec<Vec<bool>>> = cube.iter().map(|m| m.iter().map(|r| r.to_vec()).collect()).collect();
        assert_eq!(c.to_vec3::<bool>()?, nested);
        let h = Tensor::new([bf16::from_f32(1.0), bf16::from_f32(-2.0)], &d)?;
        assert_eq!(h.dtype(), DType::BF16);
        assert_eq!(Tensor::new([[0u8; 0]; 3], &d)?.shape(), &[3, 0]);
        assert_eq!(
            Tensor::new([[7i32; 2]; 0], &d)?.to_vec2::<i32>()?,
            Vec::<Vec<i32>>::new()
        );

        // to_vec2/to_vec3 read strided views in logical order.
        let t = Tensor::new([[1i32, 2, 3], [4, 5, 6]], &d)?.t()?;
        assert_eq!(t.to_vec2::<i32>()?, vec![vec![1, 4], vec![2, 5], vec![3, 6]]);
        let e = Tensor::zeros(&[2, 0, 3], DType::F32, &d)?;
        assert_eq!(e.to_vec3::<f32>()?, vec![Vec::<Vec<f32>>::new(); 2]);
        let z = Tensor::zeros(&[2, 0], DType::F32, &d)?;
        assert_eq!(z.to_vec2::<f32>()?, vec![Vec::<f32>::new(); 2]);
    }
    let d = Device::cpu();
    let v = Tensor::new([1.0f32, 2.0], &d)?;
    match v.to_vec2::<f32>() {
        Err(e @ Error::InvalidArgument { op: "to_vec2", .. }) => assert!(e.to_string().contains("[2]"), "{e}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(matches!(
        v.reshape(&[1, 2])?.to_vec3::<f32>(),
        Err(Error::InvalidArgument { op: "to_vec3", .. })
    ));
    assert!(matches!(
        v.reshape(&[1, 2])?.to_vec2::<f64>(),
        Err(Error::DTypeMismatch { op: "to_vec2", .. })
    ));
    Ok(())
}
