//! scaled_dot_product_attention's gradients on `cuda:0` through the fused path (the flash forward
//! writing its log-sum-exp, then the tiled backward reading it and the saved output) against the
//! composed formula (forced by an all-true mask) in f32 on the same bf16/f16-rounded inputs:
//! causal and not, L ≠ S, lengths that are no multiple of any tile (1, 77, 300), head dims 64
//! and 128, and q, k and v as strided slices of one packed `[B, L, 3, H, E]` tensor. The same in
//! f32 (the f32 flash kernels on the CUDA cores, head dims 32 to 128) against the composed
//! formula on `cuda:0` and on the CPU, to about 10⁻⁵. Then the saved output written in place
//! refuses the backward, and an ignored timing test reports the fused forward and forward +
//! backward times.
//!
//! Without `cuda:0` every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes that a failure.

mod common;

use std::time::Instant;

use cartage::{DType, Device, DeviceKind, Error, Op, Result, Tensor, Var};

/// One attention call: batch, heads, query and key lengths, head dim, mask, and whether q, k
/// and v are slices of one packed tensor (then L = S).
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    l: usize,
    s: usize,
    e: usize,
    causal: bool,
    packed: bool,
}

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

/// A tensor of `shape` on `device` in `compute`, from values rounded to `dtype` first.
fn operand(shape: &[usize], seed: u64, dtype: DType, compute: DType, device: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed), shape, &Device::cpu())?
        .to_dtype(dtype)?
        .to_dtype(compute)?
        .to(device)
}

/// The gradients of `Σ y·r` with respect to the variables (q, k, v, or the packed qkv) as f64,
/// computed on `device` in `compute` from inputs rounded to `dtype`; with `composed`, through
/// the composed formula (an all-true mask keeps the fused kernels out).
fn gradients(c: Case, dtype: DType, compute: DType, device: &Device, composed: bool) -> Result<Vec<Vec<f64>>> {
    let (b, h, l, s, e) = (c.b, c.h, c.l, c.s, c.e);
    let (vars, [q, k, v]) = if c.packed {
        let qkv = Var::new(operand(&[b, l, 3, h, e], 1, dtype, compute, device)?)?;
        let part = |i: isize| qkv.tensor().select(2, i)?.transpose(1, 2);
        let parts = [part(0)?, part(1)?, part(2)?];
        (vec![qkv], parts)
    } else {
        let vars = vec![
            Var::new(operand(&[b, h, l, e], 1, dtype, compute, device)?)?,
            Var::new(operand(&[b, h, s, e], 2, dtype, compute, device)?)?,
            Var::new(operand(&[b, h, s, e], 3, dtype, compute, device)?)?,
        ];
        let parts = [vars[0].tensor(), vars[1].tensor(), vars[2].tensor()];
        (vars, parts)
    };
    // A zero mask that needs its own gradient: the composed path, which records the mask's add.
    let zero_mask = if composed {
        Some(Var::new(Tensor::zeros(&[l, s], q.dtype(), device)?)?.tensor())
    } else {
        None
    };
    // Scores of a few units: the softmax neither flat nor one-hot.
    let scale = Some(2.0 / (e as f64).sqrt());
    let y = Tensor::scaled_dot_product_attention(&q, &k, &v, zero_mask.as_ref(), c.causal, scale)?;
    let r = operand(y.shape(), 4, dtype, compute, device)?;
    y.mul(&r)?.sum_all()?.backward()?;
    vars.iter()
        .map(|var| match var.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>(),
            None => Ok(vec![]),
        })
        .collect()
}

/// The largest difference relative to the largest reference magnitude (at least 10⁻³: with one
/// key, P = 1 and the query and key gradients are zero up to round-off), and that magnitude.
fn worst(got: &[f64], want: &[f64]) -> (f64, f64) {
    if got.len() != want.len() {
        return (f64::INFINITY, 0.0);
    }
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| if a.is_finite() { (a - b).abs() } else { f64::INFINITY })
        .fold(0.0, f64::max);
    (diff / scale, scale)
}

/// `cuda:0` with the fused attention forward listed for `dtype`, or `None` after a SKIP line (a
/// failure under `CARTAGE_REQUIRE=cuda`).
fn cuda(test: &str, dtype: DType) -> Option<Device> {
    let device = Device::cuda(0);
    match cartage::backend(&device) {
        Ok(b) => {
            let fused = b.capabilities().supports(Op::Attention, dtype)
                && b.capabilities().supports(Op::AttentionBackward, dtype);
            assert!(fused, "{test}: cuda:0 lists no fused attention for {dtype}");
            Some(device)
        }
        Err(e) => {
            assert!(
                !common::required(DeviceKind::Cuda),
                "{test}: CARTAGE_REQUIRE names cuda but {device} did not open: {e}"
            );
            common::device_missing(test, &device, &e);
            None
        }
    }
}

fn cases() -> Vec<Case> {
    let case = |b, h, l, s, e, causal, packed| Case {
        b,
        h,
        l,
        s,
        e,
        causal,
        packed,
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        for e in [64, 128] {
            cases.extend([
                case(2, 3, 128, 128, e, causal, false),
                case(1, 2, 1, 1, e, causal, false),
                case(2, 2, 77, 77, e, causal, true),
                case(1, 3, 300, 300, e, causal, true),
                case(2, 2, 77, 300, e, causal, false),
                case(2, 2, 300, 77, e, causal, false),
                case(1, 2, 1, 200, e, causal, false),
                case(1, 1, 257, 1, e, causal, false),
            ]);
        }
    }
    cases
}

/// Every case in bf16 and f16 against f32 from the same rounded inputs: within a few units of
/// the dtype's rounding of the largest gradient (each product rounds P and dS to the dtype once).
#[test]
fn fused_gradients_match_the_composed_formula_in_f32() -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        let Some(device) = cuda("attention_backward/fused_gradients", dtype) else {
            return Ok(());
        };
        let tolerance = if dtype == DType::BF16 { 3e-2 } else { 5e-3 };
        for c in cases() {
            let got = gradients(c, dtype, dtype, &device, false)?;
            let want = gradients(c, dtype, DType::F32, &device, true)?;
            for (n, (g, w)) in got.iter().zip(&want).enumerate() {
                let (err, scale) = worst(g, w);
                assert!(
                    err <= tolerance,
                    "{dtype} {c:?} gradient {n}: worst difference {err:.3e} of the largest magnitude {scale:.3e}"
                );
            }
        }
    }
    Ok(())
}

/// In f32 the fused path (the f32 flash kernels) agrees with the composed formula on `cuda:0`
/// and on the CPU to about 10⁻⁵ of the largest gradient magnitude (both compute with exact f32
/// products): head dims 32, 64, 80 and 128, and 96 once, over the same shapes as the 16-bit
/// cases.
#[test]
fn f32_fused_gradients_match_the_composed_path_and_the_cpu() -> Result<()> {
    let Some(device) = cuda("attention_backward/f32_fused_gradients", DType::F32) else {
        return Ok(());
    };
    let mut cases: Vec<Case> = cases().into_iter().filter(|c| c.e == 64).collect();
    for causal in [false, true] {
        for e in [32, 80, 96, 128] {
            cases.push(Case {
                b: 2,
                h: 2,
                l: 77,
                s: 130,
                e,
                causal,
                packed: false,
            });
        }
        cases.push(Case {
            b: 1,
            h: 2,
            l: 130,
            s: 130,
            e: 80,
            causal,
            packed: true,
        });
    }
    for c in cases {
        let got = gradients(c, DType::F32, DType::F32, &device, false)?;
        let composed = gradients(c, DType::F32, DType::F32, &device, true)?;
        let cpu = gradients(c, DType::F32, DType::F32, &Device::cpu(), false)?;
        // With one key the query and key gradients are zero up to round-off: each gradient is
        // judged against at least a tenth of the largest magnitude of them all.
        let largest = composed.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (against, want) in [("cuda:0 composed", &composed), ("cpu", &cpu)] {
            for (n, (g, w)) in got.iter().zip(want).enumerate() {
                let scale = w.iter().fold(0.1 * largest, |m, v| m.max(v.abs()));
                let err = if g.len() == w.len() {
                    let diff = |(a, b): (&f64, &f64)| if a.is_finite() { (a - b).abs() } else { f64::INFINITY };
                    g.iter().zip(w).map(diff).fold(0.0, f64::max) / scale
                } else {
                    f64::INFINITY
                };
                assert!(
                    err <= 1e-5,
                    "f32 {c:?} gradient {n} against {against}: worst difference {err:.3e} of {scale:.3e}"
                );
            }
        }
    }
    Ok(())
}

/// The fused backward keeps the forward's output: writing it in place refuses the backward.
#[test]
fn writing_the_saved_output_refuses_the_backward() -> Result<()> {
    let Some(device) = cuda("attention_backward/saved_output", DType::BF16) else {
        return Ok(());
    };
    let shape = [1, 2, 16, 64];
    let q = Var::new(operand(&shape, 1, DType::BF16, DType::BF16, &device)?)?;
    let k = operand(&shape, 2, DType::BF16, DType::BF16, &device)?;
    let v = operand(&shape, 3, DType::BF16, DType::BF16, &device)?;
    let y = Tensor::scaled_dot_product_attention(&q.tensor(), &k, &v, None, true, None)?;
    let loss = y.to_dtype(DType::F32)?.sum_all()?;
    y.detach().copy_from(&Tensor::zeros(&shape, DType::BF16, &device)?)?;
    match loss.backward() {
        Err(Error::ModifiedInPlace { op, .. }) => assert_eq!(op, "scaled_dot_product_attention"),
        other => panic!("expected ModifiedInPlace, got {other:?}"),
    }
    Ok(())
}

/// Milliseconds per call of `f` (after warm-up), the device drained before and after.
fn time_ms(device: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    cartage::synchronize(device)?;
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    cartage::synchronize(device)?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / iters as f64)
}

/// Forward and forward + backward times of causal bf16 and f32 attention, for comparison with
/// other implementations on the same device: `cargo test --release --test attention_backward_devices
/// -- --ignored --nocapture`.
#[test]
#[ignore = "a timing report, not a check"]
fn report_fused_attention_times() -> Result<()> {
    let Some(device) = cuda("attention_backward/timing", DType::BF16) else {
        return Ok(());
    };
    let runs = [
        (DType::BF16, [8, 16, 1024, 64]),
        (DType::BF16, [4, 8, 512, 128]),
        (DType::BF16, [8, 16, 1024, 128]),
        (DType::F32, [8, 16, 512, 64]),
        (DType::F32, [8, 16, 1024, 64]),
        (DType::F32, [4, 8, 512, 128]),
    ];
    for (dtype, [b, h, l, e]) in runs {
        let shape = [b, h, l, e];
        let make = |seed| operand(&shape, seed, dtype, dtype, &device);
        let (q, k, v) = (make(1)?, make(2)?, make(3)?);
        let forward = time_ms(&device, 20, || {
            Tensor::scaled_dot_product_attention(&q, &k, &v, None, true, None).map(drop)
        })?;
        let (qv, kv, vv) = (Var::new(q.clone())?, Var::new(k.clone())?, Var::new(v.clone())?);
        let grad = Tensor::ones(&shape, dtype, &device)?;
        let both = time_ms(&device, 20, || {
            let y = Tensor::scaled_dot_product_attention(&qv.tensor(), &kv.tensor(), &vv.tensor(), None, true, None)?;
            y.backward_with(Some(&grad), false)?;
            for var in [&qv, &kv, &vv] {
                var.zero_grad();
            }
            Ok(())
        })?;
        let y = Tensor::scaled_dot_product_attention(&qv.tensor(), &kv.tensor(), &vv.tensor(), None, true, None)?;
        let backward = time_ms(&device, 20, || {
            y.backward_with(Some(&grad), true)?;
            for var in [&qv, &kv, &vv] {
                var.zero_grad();
            }
            Ok(())
        })?;
        let flops = 4.0 * (b * h * l * l * e) as f64 / 2.0;
        eprintln!(
            "TIMING cartage sdpa causal {dtype} {shape:?}: fwd {forward:.3} ms ({:.1} TFLOP/s), fwd+bwd {both:.3} ms \
             ({:.1} TFLOP/s), bwd alone {backward:.3} ms",
            flops / forward / 1e9,
            3.5 * flops / both / 1e9
        );
    }
    Ok(())
}
