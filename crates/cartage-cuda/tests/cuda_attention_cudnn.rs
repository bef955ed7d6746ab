//! cuDNN's fused attention (`CudaBackend::set_attention_api(AttentionApi::Cudnn)`) on `cuda:0`
//! against cartage's own flash kernels (`AttentionApi::Kernel`) and the formula evaluated on the
//! host in f64 on the same rounded inputs: the forward's output and log-sum-exp, and the three
//! gradients of the backward from the saved output and log-sum-exp, in bf16 and f16, causal and
//! not, head dims 64 and 128, L = S and L ≠ S, several batch entries, lengths that are no
//! multiple of 64, heads interleaved in memory. Where cuDNN's engines refuse a case the kernel
//! runs it (checked all the same); for the plain cases (L = S a multiple of 128, dense) cuDNN
//! must have run, as [`CudaBackend::attention_choices`] tells. Then `Auto` with the search on
//! times both implementations and reports the faster, and `Kernel` never runs cuDNN.
//!
//! Without a CUDA device every test prints a SKIP line (`CARTAGE_REQUIRE=cuda` makes it fail);
//! without cuDNN too (a SKIP line). cuDNN's own log says why it refused a graph:
//! `CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr`.

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{Backend, DType, DeviceBuffer, Kernel};
use cartage_cuda::{AttentionApi, AttentionChoice, AttentionPass, CudaBackend};
use common::attention::{Restore, cudnn_backend as backend, deinterleave, one_at_a_time, operand, relative_worst};

/// One case: batch, query and key lengths, head dim (E = Ev), mask, and whether the operands
/// interleave their heads in memory (a `[N, B, E]` buffer seen as `[B, N, E]`).
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    s: usize,
    e: usize,
    causal: bool,
    heads: bool,
}

impl Case {
    fn scale(&self) -> f64 {
        1.0 / (self.e as f64).sqrt()
    }

    /// A plain case cuDNN's fused attention must take.
    fn plain(&self) -> bool {
        self.l == self.s && self.s.is_multiple_of(128) && !self.heads && matches!(self.e, 64 | 128)
    }

    /// `[q, k, v, out/dO]` shapes.
    fn shapes(&self) -> [[usize; 3]; 4] {
        [
            [self.b, self.l, self.e],
            [self.b, self.s, self.e],
            [self.b, self.s, self.e],
            [self.b, self.l, self.e],
        ]
    }
}

/// A case's inputs `[q, k, v, dO]` on the device and their logical values on the host.
struct Inputs {
    bufs: Vec<DeviceBuffer>,
    logical: Vec<Vec<f64>>,
}

fn inputs(b: &Arc<dyn Backend>, c: &Case, dtype: DType, seed: u64) -> Inputs {
    let mut bufs = Vec::new();
    let mut logical = Vec::new();
    for (n, &[bb, rows, d]) in c.shapes().iter().enumerate() {
        // [-2, 2): scores of about one unit, a softmax neither flat nor one-hot.
        let raw: Vec<f64> = common::values(bb * rows * d, seed + n as u64, DType::F64)
            .into_iter()
            .map(|v| common::round(v / 2.0, dtype))
            .collect();
        bufs.push(common::upload(b, &raw, dtype));
        logical.push(if c.heads { deinterleave(&raw, bb, rows, d) } else { raw });
    }
    Inputs { bufs, logical }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The probabilities `P [B][L][S]` and each row's natural log-sum-exp, in f64.
fn probabilities(c: &Case, q: &[f64], k: &[f64]) -> (Vec<Vec<Vec<f64>>>, Vec<f64>) {
    let e = c.e;
    let mut p = Vec::new();
    let mut lse = Vec::new();
    for b in 0..c.b {
        let mut rows = Vec::new();
        for i in 0..c.l {
            let qi = &q[(b * c.l + i) * e..][..e];
            let scores: Vec<f64> = (0..c.s)
                .map(|j| {
                    if c.causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        c.scale() * dot(qi, &k[(b * c.s + j) * e..][..e])
                    }
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            lse.push(max + total.ln());
            rows.push(scores.iter().map(|s| (s - max).exp() / total).collect());
        }
        p.push(rows);
    }
    (p, lse)
}

/// The forward `[out, lse]` in f64.
fn forward_reference(c: &Case, x: &Inputs) -> [Vec<f64>; 2] {
    let (q, k, v) = (&x.logical[0], &x.logical[1], &x.logical[2]);
    let (p, lse) = probabilities(c, q, k);
    let mut out = vec![0.0; c.b * c.l * c.e];
    for b in 0..c.b {
        for i in 0..c.l {
            for j in 0..c.s {
                for d in 0..c.e {
                    out[(b * c.l + i) * c.e + d] += p[b][i][j] * v[(b * c.s + j) * c.e + d];
                }
            }
        }
    }
    [out, lse]
}

/// The gradients `[dq, dk, dv]` in f64 (the composed formula).
fn backward_reference(c: &Case, x: &Inputs) -> [Vec<f64>; 3] {
    let (q, k, v, g) = (&x.logical[0], &x.logical[1], &x.logical[2], &x.logical[3]);
    let (p, _) = probabilities(c, q, k);
    let e = c.e;
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; c.b * c.l * e],
        vec![0.0; c.b * c.s * e],
        vec![0.0; c.b * c.s * e],
    );
    for b in 0..c.b {
        for i in 0..c.l {
            let gi = &g[(b * c.l + i) * e..][..e];
            let dp: Vec<f64> = (0..c.s).map(|j| dot(gi, &v[(b * c.s + j) * e..][..e])).collect();
            let rowsum: f64 = (0..c.s).map(|j| dp[j] * p[b][i][j]).sum();
            for j in 0..c.s {
                let ds = p[b][i][j] * (dp[j] - rowsum);
                for d in 0..e {
                    dq[(b * c.l + i) * e + d] += c.scale() * ds * k[(b * c.s + j) * e + d];
                    dk[(b * c.s + j) * e + d] += c.scale() * ds * q[(b * c.l + i) * e + d];
                    dv[(b * c.s + j) * e + d] += p[b][i][j] * gi[d];
                }
            }
        }
    }
    [dq, dk, dv]
}

/// Each product rounds one operand (P, dS) to the dtype: a few of its units.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2.5e-2,
        _ => 4e-3,
    }
}

/// Run the forward with `lse` under `api`: `[out, lse]` read back.
fn run_forward(
    b: &Arc<dyn Backend>,
    cuda: &CudaBackend,
    api: AttentionApi,
    c: &Case,
    x: &Inputs,
    dtype: DType,
) -> ([DeviceBuffer; 2], [Vec<f64>; 2]) {
    cuda.set_attention_api(api);
    let shapes = c.shapes();
    let out = common::poisoned(b, c.b * c.l * c.e, dtype);
    let lse = common::poisoned(b, c.b * c.l, DType::F32);
    Kernel::Attention {
        q: operand(&x.bufs[0], shapes[0], c.heads, dtype),
        k: operand(&x.bufs[1], shapes[1], c.heads, dtype),
        v: operand(&x.bufs[2], shapes[2], c.heads, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        out: common::arg(&out, &shapes[3], dtype),
        lse: Some(common::arg(&lse, &[c.b, c.l], DType::F32)),
    }
    .run(&[&x.bufs[0], &x.bufs[1], &x.bufs[2], &out, &lse])
    .unwrap_or_else(|e| panic!("attention {api:?} {dtype} {c:?}: {e}"));
    let read = [
        common::download(&out, c.b * c.l * c.e, dtype),
        common::download(&lse, c.b * c.l, DType::F32),
    ];
    ([out, lse], read)
}

/// Run the backward under `api` from the saved `[out, lse]`: `[dq, dk, dv]` read back.
fn run_backward(
    b: &Arc<dyn Backend>,
    cuda: &CudaBackend,
    api: AttentionApi,
    c: &Case,
    x: &Inputs,
    saved: &[DeviceBuffer; 2],
    dtype: DType,
) -> [Vec<f64>; 3] {
    cuda.set_attention_api(api);
    let shapes = c.shapes();
    let outs: Vec<DeviceBuffer> = shapes[..3]
        .iter()
        .map(|s| common::poisoned(b, s.iter().product(), dtype))
        .collect();
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: operand(&x.bufs[0], shapes[0], c.heads, dtype),
        k: operand(&x.bufs[1], shapes[1], c.heads, dtype),
        v: operand(&x.bufs[2], shapes[2], c.heads, dtype),
        grad: operand(&x.bufs[3], shapes[3], c.heads, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        grad_q: common::arg(&outs[0], &shapes[0], dtype),
        grad_k: common::arg(&outs[1], &shapes[1], dtype),
        grad_v: common::arg(&outs[2], &shapes[2], dtype),
        saved: Some(AttentionSaved {
            out: common::arg(&saved[0], &shapes[3], dtype),
            lse: common::arg(&saved[1], &[c.b, c.l], DType::F32),
        }),
    }))
    .run(&[
        &x.bufs[0], &x.bufs[1], &x.bufs[2], &x.bufs[3], &saved[0], &saved[1], &outs[0], &outs[1], &outs[2],
    ])
    .unwrap_or_else(|e| panic!("attention_backward {api:?} {dtype} {c:?}: {e}"));
    [0, 1, 2].map(|n| common::download(&outs[n], shapes[n].iter().product(), dtype))
}

/// The choice `cuda` reports for `c`'s pass in `dtype`, if any.
fn choice(cuda: &CudaBackend, pass: AttentionPass, c: &Case, dtype: DType) -> Option<AttentionChoice> {
    cuda.attention_choices().into_iter().find(|ch| {
        ch.pass == pass
            && ch.dtype == dtype
            && ch.causal == c.causal
            && !ch.masked
            && ch.sizes == [c.b, c.l, c.s, c.e, c.e]
    })
}

/// cuDNN ran `c`'s pass (required for a plain case; a note otherwise).
fn check_ran_cudnn(cuda: &CudaBackend, pass: AttentionPass, c: &Case, dtype: DType) {
    let ran = choice(cuda, pass, c, dtype);
    let cudnn = ran.as_ref().is_some_and(|ch| ch.cudnn);
    if c.plain() {
        assert!(
            cudnn,
            "{} {dtype} {c:?}: cuDNN's fused attention did not run under AttentionApi::Cudnn ({ran:?}); run with \
             CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr RUST_LOG=cartage_cuda=debug to see why",
            pass.op()
        );
    } else if !cudnn {
        eprintln!(
            "note: {} {dtype} {c:?}: cuDNN's fused attention did not take this case; the kernel ran it",
            pass.op()
        );
    }
}

fn cases() -> Vec<Case> {
    let case = |b, l, s, e, causal, heads| Case {
        b,
        l,
        s,
        e,
        causal,
        heads,
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            case(2, 128, 128, 64, causal, false),
            case(3, 256, 256, 128, causal, false),
            case(2, 77, 77, 64, causal, false),
            case(2, 100, 37, 128, causal, false),
            case(2, 33, 80, 64, causal, false),
            case(3, 200, 200, 64, causal, true),
            case(1, 300, 300, 128, causal, false),
        ]);
    }
    cases
}

/// The forward's output and log-sum-exp and the backward's gradients through cuDNN, against
/// the flash kernels and the host, for every case in bf16 and f16.
#[test]
fn cudnn_attention_matches_the_kernel_and_the_host() {
    let _serial = one_at_a_time();
    let Some((b, cuda)) = backend("cudnn_attention_matches_the_kernel_and_the_host") else {
        return;
    };
    let _restore = Restore::new(&cuda);
    cuda.set_conv_benchmark(true);
    for dtype in [DType::BF16, DType::F16] {
        for (n, c) in cases().iter().enumerate() {
            let what = format!("{dtype} {c:?}");
            let x = inputs(&b, c, dtype, 40 * n as u64);
            let [want_out, want_lse] = forward_reference(c, &x);
            let (saved, [out, lse]) = run_forward(&b, &cuda, AttentionApi::Cudnn, c, &x, dtype);
            check_ran_cudnn(&cuda, AttentionPass::Forward, c, dtype);
            let (_, [kernel_out, kernel_lse]) = run_forward(&b, &cuda, AttentionApi::Kernel, c, &x, dtype);
            let tol = tolerance(dtype);
            let err = relative_worst("out", &out, &want_out, 1e-3);
            assert!(err <= tol, "out {what}: worst error {err:.3e} against the host");
            let err = relative_worst("out", &out, &kernel_out, 1e-3);
            assert!(err <= 2.0 * tol, "out {what}: worst error {err:.3e} against the kernel");
            for (i, ((g, k), w)) in lse.iter().zip(&kernel_lse).zip(&want_lse).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-3 * (1.0 + w.abs()),
                    "lse {what} row {i}: got {g}, want {w}"
                );
                assert!(
                    (g - k).abs() <= 1e-3 * (1.0 + k.abs()),
                    "lse {what} row {i}: got {g}, the kernel {k}"
                );
            }

            // The backward from cuDNN's own saved output and statistics.
            let want = backward_reference(c, &x);
            let grads = run_backward(&b, &cuda, AttentionApi::Cudnn, c, &x, &saved, dtype);
            check_ran_cudnn(&cuda, AttentionPass::Backward, c, dtype);
            let kernel_grads = run_backward(&b, &cuda, AttentionApi::Kernel, c, &x, &saved, dtype);
            let largest = want.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
            for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
                let err = relative_worst(&format!("gradient {n}"), &grads[n], &want[n], 0.1 * largest);
                assert!(err <= tol, "{name} {what}: worst error {err:.3e} against the host");
                let err = relative_worst(&format!("gradient {n}"), &grads[n], &kernel_grads[n], 0.1 * largest);
                assert!(
                    err <= 2.0 * tol,
                    "{name} {what}: worst error {err:.3e} against the kernel"
                );
            }
        }
    }
}

/// Under `Auto` with the search on, the first call of a shape times cuDNN and the kernel, and
/// the report names the faster, which is what runs; the results stay right.
#[test]
fn auto_times_both_and_runs_the_faster() {
    let _serial = one_at_a_time();
    let Some((b, cuda)) = backend("auto_times_both_and_runs_the_faster") else {
        return;
    };
    let _restore = Restore::new(&cuda);
    cuda.set_conv_benchmark(true);
    let dtype = DType::BF16;
    let c = Case {
        b: 8,
        l: 512,
        s: 512,
        e: 64,
        causal: true,
        heads: false,
    };
    let x = inputs(&b, &c, dtype, 7);
    let (saved, [out, _]) = run_forward(&b, &cuda, AttentionApi::Auto, &c, &x, dtype);
    let grads = run_backward(&b, &cuda, AttentionApi::Auto, &c, &x, &saved, dtype);
    let [want_out, _] = forward_reference(&c, &x);
    let err = relative_worst("out", &out, &want_out, 1e-3);
    assert!(err <= tolerance(dtype), "out under Auto: worst error {err:.3e}");
    let want = backward_reference(&c, &x);
    let largest = want.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
    for n in 0..3 {
        let err = relative_worst(&format!("gradient {n}"), &grads[n], &want[n], 0.1 * largest);
        assert!(
            err <= tolerance(dtype),
            "gradient {n} under Auto: worst error {err:.3e}"
        );
    }
    for pass in [AttentionPass::Forward, AttentionPass::Backward] {
        let ch = choice(&cuda, pass, &c, dtype)
            .unwrap_or_else(|| panic!("{}: no choice reported under Auto with the search on", pass.op()));
        eprintln!("{ch}");
        let (Some(cudnn_ms), Some(kernel_ms)) = (ch.cudnn_ms, ch.kernel_ms) else {
            panic!("{}: both implementations should have been timed: {ch}", pass.op());
        };
        assert_eq!(ch.cudnn, cudnn_ms < kernel_ms, "{ch}");
        let words = if ch.cudnn {
            "cuDNN fused attention (graph engine "
        } else {
            "flash kernel `attention"
        };
        assert!(ch.implementation.starts_with(words), "{ch}");
    }
}

/// Under `Kernel`, cuDNN is never considered: no choice is recorded for a new shape.
#[test]
fn the_kernel_api_never_runs_cudnn() {
    let _serial = one_at_a_time();
    let Some((b, cuda)) = backend("the_kernel_api_never_runs_cudnn") else {
        return;
    };
    let _restore = Restore::new(&cuda);
    cuda.set_conv_benchmark(true);
    let dtype = DType::F16;
    let c = Case {
        b: 2,
        l: 384,
        s: 384,
        e: 64,
        causal: false,
        heads: false,
    };
    let x = inputs(&b, &c, dtype, 11);
    let (saved, _) = run_forward(&b, &cuda, AttentionApi::Kernel, &c, &x, dtype);
    run_backward(&b, &cuda, AttentionApi::Kernel, &c, &x, &saved, dtype);
    for pass in [AttentionPass::Forward, AttentionPass::Backward] {
        assert_eq!(choice(&cuda, pass, &c, dtype), None, "{}", pass.op());
    }
}
