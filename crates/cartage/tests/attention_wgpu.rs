//! scaled_dot_product_attention on `wgpu:0` through the fused kernels (the forward writing its
//! log-sum-exp, the backward reading it and the saved output), against the composed path on
//! the same device (forced by an all-true mask: scores and probabilities materialised) and
//! against the CPU, forward output and the gradients of q, k and v: causal and not, L ≠ S,
//! head dims 32, 64, 80 and 128, Ev ≠ E, several batch entries and heads, lengths that are no
//! multiple of any tile, one key, and q, k and v as strided slices of one packed tensor; f32
//! within 2·10⁻⁵ of the largest magnitude, f16 and bf16 against f32 from the same rounded
//! inputs within their rounding. Then the fused gradients against central finite differences
//! on a tiny case. An ignored test reports the fused and composed times on the adapter.
//!
//! Without `wgpu:0` every test prints a SKIP line; `CARTAGE_REQUIRE=wgpu` makes it fail.

mod common;

use std::time::Instant;

use cartage::{DType, Device, DeviceKind, Op, Result, Tensor, Var};

/// One attention call: batch, heads, query and key lengths, head dims, mask, and whether q, k
/// and v are slices of one packed `[B, L, 3, H, E]` tensor (then L = S and Ev = E).
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
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

/// The output of attention and the gradients of `Σ y·r` with respect to the variables (q, k,
/// v, or the packed qkv), as f64, computed on `device` in `compute` from inputs rounded to
/// `dtype`; `composed` adds an all-true mask, which sends the frontend to the composed path.
fn run(c: Case, dtype: DType, compute: DType, device: &Device, composed: bool) -> Result<Vec<Vec<f64>>> {
    let (b, h, l, s, e, ev) = (c.b, c.h, c.l, c.s, c.e, c.ev);
    let (vars, [q, k, v]) = if c.packed {
        let qkv = Var::new(operand(&[b, l, 3, h, e], 1, dtype, compute, device)?)?;
        let part = |i: isize| qkv.tensor().select(2, i)?.transpose(1, 2);
        let parts = [part(0)?, part(1)?, part(2)?];
        (vec![qkv], parts)
    } else {
        let vars = vec![
            Var::new(operand(&[b, h, l, e], 1, dtype, compute, device)?)?,
            Var::new(operand(&[b, h, s, e], 2, dtype, compute, device)?)?,
            Var::new(operand(&[b, h, s, ev], 3, dtype, compute, device)?)?,
        ];
        let parts = [vars[0].tensor(), vars[1].tensor(), vars[2].tensor()];
        (vars, parts)
    };
    // A zero mask that needs its own gradient: the composed path, which records the mask's add.
    let mask = match composed {
        true => Some(Var::new(Tensor::zeros(&[l, s], q.dtype(), device)?)?.tensor()),
        false => None,
    };
    // Scores of a few units: the softmax neither flat nor one-hot.
    let scale = Some(2.0 / (e as f64).sqrt());
    let y = Tensor::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), c.causal, scale)?;
    let r = operand(y.shape(), 4, dtype, compute, device)?;
    y.mul(&r)?.sum_all()?.backward()?;
    let mut out = vec![y.to_dtype(DType::F64)?.to_vec::<f64>()?];
    for var in &vars {
        out.push(match var.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>()?,
            None => vec![],
        });
    }
    Ok(out)
}

/// The largest difference relative to the largest reference magnitude (at least `floor`), and
/// that magnitude.
fn worst(got: &[f64], want: &[f64], floor: f64) -> (f64, f64) {
    if got.len() != want.len() {
        return (f64::INFINITY, 0.0);
    }
    let scale = want.iter().fold(floor, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| if a.is_finite() { (a - b).abs() } else { f64::INFINITY })
        .fold(0.0, f64::max);
    (diff / scale, scale)
}

/// `wgpu:0` with both fused attention kernels listed for `dtype`, or `None` after a SKIP line
/// (a failure under `CARTAGE_REQUIRE=wgpu`).
fn wgpu(test: &str, dtype: DType) -> Option<Device> {
    let device = Device::wgpu(0);
    match cartage::backend(&device) {
        Ok(b) => {
            let fused = b.capabilities().supports(Op::Attention, dtype)
                && b.capabilities().supports(Op::AttentionBackward, dtype);
            assert!(fused, "{test}: wgpu:0 lists no fused attention for {dtype}");
            Some(device)
        }
        Err(e) => {
            assert!(
                !common::required(DeviceKind::Wgpu),
                "{test}: CARTAGE_REQUIRE names wgpu but {device} did not open: {e}"
            );
            common::device_missing(test, &device, &e);
            None
        }
    }
}

fn cases() -> Vec<Case> {
    let case = |b, h, l, s, e, ev, causal, packed| Case {
        b,
        h,
        l,
        s,
        e,
        ev,
        causal,
        packed,
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            case(2, 3, 40, 40, 64, 64, causal, false),
            case(1, 2, 33, 47, 32, 32, causal, false),
            case(2, 2, 47, 33, 80, 80, causal, false),
            case(1, 2, 35, 35, 128, 128, causal, true),
            case(2, 2, 21, 30, 64, 32, causal, false),
            case(1, 3, 1, 1, 64, 64, causal, false),
            case(1, 2, 9, 1, 32, 32, causal, false),
        ]);
    }
    cases
}

/// A tenth of the largest magnitude of all of `values` (at least 10⁻³): with one key, P = 1 and
/// the query and key gradients are zero up to round-off, so they are judged against the others.
fn floor(values: &[Vec<f64>]) -> f64 {
    0.1 * values.iter().flatten().fold(1e-2f64, |m, v| m.max(v.abs()))
}

/// Every case in f32: the fused path against the composed path on wgpu and against the CPU.
#[test]
fn fused_matches_the_composed_path_and_the_cpu_in_f32() -> Result<()> {
    let Some(device) = wgpu("attention_wgpu/f32", DType::F32) else {
        return Ok(());
    };
    let cpu = Device::cpu();
    for c in cases() {
        let fused = run(c, DType::F32, DType::F32, &device, false)?;
        let composed = run(c, DType::F32, DType::F32, &device, true)?;
        let host = run(c, DType::F32, DType::F32, &cpu, false)?;
        for (against, want) in [("the composed path", &composed), ("the CPU", &host)] {
            for (n, (g, w)) in fused.iter().zip(want).enumerate() {
                let (err, scale) = worst(g, w, floor(want));
                assert!(
                    err <= 2e-5,
                    "{c:?} value {n} (output, then gradients) against {against}: worst difference {err:.3e} of the \
                     largest magnitude {scale:.3e}"
                );
            }
        }
    }
    Ok(())
}

/// f16 and bf16 through the fused kernels against f32 from the same rounded inputs: within a
/// few units of the dtype's rounding of the largest magnitude.
#[test]
fn half_types_match_f32() -> Result<()> {
    for (dtype, tolerance) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
        let Some(device) = wgpu("attention_wgpu/half", dtype) else {
            return Ok(());
        };
        for c in cases().into_iter().step_by(3) {
            let got = run(c, dtype, dtype, &device, false)?;
            let want = run(c, dtype, DType::F32, &device, true)?;
            for (n, (g, w)) in got.iter().zip(&want).enumerate() {
                let (err, scale) = worst(g, w, floor(&want));
                assert!(
                    err <= tolerance,
                    "{dtype} {c:?} value {n}: worst difference {err:.3e} of the largest magnitude {scale:.3e}"
                );
            }
        }
    }
    Ok(())
}

/// The fused gradients of a tiny causal and non-causal attention (L ≠ S, Ev ≠ E) against
/// central differences of the fused forward, in f32 with a step of 10⁻².
#[test]
fn fused_gradients_match_finite_differences() -> Result<()> {
    let Some(device) = wgpu("attention_wgpu/finite_differences", DType::F32) else {
        return Ok(());
    };
    let (b, h, l, s, e, ev) = (1, 2, 5, 6, 8, 4);
    let shapes = [vec![b, h, l, e], vec![b, h, s, e], vec![b, h, s, ev]];
    for causal in [false, true] {
        let base: Vec<Vec<f32>> = shapes
            .iter()
            .enumerate()
            .map(|(n, s)| values(s.iter().product(), 20 + n as u64))
            .collect();
        let r = Tensor::from_vec(values(b * h * l * ev, 30), &[b, h, l, ev], &device)?;
        let loss = |x: &[Vec<f32>]| -> Result<f64> {
            let t: Vec<Tensor> = x
                .iter()
                .zip(&shapes)
                .map(|(v, s)| Tensor::from_vec(v.clone(), s, &device))
                .collect::<Result<_>>()?;
            let y = Tensor::scaled_dot_product_attention(&t[0], &t[1], &t[2], None, causal, None)?;
            Ok(f64::from(y.mul(&r)?.sum_all()?.to_vec::<f32>()?[0]))
        };
        let vars: Vec<Var> = base
            .iter()
            .zip(&shapes)
            .map(|(v, s)| Var::new(Tensor::from_vec(v.clone(), s, &device)?))
            .collect::<Result<_>>()?;
        let y = Tensor::scaled_dot_product_attention(
            &vars[0].tensor(),
            &vars[1].tensor(),
            &vars[2].tensor(),
            None,
            causal,
            None,
        )?;
        y.mul(&r)?.sum_all()?.backward()?;
        let step = 1e-2f32;
        for (i, var) in vars.iter().enumerate() {
            let grad = var.grad().expect("a gradient").to_vec::<f32>()?;
            for j in 0..base[i].len() {
                let (mut plus, mut minus) = (base.clone(), base.clone());
                plus[i][j] += step;
                minus[i][j] -= step;
                let numeric = (loss(&plus)? - loss(&minus)?) / (2.0 * f64::from(step));
                let analytic = f64::from(grad[j]);
                assert!(
                    (analytic - numeric).abs() <= 2e-3 + 1e-2 * numeric.abs(),
                    "causal={causal} input {i} element {j}: backward {analytic} vs finite difference {numeric}"
                );
            }
        }
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

/// Forward and forward + backward times of causal attention through the fused kernels and
/// through the composed path (an all-true mask), at the benchmark GPT's shape (f32 [64, 6, 256,
/// 64]) and the benchmark's `sdpa_causal` row (bf16 [8, 16, 1024, 64]): `cargo test --release
/// -p cartage --features wgpu --test attention_wgpu -- --ignored --nocapture`.
#[test]
#[ignore = "a timing report, not a check"]
fn report_fused_and_composed_attention_times() -> Result<()> {
    for (shape, dtype) in [([64, 6, 256, 64], DType::F32), ([8, 16, 1024, 64], DType::BF16)] {
        let Some(device) = wgpu("attention_wgpu/timing", dtype) else {
            return Ok(());
        };
        let [b, h, l, e] = shape;
        let make = |seed| operand(&shape, seed, dtype, dtype, &device);
        let (q, k, v) = (make(1)?, make(2)?, make(3)?);
        let grad = Tensor::ones(&shape, dtype, &device)?;
        // A zero mask that needs its own gradient: the composed path.
        let all = Var::new(Tensor::zeros(&[l, l], dtype, &device)?)?.tensor();
        let flops = 4.0 * (b * h * l * l * e) as f64 / 2.0;
        for (path, mask) in [("fused", None), ("composed", Some(&all))] {
            let forward = time_ms(&device, 10, || {
                Tensor::scaled_dot_product_attention(&q, &k, &v, mask, true, None).map(drop)
            })?;
            let (qv, kv, vv) = (Var::new(q.clone())?, Var::new(k.clone())?, Var::new(v.clone())?);
            let both = time_ms(&device, 10, || {
                let y =
                    Tensor::scaled_dot_product_attention(&qv.tensor(), &kv.tensor(), &vv.tensor(), mask, true, None)?;
                y.backward_with(Some(&grad), false)?;
                for var in [&qv, &kv, &vv] {
                    var.zero_grad();
                }
                Ok(())
            })?;
            eprintln!(
                "TIMING wgpu sdpa causal {dtype} {shape:?} {path}: fwd {forward:.3} ms ({:.2} TFLOP/s), \
                 fwd+bwd {both:.3} ms ({:.2} TFLOP/s)",
                flops / forward / 1e9,
                3.5 * flops / both / 1e9
            );
        }
    }
    Ok(())
}
