//! The fused attention kernels on `wgpu:0` (`Kernel::Attention`, `Kernel::AttentionBackward`)
//! against the composed formula evaluated on the host in f64 from the same rounded inputs:
//! the output, each row's log-sum-exp and the three gradients, causal and not, L = S, L < S and
//! L > S, head dims 32, 64, 80 and 128, Ev ≠ E, several batch entries, lengths that are no
//! multiple of any tile, one key, no keys (NaN rows, −inf log-sum-exp, zero query gradient) and
//! no queries (zero key and value gradients), keys no causal query sees (zero gradients); the
//! backward both with the forward's saved output and log-sum-exp and without (it then runs the
//! forward itself). f32 within 2·10⁻⁵ of the largest magnitude, f16 and bf16 within their
//! rounding. Then the ops are listed for f32, f16 and bf16 only, and head dims past 128 are
//! refused with `Unsupported` (the frontend then composes).

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{Backend, DType, DeviceBuffer, Error, Kernel, Layout, Op, TensorArg};
use cartage_wgpu::WgpuBackend;
use common::backend;
use half::{bf16, f16};

/// One case: batch, query and key lengths, head dims, mask.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    causal: bool,
}

impl Case {
    fn scale(&self) -> f64 {
        // Scores of a few units: the softmax neither flat nor one-hot.
        2.0 / (self.e as f64).sqrt()
    }
}

/// `v` rounded to `dtype`.
fn round(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

/// `n` deterministic values in [-1, 1) (an LCG), rounded to `dtype`.
fn values(n: usize, seed: u64, dtype: DType) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            round((state >> 40) as f64 / (1u64 << 23) as f64 - 1.0, dtype)
        })
        .collect()
}

/// A contiguous device tensor of `shape` in `dtype` holding `v` (one element more, so that no
/// buffer is empty).
fn upload(b: &Arc<WgpuBackend>, v: &[f64], shape: &[usize], dtype: DType) -> (DeviceBuffer, TensorArg) {
    let mut v = v.to_vec();
    v.push(0.0);
    let (buf, _) = match dtype {
        DType::F16 => common::upload(b, &v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(), &[v.len()]),
        DType::BF16 => common::upload(b, &v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(), &[v.len()]),
        _ => common::upload(b, &v.iter().map(|&x| x as f32).collect::<Vec<_>>(), &[v.len()]),
    };
    let arg = buf.arg(Layout::contiguous(shape).expect("layout"), dtype);
    (buf, arg)
}

/// NaN everywhere, so that an element the kernel leaves unwritten fails.
fn poisoned(b: &Arc<WgpuBackend>, shape: &[usize], dtype: DType) -> (DeviceBuffer, TensorArg) {
    upload(b, &vec![f64::NAN; shape.iter().product()], shape, dtype)
}

/// A contiguous output one element into a NaN buffer (so that a half type's elements straddle
/// its words), with a NaN element before and after it.
fn poisoned_output(b: &Arc<WgpuBackend>, shape: &[usize], dtype: DType) -> (DeviceBuffer, TensorArg) {
    let n: usize = shape.iter().product();
    let (buf, _) = upload(b, &vec![f64::NAN; n + 2], &[n + 2], dtype);
    let strides = Layout::contiguous(shape).expect("layout").strides().to_vec();
    let arg = buf.arg(Layout::from_parts(shape, &strides, 1).expect("layout"), dtype);
    (buf, arg)
}

/// The elements of `arg`; for an output one element into its buffer, also checks that the
/// elements before and after it are still NaN (nothing else was written).
fn download(buf: &DeviceBuffer, arg: &TensorArg) -> Vec<f64> {
    if arg.layout.offset() == 1 {
        let n = arg.layout.numel();
        let all = buf.arg(Layout::contiguous(&[n + 2]).expect("layout"), arg.dtype);
        let around = read(buf, &all);
        assert!(
            around[0].is_nan() && around[n + 1].is_nan(),
            "an element beside the output was written"
        );
    }
    read(buf, arg)
}

fn read(buf: &DeviceBuffer, arg: &TensorArg) -> Vec<f64> {
    match arg.dtype {
        DType::F16 => common::download::<f16>(buf, arg).iter().map(|x| x.to_f64()).collect(),
        DType::BF16 => common::download::<bf16>(buf, arg).iter().map(|x| x.to_f64()).collect(),
        _ => common::download::<f32>(buf, arg)
            .iter()
            .map(|&x| f64::from(x))
            .collect(),
    }
}

/// What the composed formula gives in f64: the output, each row's log-sum-exp, and the
/// gradients of q, k and v for the incoming gradient `g`.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    grads: [Vec<f64>; 3],
}

fn reference(c: &Case, [q, k, v, g]: [&[f64]; 4]) -> Reference {
    let (scale, e, ev) = (c.scale(), c.e, c.ev);
    let mut out = vec![f64::NAN; c.b * c.l * ev];
    let mut lse = vec![f64::NEG_INFINITY; c.b * c.l];
    let mut grads = [
        vec![0.0; c.b * c.l * e],
        vec![0.0; c.b * c.s * e],
        vec![0.0; c.b * c.s * ev],
    ];
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..c.b {
        let qr = |i: usize| &q[(b * c.l + i) * e..][..e];
        let gr = |i: usize| &g[(b * c.l + i) * ev..][..ev];
        let kr = |j: usize| &k[(b * c.s + j) * e..][..e];
        let vr = |j: usize| &v[(b * c.s + j) * ev..][..ev];
        for i in 0..c.l {
            let seen = if c.causal { c.s.min(i + 1) } else { c.s };
            if seen == 0 {
                continue;
            }
            let scores: Vec<f64> = (0..seen).map(|j| scale * dot(qr(i), kr(j))).collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            let row_lse = max + total.ln();
            lse[b * c.l + i] = row_lse;
            let p: Vec<f64> = scores.iter().map(|s| (s - row_lse).exp()).collect();
            let o = &mut out[(b * c.l + i) * ev..][..ev];
            o.iter_mut().for_each(|x| *x = 0.0);
            for (j, pj) in p.iter().enumerate() {
                for (x, vx) in o.iter_mut().zip(vr(j)) {
                    *x += pj * vx;
                }
            }
            let dp: Vec<f64> = (0..seen).map(|j| dot(gr(i), vr(j))).collect();
            let d: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..seen {
                let ds = p[j] * (dp[j] - d);
                for x in 0..e {
                    grads[0][(b * c.l + i) * e + x] += scale * ds * kr(j)[x];
                    grads[1][(b * c.s + j) * e + x] += scale * ds * qr(i)[x];
                }
                for x in 0..ev {
                    grads[2][(b * c.s + j) * ev + x] += p[j] * gr(i)[x];
                }
            }
        }
    }
    Reference { out, lse, grads }
}

/// The largest difference relative to the largest reference magnitude (at least `floor`);
/// NaN where the reference is NaN must be NaN, and nothing else may be non-finite.
fn worst(what: &str, got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().filter(|v| v.is_finite()).fold(floor, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| {
            if w.is_nan() {
                assert!(g.is_nan(), "{what}: element {i} is {g}, want NaN");
                0.0
            } else if w.is_infinite() {
                assert_eq!(g, w, "{what}: element {i}");
                0.0
            } else if g.is_finite() {
                (g - w).abs() / scale
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// The tolerance of `dtype` relative to the largest magnitude: f32 round-off over sums of a
/// few hundred terms; one rounding of the inputs' dtype for the half types (the kernels compute
/// in f32 and round once on store).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 2e-5,
    }
}

/// Run the forward (with its log-sum-exp) and the backward (with the saved values, then
/// without) for `c` and compare everything with the f64 reference.
fn check_case(b: &Arc<WgpuBackend>, dtype: DType, c: Case, seed: u64) {
    let what = format!("{dtype} {c:?}");
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.ev], [c.b, c.l, c.ev]];
    let host: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| values(s.iter().product(), seed + n as u64, dtype))
        .collect();
    let dev: Vec<(DeviceBuffer, TensorArg)> = host.iter().zip(&shapes).map(|(v, s)| upload(b, v, s, dtype)).collect();
    let want = reference(&c, [&host[0], &host[1], &host[2], &host[3]]);
    let tol = tolerance(dtype);

    let (out_buf, out) = if seed % 20 == 10 {
        poisoned_output(b, &shapes[3], dtype)
    } else {
        poisoned(b, &shapes[3], dtype)
    };
    let (lse_buf, lse) = poisoned(b, &[c.b, c.l], DType::F32);
    Kernel::Attention {
        q: dev[0].1.clone(),
        k: dev[1].1.clone(),
        v: dev[2].1.clone(),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        out: out.clone(),
        lse: Some(lse.clone()),
    }
    .run(&[&dev[0].0, &dev[1].0, &dev[2].0, &out_buf, &lse_buf])
    .unwrap_or_else(|e| panic!("attention {what}: {e}"));
    b.synchronize().expect("synchronize");
    let err = worst(&format!("out {what}"), &download(&out_buf, &out), &want.out, 1e-3);
    assert!(err <= tol, "out {what}: worst error {err:.3e} of the largest magnitude");
    let got_lse = download(&lse_buf, &lse);
    for (i, (g, w)) in got_lse.iter().zip(&want.lse).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= 1e-5 * (1.0 + w.abs())
        } else {
            g == w
        };
        assert!(ok, "lse {what} row {i}: got {g}, want {w}");
    }

    for saved in [true, false] {
        // Odd outputs: one element into their buffers.
        let grads: Vec<(DeviceBuffer, TensorArg)> = shapes[..3]
            .iter()
            .enumerate()
            .map(|(n, s)| {
                if (seed / 10 + n as u64) % 2 == 1 {
                    poisoned_output(b, s, dtype)
                } else {
                    poisoned(b, s, dtype)
                }
            })
            .collect();
        Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
            q: dev[0].1.clone(),
            k: dev[1].1.clone(),
            v: dev[2].1.clone(),
            grad: dev[3].1.clone(),
            scale: c.scale(),
            causal: c.causal,
            mask: None,
            grad_q: grads[0].1.clone(),
            grad_k: grads[1].1.clone(),
            grad_v: grads[2].1.clone(),
            saved: saved.then(|| AttentionSaved {
                out: out.clone(),
                lse: lse.clone(),
            }),
        }))
        .run(&[
            &dev[0].0,
            &dev[1].0,
            &dev[2].0,
            &dev[3].0,
            &out_buf,
            &lse_buf,
            &grads[0].0,
            &grads[1].0,
            &grads[2].0,
        ])
        .unwrap_or_else(|e| panic!("attention_backward {what} saved={saved}: {e}"));
        b.synchronize().expect("synchronize");
        // With one key, dS = P·(dP − D) is zero up to round-off, so the query and key gradients
        // are judged against a tenth of the largest gradient of the three.
        let largest = want.grads.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
            let got = download(&grads[n].0, &grads[n].1);
            let err = worst(&format!("{name} {what}"), &got, &want.grads[n], 0.1 * largest);
            assert!(
                err <= tol,
                "{name} {what} saved={saved}: worst error {err:.3e} of the largest magnitude"
            );
        }
    }
}

fn cases() -> Vec<Case> {
    let case = |b, l, s, e, ev, causal| Case { b, l, s, e, ev, causal };
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            case(3, 33, 33, 32, 32, causal),
            case(2, 70, 45, 64, 64, causal),
            case(2, 45, 70, 64, 64, causal),
            case(2, 37, 50, 80, 80, causal),
            case(2, 40, 40, 128, 128, causal),
            case(2, 21, 30, 64, 32, causal),
            case(2, 30, 21, 32, 80, causal),
            case(4, 1, 1, 64, 64, causal),
            case(2, 9, 1, 80, 80, causal),
            case(2, 5, 0, 64, 64, causal),
            case(2, 0, 5, 64, 64, causal),
            case(1, 3, 7, 1, 5, causal),
        ]);
    }
    cases
}

#[test]
fn f32_matches_the_composed_formula() {
    let Some(b) = backend("f32_matches_the_composed_formula") else {
        return;
    };
    for (n, c) in cases().into_iter().enumerate() {
        check_case(&b, DType::F32, c, 10 * n as u64);
    }
}

#[test]
fn half_types_match_the_composed_formula() {
    let Some(b) = backend("half_types_match_the_composed_formula") else {
        return;
    };
    for dtype in [DType::F16, DType::BF16] {
        for (n, c) in cases().into_iter().enumerate().step_by(2) {
            check_case(&b, dtype, c, 1000 + 10 * n as u64);
        }
    }
}

/// Listed for f32, f16 and bf16 (the fused path the frontend takes) and nothing else; a head
/// dim past 128 is refused with `Unsupported`, forward and backward, so that the frontend
/// composes.
#[test]
fn listed_for_f32_and_half_types_and_refuses_wide_heads() {
    let Some(b) = backend("listed_for_f32_and_half_types_and_refuses_wide_heads") else {
        return;
    };
    for dtype in DType::ALL {
        let fused = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
        for op in [Op::Attention, Op::AttentionBackward] {
            assert_eq!(b.capabilities().supports(op, dtype), fused, "{op:?} listed for {dtype}");
        }
    }
    let (e, dtype) = (129, DType::F32);
    let (input_buf, input) = upload(&b, &values(2 * e, 1, dtype), &[1, 2, e], dtype);
    let outs: Vec<(DeviceBuffer, TensorArg)> = (0..3).map(|_| poisoned(&b, &[1, 2, e], dtype)).collect();
    let forward = Kernel::Attention {
        q: input.clone(),
        k: input.clone(),
        v: input.clone(),
        scale: 0.1,
        causal: false,
        mask: None,
        out: outs[0].1.clone(),
        lse: None,
    }
    .run(&[&input_buf, &outs[0].0]);
    assert!(
        matches!(forward, Err(Error::Unsupported { .. })),
        "head dim {e}: {forward:?}"
    );
    let backward = Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: input.clone(),
        k: input.clone(),
        v: input.clone(),
        grad: input,
        scale: 0.1,
        causal: false,
        mask: None,
        grad_q: outs[0].1.clone(),
        grad_k: outs[1].1.clone(),
        grad_v: outs[2].1.clone(),
        saved: None,
    }))
    .run(&[&input_buf, &outs[0].0, &outs[1].0, &outs[2].0]);
    assert!(
        matches!(backward, Err(Error::Unsupported { .. })),
        "head dim {e}: {backward:?}"
    );
}
