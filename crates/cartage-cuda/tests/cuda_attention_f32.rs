//! The fused f32 attention on `cuda:0` (`Kernel::Attention` in f32 with its log-sum-exp, then
//! `Kernel::AttentionBackward` given the saved output and log-sum-exp: the flash kernels of
//! `attention_f32.cu` and `attention_f32_backward.cu` on the CUDA cores) against the composed
//! formula evaluated on the host in f64 on the same f32 inputs (scores and probabilities
//! materialised as `[L, S]` matrices): head dims 32 to 128 (multiples of 16, the ones that are
//! no multiple of 64 too), causal and not, L = S, L < S and L > S, lengths that are no multiple
//! of the 64-row tiles (1, 77, 130, 300), one key, several batch entries, heads interleaved in
//! memory. The kernels compute with exact f32 products, so they agree to about 10⁻⁵ of the
//! largest magnitude. Then no keys and no queries give the contract's NaN rows and zero
//! gradients, what the kernels do not take is refused with `Unsupported` (so that the frontend
//! composes), and a long sequence runs its backward without any memory of the size of the score
//! matrix.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{Backend, DType, DeviceBuffer, Error, Kernel, Layout, Op, TensorArg};
use common::attention::{deinterleave, one_at_a_time, operand, relative_worst};

/// `cuda:0` with the fused f32 attention listed, or `None` after a SKIP line.
fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    let b = common::backend(test)?;
    let caps = b.capabilities();
    assert!(
        caps.supports(Op::Attention, DType::F32) && caps.supports(Op::AttentionBackward, DType::F32),
        "cuda/{test}: the fused f32 attention is not listed on cuda:0 (built for compute capability 8.0 and later)"
    );
    Some(b)
}

/// One case: batch, query and key lengths, head dim (E = Ev), mask, and whether q, k, v and the
/// incoming gradient interleave their heads in memory (a `[N, B, E]` buffer seen as `[B, N, E]`).
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
}

/// What the composed formula gives in f64: the output, each row's log-sum-exp, and the three
/// gradients `[dq, dk, dv]`, each row-major.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    grads: [Vec<f64>; 3],
}

/// The composed formula in f64 on the logical (row-major) q, k, v and incoming gradient: `P =
/// softmax(scale q kᵀ)` with the causal positions at −inf, `O = P v`, `dV = Pᵀ dO`, `dS = P ∘
/// (dO vᵀ − rowsum(dO vᵀ ∘ P))`, `dQ = scale dS k`, `dK = scale dSᵀ q`.
fn composed(c: &Case, [q, k, v, g]: [&[f64]; 4]) -> Reference {
    let (scale, e) = (c.scale(), c.e);
    let mut r = Reference {
        out: vec![0.0; c.b * c.l * e],
        lse: vec![0.0; c.b * c.l],
        grads: [
            vec![0.0; c.b * c.l * e],
            vec![0.0; c.b * c.s * e],
            vec![0.0; c.b * c.s * e],
        ],
    };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..c.b {
        let qr = |i: usize| &q[(b * c.l + i) * e..][..e];
        let gr = |i: usize| &g[(b * c.l + i) * e..][..e];
        let kr = |j: usize| &k[(b * c.s + j) * e..][..e];
        let vr = |j: usize| &v[(b * c.s + j) * e..][..e];
        for i in 0..c.l {
            let mut p: Vec<f64> = (0..c.s)
                .map(|j| {
                    if c.causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        scale * dot(qr(i), kr(j))
                    }
                })
                .collect();
            let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = p.iter().map(|s| (s - max).exp()).sum();
            r.lse[b * c.l + i] = max + total.ln();
            p.iter_mut().for_each(|s| *s = (*s - max).exp() / total);
            let dp: Vec<f64> = (0..c.s).map(|j| dot(gr(i), vr(j))).collect();
            let rowsum: f64 = (0..c.s).map(|j| dp[j] * p[j]).sum();
            for j in 0..c.s {
                let ds = p[j] * (dp[j] - rowsum);
                for x in 0..e {
                    r.out[(b * c.l + i) * e + x] += p[j] * vr(j)[x];
                    r.grads[0][(b * c.l + i) * e + x] += scale * ds * kr(j)[x];
                    r.grads[1][(b * c.s + j) * e + x] += scale * ds * qr(i)[x];
                    r.grads[2][(b * c.s + j) * e + x] += p[j] * gr(i)[x];
                }
            }
        }
    }
    r
}

/// The agreement asked of every f32 result, relative to its largest magnitude.
const TOLERANCE: f64 = 1e-5;

/// Run the forward with its log-sum-exp, then the backward from the saved output and
/// log-sum-exp, on `cuda:0` for `c`; compare all five results with `composed`.
fn check_case(b: &Arc<dyn Backend>, c: Case, seed: u64) {
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.e], [c.b, c.l, c.e]];
    // Values in [-2, 2) (exact in f32): scores of about one unit, a softmax neither flat nor
    // one-hot.
    let raw: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| {
            common::values(s.iter().product(), seed + n as u64, DType::F32)
                .into_iter()
                .map(|v| v / 2.0)
                .collect()
        })
        .collect();
    let logical: Vec<Vec<f64>> = raw
        .iter()
        .zip(&shapes)
        .map(|(r, &[bb, n, d])| if c.heads { deinterleave(r, bb, n, d) } else { r.clone() })
        .collect();
    let want = composed(&c, [&logical[0], &logical[1], &logical[2], &logical[3]]);
    let bufs: Vec<DeviceBuffer> = raw.iter().map(|r| common::upload(b, r, DType::F32)).collect();
    let what = format!("{c:?}");

    let out = common::poisoned(b, c.b * c.l * c.e, DType::F32);
    let lse = common::poisoned(b, c.b * c.l, DType::F32);
    Kernel::Attention {
        q: operand(&bufs[0], shapes[0], c.heads, DType::F32),
        k: operand(&bufs[1], shapes[1], c.heads, DType::F32),
        v: operand(&bufs[2], shapes[2], c.heads, DType::F32),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        out: common::arg(&out, &shapes[3], DType::F32),
        lse: Some(common::arg(&lse, &[c.b, c.l], DType::F32)),
    }
    .run(&[&bufs[0], &bufs[1], &bufs[2], &out, &lse])
    .unwrap_or_else(|e| panic!("attention f32 with lse {what}: {e}"));
    let got_out = common::download(&out, want.out.len(), DType::F32);
    let err = relative_worst(&format!("out {what}"), &got_out, &want.out, 1e-3);
    assert!(
        err <= TOLERANCE,
        "out {what}: worst error {err:.3e} of the largest magnitude"
    );
    let got_lse = common::download(&lse, want.lse.len(), DType::F32);
    for (i, (g, w)) in got_lse.iter().zip(&want.lse).enumerate() {
        assert!(
            (g - w).abs() <= TOLERANCE * (1.0 + w.abs()),
            "lse {what} row {i}: got {g}, want {w}"
        );
    }

    let grads: Vec<DeviceBuffer> = shapes[..3]
        .iter()
        .map(|s| common::poisoned(b, s.iter().product(), DType::F32))
        .collect();
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: operand(&bufs[0], shapes[0], c.heads, DType::F32),
        k: operand(&bufs[1], shapes[1], c.heads, DType::F32),
        v: operand(&bufs[2], shapes[2], c.heads, DType::F32),
        grad: operand(&bufs[3], shapes[3], c.heads, DType::F32),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        grad_q: common::arg(&grads[0], &shapes[0], DType::F32),
        grad_k: common::arg(&grads[1], &shapes[1], DType::F32),
        grad_v: common::arg(&grads[2], &shapes[2], DType::F32),
        saved: Some(AttentionSaved {
            out: common::arg(&out, &shapes[3], DType::F32),
            lse: common::arg(&lse, &[c.b, c.l], DType::F32),
        }),
    }))
    .run(&[
        &bufs[0], &bufs[1], &bufs[2], &bufs[3], &out, &lse, &grads[0], &grads[1], &grads[2],
    ])
    .unwrap_or_else(|e| panic!("attention_backward f32 with saved values {what}: {e}"));
    // With one key, dS = dO·v − dO·O is zero up to the round-off of two f32 dot products, so the
    // query and key gradients are judged against a tenth of the largest gradient magnitude.
    let largest = want.grads.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let got = common::download(&grads[n], want.grads[n].len(), DType::F32);
        let err = relative_worst(&format!("{name} {what}"), &got, &want.grads[n], 0.1 * largest);
        assert!(
            err <= TOLERANCE,
            "{name} {what}: worst error {err:.3e} of the largest magnitude"
        );
    }
}

/// Every head dim, causal and not, over lengths around and off the 64-row tiles.
#[test]
fn forward_and_backward_match_the_composed_formula() {
    let _serial = one_at_a_time();
    let Some(b) = backend("forward_and_backward_match_the_composed_formula") else {
        return;
    };
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
        for e in [32, 64, 80, 128] {
            cases.extend([
                case(2, 64, 64, e, causal, false),
                case(3, 77, 300, e, causal, true),
                case(2, 300, 77, e, causal, false),
                case(1, 1, 1, e, causal, false),
                case(2, 130, 1, e, causal, false),
                case(1, 1, 200, e, causal, true),
            ]);
        }
        for e in [48, 96, 112] {
            cases.push(case(2, 77, 130, e, causal, true));
        }
    }
    for (n, c) in cases.iter().enumerate() {
        check_case(&b, *c, 1000 + 10 * n as u64);
    }
}

/// No keys (S = 0): every output row is NaN (0 / 0, as the kernel contract says), its
/// log-sum-exp −inf, and the query gradient zero. No queries (L = 0): zero key and value
/// gradients.
#[test]
fn no_keys_and_no_queries() {
    let _serial = one_at_a_time();
    let Some(b) = backend("no_keys_and_no_queries") else {
        return;
    };
    let e = 64;
    for (batch, l, s) in [(2, 17, 0), (2, 0, 70)] {
        let shapes = [[batch, l, e], [batch, s, e], [batch, s, e], [batch, l, e]];
        let bufs: Vec<DeviceBuffer> = shapes
            .iter()
            .enumerate()
            .map(|(n, sh)| {
                common::upload(
                    &b,
                    &common::values(sh.iter().product(), 60 + n as u64, DType::F32),
                    DType::F32,
                )
            })
            .collect();
        let out = common::poisoned(&b, batch * l * e, DType::F32);
        let lse = common::poisoned(&b, batch * l, DType::F32);
        let arg = |buf: &DeviceBuffer, shape: &[usize]| common::arg(buf, shape, DType::F32);
        Kernel::Attention {
            q: arg(&bufs[0], &shapes[0]),
            k: arg(&bufs[1], &shapes[1]),
            v: arg(&bufs[2], &shapes[2]),
            scale: 0.125,
            causal: true,
            mask: None,
            out: arg(&out, &shapes[3]),
            lse: Some(arg(&lse, &[batch, l])),
        }
        .run(&[&bufs[0], &bufs[1], &bufs[2], &out, &lse])
        .unwrap_or_else(|e| panic!("attention f32 L = {l}, S = {s}: {e}"));
        let got_out = common::download(&out, batch * l * e, DType::F32);
        assert!(
            got_out.iter().all(|v| v.is_nan()),
            "L = {l}, S = {s}: an output row that sees no key is not NaN"
        );
        let got_lse = common::download(&lse, batch * l, DType::F32);
        assert!(
            got_lse.iter().all(|&v| v == f64::NEG_INFINITY),
            "L = {l}, S = {s}: log-sum-exp {got_lse:?}"
        );
        let grads: Vec<DeviceBuffer> = shapes[..3]
            .iter()
            .map(|sh| common::poisoned(&b, sh.iter().product(), DType::F32))
            .collect();
        Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
            q: arg(&bufs[0], &shapes[0]),
            k: arg(&bufs[1], &shapes[1]),
            v: arg(&bufs[2], &shapes[2]),
            grad: arg(&bufs[3], &shapes[3]),
            scale: 0.125,
            causal: true,
            mask: None,
            grad_q: arg(&grads[0], &shapes[0]),
            grad_k: arg(&grads[1], &shapes[1]),
            grad_v: arg(&grads[2], &shapes[2]),
            saved: Some(AttentionSaved {
                out: arg(&out, &shapes[3]),
                lse: arg(&lse, &[batch, l]),
            }),
        }))
        .run(&[
            &bufs[0], &bufs[1], &bufs[2], &bufs[3], &out, &lse, &grads[0], &grads[1], &grads[2],
        ])
        .unwrap_or_else(|e| panic!("attention_backward f32 L = {l}, S = {s}: {e}"));
        for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
            let got = common::download(&grads[n], shapes[n].iter().product(), DType::F32);
            assert!(got.iter().all(|&v| v == 0.0), "{name} L = {l}, S = {s}: {got:?}");
        }
    }
}

/// Head dims off the kernels' list, Ev ≠ E, rows not on 16 bytes and other dtypes than f32 and
/// the 16-bit ones are refused with `Unsupported` (the frontend then composes); the backward
/// given saved values for a head dim the tiled f32 kernel does not take runs the warp-per-row
/// kernels instead.
#[test]
fn refuses_what_it_does_not_take() {
    let _serial = one_at_a_time();
    let Some(b) = backend("refuses_what_it_does_not_take") else {
        return;
    };
    let buf = common::upload(&b, &common::values(4 * 66 * 4, 5, DType::F32), DType::F32);
    let out = common::poisoned(&b, 4 * 66 * 4, DType::F32);
    let forward = |q: TensorArg, k: TensorArg, v: TensorArg, dst: TensorArg| {
        Kernel::Attention {
            q,
            k,
            v,
            scale: 0.1,
            causal: false,
            mask: None,
            out: dst,
            lse: None,
        }
        .run(&[&buf, &out])
    };
    let dense = |shape: &[usize]| common::arg(&buf, shape, DType::F32);
    let dense_out = |shape: &[usize]| common::arg(&out, shape, DType::F32);
    let cases = [
        (
            "head dim 40",
            forward(
                dense(&[1, 4, 40]),
                dense(&[1, 4, 40]),
                dense(&[1, 4, 40]),
                dense_out(&[1, 4, 40]),
            ),
        ),
        (
            "head dim 256",
            forward(
                dense(&[1, 4, 256]),
                dense(&[1, 4, 256]),
                dense(&[1, 4, 256]),
                dense_out(&[1, 4, 256]),
            ),
        ),
        (
            "Ev 32, E 64",
            forward(
                dense(&[1, 4, 64]),
                dense(&[1, 4, 64]),
                dense(&[1, 4, 32]),
                dense_out(&[1, 4, 32]),
            ),
        ),
        ("rows 66 floats apart", {
            let strided = buf.arg(
                Layout::from_parts(&[1, 4, 64], &[264, 66, 1], 0).expect("layout"),
                DType::F32,
            );
            forward(strided.clone(), strided.clone(), strided, dense_out(&[1, 4, 64]))
        }),
    ];
    for (what, result) in cases {
        assert!(matches!(result, Err(Error::Unsupported { .. })), "{what}: {result:?}");
    }

    // Head dim 40 with saved values: the warp-per-row kernels, against the f64 formula.
    let c = Case {
        b: 2,
        l: 9,
        s: 11,
        e: 40,
        causal: true,
        heads: false,
    };
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.e], [c.b, c.l, c.e]];
    let raw: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| common::values(s.iter().product(), 40 + n as u64, DType::F32))
        .map(|v| v.into_iter().map(|x| x / 2.0).collect())
        .collect();
    let want = composed(&c, [&raw[0], &raw[1], &raw[2], &raw[3]]);
    let bufs: Vec<DeviceBuffer> = raw.iter().map(|r| common::upload(&b, r, DType::F32)).collect();
    let saved_out = common::upload(&b, &want.out, DType::F32);
    let saved_lse = common::upload(&b, &want.lse, DType::F32);
    let grads: Vec<DeviceBuffer> = shapes[..3]
        .iter()
        .map(|s| common::poisoned(&b, s.iter().product(), DType::F32))
        .collect();
    let arg = |buf: &DeviceBuffer, shape: &[usize]| common::arg(buf, shape, DType::F32);
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: arg(&bufs[0], &shapes[0]),
        k: arg(&bufs[1], &shapes[1]),
        v: arg(&bufs[2], &shapes[2]),
        grad: arg(&bufs[3], &shapes[3]),
        scale: c.scale(),
        causal: c.causal,
        mask: None,
        grad_q: arg(&grads[0], &shapes[0]),
        grad_k: arg(&grads[1], &shapes[1]),
        grad_v: arg(&grads[2], &shapes[2]),
        saved: Some(AttentionSaved {
            out: arg(&saved_out, &shapes[3]),
            lse: arg(&saved_lse, &[c.b, c.l]),
        }),
    }))
    .run(&[
        &bufs[0], &bufs[1], &bufs[2], &bufs[3], &saved_out, &saved_lse, &grads[0], &grads[1], &grads[2],
    ])
    .expect("attention_backward f32, head dim 40");
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let got = common::download(&grads[n], want.grads[n].len(), DType::F32);
        let err = relative_worst(name, &got, &want.grads[n], 1e-3);
        assert!(err <= 1e-4, "{name} head dim 40: worst error {err:.3e}");
    }
}

/// A long sequence (4 heads of 4096 queries and keys: a score matrix would take 256 MiB) runs
/// its forward and tiled backward with no memory beyond the operands but the backward's `[B, L]`
/// scratch row, and gives finite results.
#[test]
fn long_sequences_keep_no_score_matrix() {
    let _serial = one_at_a_time();
    let Some(b) = backend("long_sequences_keep_no_score_matrix") else {
        return;
    };
    let (heads, n, e) = (4, 4096, 64);
    let numel = heads * n * e;
    let ins: Vec<DeviceBuffer> = (0..4)
        .map(|i| common::upload(&b, &common::values(numel, i, DType::F32), DType::F32))
        .collect();
    let out = common::poisoned(&b, numel, DType::F32);
    let lse = common::poisoned(&b, heads * n, DType::F32);
    let grads: Vec<DeviceBuffer> = (0..3).map(|_| common::poisoned(&b, numel, DType::F32)).collect();
    let arg = |buf: &DeviceBuffer| common::arg(buf, &[heads, n, e], DType::F32);
    b.synchronize().expect("synchronize");
    let before = b.memory_stats().allocated_bytes;
    b.allocator().reset_peaks();
    Kernel::Attention {
        q: arg(&ins[0]),
        k: arg(&ins[1]),
        v: arg(&ins[2]),
        scale: 0.125,
        causal: true,
        mask: None,
        out: arg(&out),
        lse: Some(common::arg(&lse, &[heads, n], DType::F32)),
    }
    .run(&[&ins[0], &ins[1], &ins[2], &out, &lse])
    .expect("attention f32");
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: arg(&ins[0]),
        k: arg(&ins[1]),
        v: arg(&ins[2]),
        grad: arg(&ins[3]),
        scale: 0.125,
        causal: true,
        mask: None,
        grad_q: arg(&grads[0]),
        grad_k: arg(&grads[1]),
        grad_v: arg(&grads[2]),
        saved: Some(AttentionSaved {
            out: arg(&out),
            lse: common::arg(&lse, &[heads, n], DType::F32),
        }),
    }))
    .run(&[
        &ins[0], &ins[1], &ins[2], &ins[3], &out, &lse, &grads[0], &grads[1], &grads[2],
    ])
    .expect("attention_backward f32");
    b.synchronize().expect("synchronize");
    let extra = b.memory_stats().peak_allocated_bytes.saturating_sub(before);
    let scratch = heads * n * 4;
    assert!(
        extra <= 2 * scratch,
        "forward and backward allocated {extra} bytes beyond their operands; the scratch is {scratch} \
         and a score matrix would be {}",
        heads * n * n * 4
    );
    for (name, buf) in ["out", "grad_q", "grad_k", "grad_v"]
        .iter()
        .zip([&out, &grads[0], &grads[1], &grads[2]])
    {
        let got = common::download(buf, numel, DType::F32);
        assert!(got.iter().all(|v| v.is_finite()), "{name} has a non-finite element");
    }
}
