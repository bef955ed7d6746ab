//! The fused attention backward (`Kernel::AttentionBackward`) on `cuda:0` against the composed
//! formula the frontend falls back to (scores and probabilities materialised as `[L, S]`
//! matrices: `dV = Pᵀ dO`, `dS = P ∘ (dO Vᵀ − rowsum(dO Vᵀ ∘ P))`, `dQ = scale dS K`,
//! `dK = scale dSᵀ Q`), evaluated on the host in f64 on the same rounded inputs: causal and not,
//! L < S and L > S, Ev ≠ E, no keys and no queries at all, batches of several heads, heads
//! interleaved in memory, in f32, f16 and bf16; the same with the forward's saved output and
//! log-sum-exp (the tiled tensor-core backward for bf16 and f16 with head dims 64 and 128, and
//! the forward's log-sum-exp itself). Then the op is listed for every float dtype, a
//! head dim past the kernel's registers is refused so that the frontend composes, and a long
//! sequence runs without any memory of the size of the score matrix.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{Backend, DType, DeviceBuffer, Error, Kernel, Layout, Op};
use common::attention::{deinterleave, one_at_a_time, operand, relative_worst};
use common::{download, poisoned, round, upload};

/// `cuda:0` with the fused attention backward listed, or `None` after a SKIP line.
fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    let b = common::backend(test)?;
    if b.capabilities().supports(Op::AttentionBackward, DType::F32) {
        return Some(b);
    }
    panic!(
        "cuda/{test}: the fused attention backward is not listed on cuda:0, which builds them for every float dtype"
    );
}

/// One case: batch, query and key lengths, head dims, mask, and whether q, k, v and the
/// incoming gradient interleave their heads in memory (a `[N, B, E]` buffer seen as `[B, N, E]`).
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    causal: bool,
    heads: bool,
}

impl Case {
    fn scale(&self) -> f64 {
        1.0 / (self.e.max(1) as f64).sqrt()
    }
}

/// Deterministic values in [-1, 1), rounded to `dtype`.
fn inputs(n: usize, seed: u64, dtype: DType) -> Vec<f64> {
    common::values(n, seed, DType::F64)
        .into_iter()
        .map(|v| round(v / 4.0, dtype))
        .collect()
}

/// The composed formula in f64: `[dq, dk, dv]`, each row-major.
fn composed(c: &Case, [q, k, v, g]: [&[f64]; 4]) -> [Vec<f64>; 3] {
    let (scale, e, ev) = (c.scale(), c.e, c.ev);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; c.b * c.l * e],
        vec![0.0; c.b * c.s * e],
        vec![0.0; c.b * c.s * ev],
    );
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..c.b {
        let qr = |i: usize| &q[(b * c.l + i) * e..][..e];
        let gr = |i: usize| &g[(b * c.l + i) * ev..][..ev];
        let kr = |j: usize| &k[(b * c.s + j) * e..][..e];
        let vr = |j: usize| &v[(b * c.s + j) * ev..][..ev];
        // P = softmax(scale q kᵀ) with the causal positions at -inf, and dP = dO vᵀ.
        let mut p = vec![vec![0.0; c.s]; c.l];
        let mut dp = vec![vec![0.0; c.s]; c.l];
        for i in 0..c.l {
            for j in 0..c.s {
                p[i][j] = if c.causal && j > i {
                    f64::NEG_INFINITY
                } else {
                    scale * dot(qr(i), kr(j))
                };
                dp[i][j] = dot(gr(i), vr(j));
            }
            let max = p[i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = p[i].iter().map(|s| (s - max).exp()).sum();
            p[i].iter_mut().for_each(|s| *s = (*s - max).exp() / total);
        }
        for i in 0..c.l {
            let rowsum: f64 = (0..c.s).map(|j| dp[i][j] * p[i][j]).sum();
            for j in 0..c.s {
                let ds = p[i][j] * (dp[i][j] - rowsum);
                for x in 0..e {
                    dq[(b * c.l + i) * e + x] += scale * ds * kr(j)[x];
                    dk[(b * c.s + j) * e + x] += scale * ds * qr(i)[x];
                }
                for x in 0..ev {
                    dv[(b * c.s + j) * ev + x] += p[i][j] * gr(i)[x];
                }
            }
        }
    }
    [dq, dk, dv]
}

/// Run the fused kernel on `cuda:0` for `c` and compare its three gradients with `composed`.
fn check_case(b: &Arc<dyn Backend>, dtype: DType, c: Case, seed: u64) {
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.ev], [c.b, c.l, c.ev]];
    let raw: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| inputs(s.iter().product(), seed + n as u64, dtype))
        .collect();
    let logical: Vec<Vec<f64>> = raw
        .iter()
        .zip(&shapes)
        .map(|(r, &[bb, n, d])| if c.heads { deinterleave(r, bb, n, d) } else { r.clone() })
        .collect();
    let bufs: Vec<DeviceBuffer> = raw.iter().map(|r| upload(b, r, dtype)).collect();
    let outs: Vec<DeviceBuffer> = shapes[..3]
        .iter()
        .map(|s| poisoned(b, s.iter().product(), dtype))
        .collect();
    let contiguous = |buf: &DeviceBuffer, s: [usize; 3]| buf.arg(Layout::contiguous(&s).expect("layout"), dtype);
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: operand(&bufs[0], shapes[0], c.heads, dtype),
        k: operand(&bufs[1], shapes[1], c.heads, dtype),
        v: operand(&bufs[2], shapes[2], c.heads, dtype),
        grad: operand(&bufs[3], shapes[3], c.heads, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        grad_q: contiguous(&outs[0], shapes[0]),
        grad_k: contiguous(&outs[1], shapes[1]),
        grad_v: contiguous(&outs[2], shapes[2]),
        saved: None,
    }))
    .run(&[&bufs[0], &bufs[1], &bufs[2], &bufs[3], &outs[0], &outs[1], &outs[2]])
    .unwrap_or_else(|e| panic!("attention_backward {dtype} {c:?}: {e}"));
    let want = composed(&c, [&logical[0], &logical[1], &logical[2], &logical[3]]);
    let tolerance = match dtype {
        DType::BF16 => 3e-2,
        DType::F16 => 4e-3,
        _ => 1e-4,
    };
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let got = download(&outs[n], want[n].len(), dtype);
        common::check_within(&format!("{name} {dtype} {c:?}"), &got, &want[n], tolerance);
    }
}

/// Every case of the table, in f32, f16 and bf16.
#[test]
fn gradients_match_the_composed_formula() {
    let _serial = one_at_a_time();
    let Some(b) = backend("gradients_match_the_composed_formula") else {
        return;
    };
    let case = |b, l, s, e, ev, causal, heads| Case {
        b,
        l,
        s,
        e,
        ev,
        causal,
        heads,
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            case(2, 64, 64, 64, 64, causal, false),
            case(3, 33, 80, 64, 32, causal, false),
            case(2, 100, 37, 128, 128, causal, true),
            case(4, 1, 1, 64, 64, causal, false),
            case(1, 300, 257, 16, 16, causal, false),
            case(2, 40, 45, 256, 200, causal, true),
            case(2, 17, 0, 64, 64, causal, false),
            case(2, 0, 5, 32, 32, causal, false),
        ]);
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (n, c) in cases.iter().enumerate() {
            check_case(&b, dtype, *c, 10 * n as u64);
        }
    }
}

/// `softmax(scale · q kᵀ) v` in f64, row-major [B, L, Ev].
fn forward_rows(c: &Case, [q, k, v]: [&[f64]; 3]) -> Vec<f64> {
    let lse = lse_rows(c, q, k);
    let mut out = vec![0.0; c.b * c.l * c.ev];
    for b in 0..c.b {
        for i in 0..c.l {
            let seen = if c.causal { c.s.min(i + 1) } else { c.s };
            let qi = &q[(b * c.l + i) * c.e..][..c.e];
            for j in 0..seen {
                let kj = &k[(b * c.s + j) * c.e..][..c.e];
                let s = c.scale() * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>();
                let p = (s - lse[b * c.l + i]).exp();
                for x in 0..c.ev {
                    out[(b * c.l + i) * c.ev + x] += p * v[(b * c.s + j) * c.ev + x];
                }
            }
        }
    }
    out
}

/// Each row's natural log-sum-exp of its scaled, masked scores, in f64 (−inf for no key).
fn lse_rows(c: &Case, q: &[f64], k: &[f64]) -> Vec<f64> {
    let mut lse = Vec::with_capacity(c.b * c.l);
    for b in 0..c.b {
        for i in 0..c.l {
            let seen = if c.causal { c.s.min(i + 1) } else { c.s };
            let scores: Vec<f64> = (0..seen)
                .map(|j| {
                    let qi = &q[(b * c.l + i) * c.e..][..c.e];
                    let kj = &k[(b * c.s + j) * c.e..][..c.e];
                    c.scale() * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            lse.push(max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln());
        }
    }
    lse
}

/// The forward with its log-sum-exp (`Kernel::Attention` with `lse`), then the backward given
/// the saved output and log-sum-exp (the tiled kernel where it takes the case, the warp-per-row
/// kernels otherwise): the log-sum-exp and the three gradients against f64 on the same rounded
/// inputs in [-2, 2), relative to the largest magnitude of each.
fn check_saved_case(b: &Arc<dyn Backend>, dtype: DType, c: Case, seed: u64) {
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.ev], [c.b, c.l, c.ev]];
    let raw: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let wide: Vec<f64> = common::values(s.iter().product(), seed + n as u64, DType::F64);
            // [-2, 2): scores of about one unit, a softmax neither flat nor one-hot.
            wide.into_iter().map(|v| round(v / 2.0, dtype)).collect()
        })
        .collect();
    let logical: Vec<Vec<f64>> = raw
        .iter()
        .zip(&shapes)
        .map(|(r, &[bb, n, d])| if c.heads { deinterleave(r, bb, n, d) } else { r.clone() })
        .collect();
    let bufs: Vec<DeviceBuffer> = raw.iter().map(|r| upload(b, r, dtype)).collect();
    let contiguous = |buf: &DeviceBuffer, s: &[usize], dtype| buf.arg(Layout::contiguous(s).expect("layout"), dtype);
    let what = format!("{dtype} {c:?}");

    let want_lse = lse_rows(&c, &logical[0], &logical[1]);
    let mut out = poisoned(b, c.b * c.l * c.ev, dtype);
    let mut lse = poisoned(b, c.b * c.l, DType::F32);
    let forward = Kernel::Attention {
        q: operand(&bufs[0], shapes[0], c.heads, dtype),
        k: operand(&bufs[1], shapes[1], c.heads, dtype),
        v: operand(&bufs[2], shapes[2], c.heads, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        out: contiguous(&out, &shapes[3], dtype),
        lse: Some(contiguous(&lse, &[c.b, c.l], DType::F32)),
    }
    .run(&[&bufs[0], &bufs[1], &bufs[2], &out, &lse]);
    match forward {
        Ok(()) => {
            let got_lse = download(&lse, c.b * c.l, DType::F32);
            for (i, (g, w)) in got_lse.iter().zip(&want_lse).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-3 * (1.0 + w.abs()),
                    "lse {what} row {i}: got {g}, want {w}"
                );
            }
        }
        // Head dims the forward does not take: the saved values come from the host instead.
        Err(Error::Unsupported { .. }) if !matches!(c.e, 64 | 128) => {
            out = upload(b, &forward_rows(&c, [&logical[0], &logical[1], &logical[2]]), dtype);
            lse = upload(b, &want_lse, DType::F32);
        }
        Err(e) => panic!("attention with lse {what}: {e}"),
    }

    let outs: Vec<DeviceBuffer> = shapes[..3]
        .iter()
        .map(|s| poisoned(b, s.iter().product(), dtype))
        .collect();
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: operand(&bufs[0], shapes[0], c.heads, dtype),
        k: operand(&bufs[1], shapes[1], c.heads, dtype),
        v: operand(&bufs[2], shapes[2], c.heads, dtype),
        grad: operand(&bufs[3], shapes[3], c.heads, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        grad_q: contiguous(&outs[0], &shapes[0], dtype),
        grad_k: contiguous(&outs[1], &shapes[1], dtype),
        grad_v: contiguous(&outs[2], &shapes[2], dtype),
        saved: Some(AttentionSaved {
            out: contiguous(&out, &shapes[3], dtype),
            lse: contiguous(&lse, &[c.b, c.l], DType::F32),
        }),
    }))
    .run(&[
        &bufs[0], &bufs[1], &bufs[2], &bufs[3], &out, &lse, &outs[0], &outs[1], &outs[2],
    ])
    .unwrap_or_else(|e| panic!("attention_backward with saved values {what}: {e}"));
    let want = composed(&c, [&logical[0], &logical[1], &logical[2], &logical[3]]);
    // Each of the five products rounds one operand (P, dS) to the dtype: a few of its units.
    let tolerance = match dtype {
        DType::BF16 => 2.5e-2,
        _ => 4e-3,
    };
    // With one key, dS = dO·v − dO·O is zero only up to the rounding of the saved output O to
    // the dtype, so the query and key gradients are sums of round-off of terms as large as the
    // value gradient: they are judged against a tenth of the largest gradient magnitude.
    let largest = want.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let got = download(&outs[n], want[n].len(), dtype);
        let err = relative_worst(&format!("{name} {what}"), &got, &want[n], 0.1 * largest);
        assert!(
            err <= tolerance,
            "{name} {what}: worst error {err:.3e} of the largest magnitude"
        );
    }
}

/// The tiled backward (bf16, f16; head dims 64 and 128) from the forward's saved output and
/// log-sum-exp: causal and not, L = S, L < S, L > S, lengths that are no multiple of a tile
/// (1, 77, 300), one key, interleaved heads (batch and row strides of a `[N, B, E]` buffer); and
/// a head dim the tiled kernel does not take (the saved values are then ignored).
#[test]
fn tiled_gradients_match_the_composed_formula() {
    let _serial = one_at_a_time();
    let Some(b) = backend("tiled_gradients_match_the_composed_formula") else {
        return;
    };
    let case = |b, l, s, e, causal, heads| Case {
        b,
        l,
        s,
        e,
        ev: e,
        causal,
        heads,
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        for e in [64, 128] {
            cases.extend([
                case(2, 128, 128, e, causal, false),
                case(3, 1, 1, e, causal, false),
                case(2, 77, 77, e, causal, true),
                case(1, 300, 300, e, causal, false),
                case(2, 77, 300, e, causal, true),
                case(2, 300, 77, e, causal, false),
                case(1, 1, 200, e, causal, false),
                case(2, 130, 1, e, causal, false),
            ]);
        }
        cases.push(case(2, 40, 45, 32, causal, true));
    }
    for dtype in [DType::BF16, DType::F16] {
        for (n, c) in cases.iter().enumerate() {
            check_saved_case(&b, dtype, *c, 100 + 10 * n as u64);
        }
    }
}

/// Listed for every float dtype (the fused path the frontend takes), refused for head dims
/// past the kernel's registers with `Unsupported` (the frontend then composes).
#[test]
fn listed_for_floats_and_refuses_wide_heads() {
    let _serial = one_at_a_time();
    let Some(b) = backend("listed_for_floats_and_refuses_wide_heads") else {
        return;
    };
    for dtype in DType::ALL {
        assert_eq!(
            b.capabilities().supports(Op::AttentionBackward, dtype),
            dtype.is_float(),
            "attention_backward listed for {dtype}"
        );
    }
    let (e, dtype) = (300, DType::F32);
    let input = upload(&b, &inputs(2 * e, 1, dtype), dtype);
    let outs: Vec<DeviceBuffer> = (0..3).map(|_| poisoned(&b, 2 * e, dtype)).collect();
    let arg = |buf: &DeviceBuffer| common::arg(buf, &[1, 2, e], dtype);
    let result = Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: arg(&input),
        k: arg(&input),
        v: arg(&input),
        grad: arg(&input),
        scale: 0.1,
        causal: false,
        mask: None,
        grad_q: arg(&outs[0]),
        grad_k: arg(&outs[1]),
        grad_v: arg(&outs[2]),
        saved: None,
    }))
    .run(&[&input, &outs[0], &outs[1], &outs[2]]);
    assert!(
        matches!(result, Err(Error::Unsupported { .. })),
        "head dim {e}: {result:?}"
    );
}

/// A long sequence (4 heads of 4096 queries and keys: a score matrix would take 256 MiB in f32)
/// needs no memory beyond its operands but the two `[B, L]` scratch rows, and gives finite
/// gradients.
#[test]
fn long_sequences_keep_no_score_matrix() {
    let _serial = one_at_a_time();
    let Some(b) = backend("long_sequences_keep_no_score_matrix") else {
        return;
    };
    let (heads, n, e, dtype) = (4, 4096, 64, DType::F32);
    let numel = heads * n * e;
    let ins: Vec<DeviceBuffer> = (0..4).map(|i| upload(&b, &inputs(numel, i, dtype), dtype)).collect();
    let outs: Vec<DeviceBuffer> = (0..3).map(|_| poisoned(&b, numel, dtype)).collect();
    b.synchronize().expect("synchronize");
    let before = b.memory_stats().allocated_bytes;
    b.allocator().reset_peaks();
    let arg = |buf: &DeviceBuffer| common::arg(buf, &[heads, n, e], dtype);
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: arg(&ins[0]),
        k: arg(&ins[1]),
        v: arg(&ins[2]),
        grad: arg(&ins[3]),
        scale: 0.125,
        causal: true,
        mask: None,
        grad_q: arg(&outs[0]),
        grad_k: arg(&outs[1]),
        grad_v: arg(&outs[2]),
        saved: None,
    }))
    .run(&[&ins[0], &ins[1], &ins[2], &ins[3], &outs[0], &outs[1], &outs[2]])
    .expect("attention_backward");
    b.synchronize().expect("synchronize");
    let extra = b.memory_stats().peak_allocated_bytes.saturating_sub(before);
    let scratch = 2 * heads * n * 4;
    assert!(
        extra <= 2 * scratch,
        "the backward allocated {extra} bytes beyond its operands; its scratch is {scratch} \
         and a score matrix would be {}",
        heads * n * n * 4
    );
    for (name, out) in ["grad_q", "grad_k", "grad_v"].iter().zip(&outs) {
        let got = download(out, numel, dtype);
        assert!(got.iter().all(|v| v.is_finite()), "{name} has a non-finite element");
    }
}
