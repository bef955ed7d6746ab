//! `Tensor::scaled_dot_product_attention_packed` against the three views of the same packed
//! tensor through `Tensor::scaled_dot_product_attention` (forward values and the gradient of the
//! packed tensor), causal and not: in f32 on the CPU (the composed path), under bf16 autocast on
//! the CPU, and on `wgpu:0` and `cuda:0` (the fused kernels; a SKIP line without the device, a
//! failure when `CARTAGE_REQUIRE` names it). Then the one recorded node and the errors for bad
//! input.

mod common;

use cartage::{DType, Device, DeviceKind, Error, Op, Result, Tensor, Var};

/// `n` deterministic values in [-1, 1) (an LCG).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
        })
        .collect()
}

/// Batch, positions, heads, head size, causal.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    t: usize,
    h: usize,
    e: usize,
    causal: bool,
}

/// The output `[B, T, H·E]` and the gradient of `Σ y·r` with respect to `qkv` `[B, T, 3·H·E]`
/// (values rounded to `dtype`), both as f64, on `device` in `dtype`: with `packed` through the
/// packed op, else through the three views `[B, H, T, E]` of the same tensor and the unpacked op.
fn run(c: Case, dtype: DType, device: &Device, packed: bool) -> Result<(Vec<f64>, Vec<f64>)> {
    let (b, t, h, e) = (c.b, c.t, c.h, c.e);
    let width = 3 * h * e;
    let host = Tensor::from_vec(values(b * t * width, 1), &[b, t, width], &Device::cpu())?;
    let qkv = Var::new(host.to_dtype(dtype)?.to(device)?)?;
    // Scores of a few units: the softmax neither flat nor one-hot.
    let scale = Some(2.0 / (e as f64).sqrt());
    let y = if packed {
        Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), h, None, c.causal, scale)?
    } else {
        let split = qkv.tensor().reshape(&[b, t, 3, h, e])?;
        let part = |i: isize| split.select(2, i)?.transpose(1, 2);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        Tensor::scaled_dot_product_attention(&q, &k, &v, None, c.causal, scale)?
            .transpose(1, 2)?
            .reshape(&[b, t, h * e])?
    };
    assert_eq!(y.shape(), &[b, t, h * e], "{c:?}");
    let r = Tensor::from_vec(values(y.numel(), 2), y.shape(), &Device::cpu())?
        .to_dtype(dtype)?
        .to(device)?;
    y.mul(&r)?.sum_all()?.backward()?;
    let grad = qkv.grad().expect("qkv has a gradient");
    assert_eq!(grad.shape(), &[b, t, width], "{c:?}");
    assert_eq!(grad.dtype(), dtype, "{c:?}");
    Ok((
        y.to_dtype(DType::F64)?.to_vec::<f64>()?,
        grad.to_dtype(DType::F64)?.to_vec::<f64>()?,
    ))
}

/// The largest difference relative to the largest reference magnitude (at least 10⁻³).
fn worst(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| if a.is_finite() { (a - b).abs() } else { f64::INFINITY })
        .fold(0.0, f64::max)
        / scale
}

/// The packed op against the three views on `device` in `dtype`, and in f32 on the CPU, for
/// every case: `tolerance` relative to the largest magnitude.
fn compare(device: &Device, dtype: DType, cases: &[Case], tolerance: f64) -> Result<()> {
    for &c in cases {
        let (y, g) = run(c, dtype, device, true)?;
        let (y_views, g_views) = run(c, dtype, device, false)?;
        let (y_cpu, g_cpu) = run(c, DType::F32, &Device::cpu(), false)?;
        for (what, got, want) in [
            ("output against the views", &y, &y_views),
            ("gradient against the views", &g, &g_views),
            ("output against the cpu", &y, &y_cpu),
            ("gradient against the cpu", &g, &g_cpu),
        ] {
            let err = worst(got, want);
            assert!(
                err <= tolerance,
                "{device} {dtype} {c:?}: {what}: worst difference {err:.3e} (tolerance {tolerance:.0e})"
            );
        }
    }
    Ok(())
}

fn small_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            Case {
                b: 2,
                t: 5,
                h: 3,
                e: 4,
                causal,
            },
            Case {
                b: 1,
                t: 1,
                h: 1,
                e: 8,
                causal,
            },
            Case {
                b: 3,
                t: 9,
                h: 2,
                e: 16,
                causal,
            },
        ]);
    }
    cases
}

#[test]
fn cpu_packed_attention_matches_the_three_views() -> Result<()> {
    compare(&Device::cpu(), DType::F32, &small_cases(), 1e-5)
}

/// Under bf16 autocast an f32 `qkv` is lowered on entry: a bf16 output, an f32 gradient of
/// `qkv`'s shape, within bf16 rounding of the f32 result.
#[test]
fn cpu_packed_attention_under_autocast_lowers_qkv() -> Result<()> {
    let cpu = Device::cpu();
    let c = Case {
        b: 2,
        t: 6,
        h: 2,
        e: 8,
        causal: true,
    };
    let (_, want) = run(c, DType::F32, &cpu, true)?;
    let width = 3 * c.h * c.e;
    let qkv = Var::new(Tensor::from_vec(
        values(c.b * c.t * width, 1),
        &[c.b, c.t, width],
        &cpu,
    )?)?;
    let y = {
        let _bf16 = cartage::autocast(&cpu, DType::BF16)?;
        Tensor::scaled_dot_product_attention_packed(
            &qkv.tensor(),
            c.h,
            None,
            c.causal,
            Some(2.0 / (c.e as f64).sqrt()),
        )?
    };
    assert_eq!(y.dtype(), DType::BF16);
    let r = Tensor::from_vec(values(y.numel(), 2), y.shape(), &cpu)?;
    y.to_dtype(DType::F32)?.mul(&r)?.sum_all()?.backward()?;
    let grad = qkv.grad().expect("qkv has a gradient");
    assert_eq!((grad.shape(), grad.dtype()), (&[c.b, c.t, width][..], DType::F32));
    let err = worst(&grad.to_dtype(DType::F64)?.to_vec::<f64>()?, &want);
    assert!(err <= 5e-2, "bf16 autocast gradient: worst difference {err:.3e}");
    Ok(())
}

/// `device` when it opens and lists the fused attention forward and backward for f32, else
/// `None` after a SKIP line (a failure when `CARTAGE_REQUIRE` names its kind).
fn open(test: &str, device: Device) -> Option<Device> {
    match cartage::backend(&device) {
        Ok(b) => {
            let caps = b.capabilities();
            assert!(
                caps.supports(Op::Attention, DType::F32) && caps.supports(Op::AttentionBackward, DType::F32),
                "{test}: {device} lists no fused f32 attention"
            );
            Some(device)
        }
        Err(e) => {
            assert!(
                !common::required(device.kind()),
                "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                device.kind().name()
            );
            common::device_missing(test, &device, &e);
            None
        }
    }
}

/// On wgpu the fused kernels run for f32, f16 and bf16, with head sizes up to 128.
#[test]
fn wgpu_packed_attention_matches_the_three_views() -> Result<()> {
    let Some(device) = open("attention_packed/wgpu", Device::wgpu(0)) else {
        return Ok(());
    };
    let mut cases = small_cases();
    for causal in [false, true] {
        cases.push(Case {
            b: 2,
            t: 33,
            h: 2,
            e: 64,
            causal,
        });
    }
    compare(&device, DType::F32, &cases, 1e-4)?;
    compare(&device, DType::BF16, &cases[..2], 3e-2)
}

/// On CUDA: f32 (head sizes 32 to 128), bf16 and f16 (head sizes 64 and 128), lengths that are
/// no multiple of any tile.
#[test]
fn cuda_packed_attention_matches_the_three_views() -> Result<()> {
    let Some(device) = open("attention_packed/cuda", Device::cuda(0)) else {
        return Ok(());
    };
    assert_eq!(device.kind(), DeviceKind::Cuda);
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            Case {
                b: 2,
                t: 77,
                h: 3,
                e: 64,
                causal,
            },
            Case {
                b: 1,
                t: 300,
                h: 2,
                e: 128,
                causal,
            },
            Case {
                b: 2,
                t: 1,
                h: 2,
                e: 64,
                causal,
            },
        ]);
    }
    compare(&device, DType::F32, &cases, 1e-4)?;
    compare(&device, DType::BF16, &cases, 3e-2)?;
    compare(&device, DType::F16, &cases, 5e-3)
}

/// One node, named after the op, whose one input is `qkv`; a `qkv` without a gradient records
/// nothing.
#[test]
fn the_packed_op_is_one_node() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::from_vec(values(2 * 4 * 12, 3), &[2, 4, 12], &cpu)?;
    let qkv = Var::new(x.clone())?;
    let y = Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), 2, None, true, None)?;
    assert_eq!(y.grad_fn(), Some("scaled_dot_product_attention_packed"));
    let plain = Tensor::scaled_dot_product_attention_packed(&x, 2, None, true, None)?;
    assert_eq!(plain.grad_fn(), None);
    assert_eq!(plain.to_vec::<f32>()?, y.to_vec::<f32>()?);
    // Under no_grad nothing is recorded either.
    let quiet = {
        let _off = cartage::no_grad();
        Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), 2, None, true, None)?
    };
    assert_eq!(quiet.grad_fn(), None);
    Ok(())
}

#[test]
fn bad_packed_input_is_refused_with_what_to_check() -> Result<()> {
    let cpu = Device::cpu();
    let f = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &cpu);
    let sdpa = Tensor::scaled_dot_product_attention_packed;
    let invalid = |r: Result<Tensor>, needle: &str| match r {
        Err(Error::InvalidArgument { op, reason }) => {
            assert_eq!(op, "scaled_dot_product_attention_packed");
            assert!(reason.contains(needle), "{reason:?} should mention {needle:?}");
        }
        other => panic!("expected InvalidArgument mentioning {needle:?}, got {other:?}"),
    };
    invalid(sdpa(&f(&[4, 12])?, 2, None, false, None), "rank 2");
    invalid(sdpa(&f(&[1, 4, 3, 12])?, 2, None, false, None), "rank 4");
    invalid(sdpa(&f(&[1, 4, 12])?, 0, None, false, None), "heads must be at least 1");
    invalid(
        sdpa(&f(&[1, 4, 10])?, 2, None, false, None),
        "multiple of 3 · heads = 6",
    );
    invalid(sdpa(&f(&[1, 4, 0])?, 1, None, false, None), "multiple of 3 · heads = 3");
    invalid(
        sdpa(&f(&[1, 4, 12])?, 2, None, false, Some(f64::NAN)),
        "scale must be finite",
    );
    match sdpa(&Tensor::zeros(&[1, 4, 12], DType::I32, &cpu)?, 2, None, false, None) {
        Err(Error::WrongDType { op, dtype, .. }) => {
            assert_eq!((op, dtype), ("scaled_dot_product_attention_packed", DType::I32));
        }
        other => panic!("expected WrongDType, got {other:?}"),
    }
    Ok(())
}

/// The output and the gradients of `qkv` (and of the mask, when it is a variable) of `Σ y·r`
/// with `mask`, through the packed op or the three views, on `device` in f32.
fn run_masked(device: &Device, mask: &Tensor, causal: bool, packed: bool, mask_var: bool) -> Result<Vec<Vec<f64>>> {
    let (b, t, h, e) = (2, 9, 2, 8);
    let width = 3 * h * e;
    let qkv = Var::new(Tensor::from_vec(values(b * t * width, 5), &[b, t, width], device)?)?;
    let mask_var = mask_var.then(|| Var::new(mask.clone())).transpose()?;
    let mask = mask_var.as_ref().map_or_else(|| mask.clone(), Var::tensor);
    let y = if packed {
        Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), h, Some(&mask), causal, None)?
    } else {
        let split = qkv.tensor().reshape(&[b, t, 3, h, e])?;
        let part = |i: isize| split.select(2, i)?.transpose(1, 2);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), causal, None)?
            .transpose(1, 2)?
            .reshape(&[b, t, h * e])?
    };
    let r = Tensor::from_vec(values(y.numel(), 6), y.shape(), device)?;
    y.mul(&r)?.sum_all()?.backward()?;
    let host = |t: &Tensor| {
        t.to_vec::<f32>()
            .map(|v| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>())
    };
    let mut out = vec![host(&y)?, host(&qkv.grad().expect("qkv has a gradient"))?];
    if let Some(var) = &mask_var {
        out.push(host(&var.grad().expect("the mask has a gradient"))?);
    }
    Ok(out)
}

#[test]
fn a_mask_gives_what_the_three_views_give() -> Result<()> {
    let (b, t) = (2, 9);
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices("attention_packed/masked"));
    for device in all {
        // Key padding [B, 1, 1, T]: the second sequence has 5 real tokens.
        let padding: Vec<bool> = (0..b * t).map(|i| i % t < [t, 5][i / t]).collect();
        let padding = Tensor::from_slice(&padding, &[b, 1, 1, t], &device)?;
        // A float bias [T, T] with query row 3 removing every key (that row gives 0).
        let bias: Vec<f32> = values(t * t, 7)
            .iter()
            .enumerate()
            .map(|(i, &x)| if i / t == 3 { f32::NEG_INFINITY } else { x })
            .collect();
        let bias = Tensor::from_vec(bias, &[t, t], &device)?;
        for causal in [false, true] {
            for (name, mask, mask_var) in [
                ("padding", &padding, false),
                ("bias", &bias, false),
                ("bias variable", &bias, true),
            ] {
                let what = format!("{device} {name} causal {causal}");
                let got = run_masked(&device, mask, causal, true, mask_var)?;
                let want = run_masked(&device, mask, causal, false, mask_var)?;
                for (part, (g, w)) in ["output", "qkv gradient", "mask gradient"]
                    .iter()
                    .zip(got.iter().zip(&want))
                {
                    let err = worst(g, w);
                    assert!(err <= 1e-5, "{what}: {part} off by {err}");
                }
            }
        }
    }
    Ok(())
}
