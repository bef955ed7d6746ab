//! `AttentionBackward` (an optional fused kernel): where a backend lists it for a dtype, the
//! gradients of q [B, L, E], k [B, S, E] and v [B, S, Ev] for an incoming gradient [B, L, Ev]
//! against the f64 formula of `kernel.rs`'s module docs on the same (rounded) inputs, causal and
//! not, with L < S (keys no causal query sees get zero gradients), L > S, Ev ≠ E, no keys at all
//! (a zero query gradient), no queries at all (zero key and value gradients), heads interleaved
//! in memory, a batch broadcast (stride 0) and padded rows. A fused kernel may refuse
//! (`Unsupported`) head dims other than 64 and 128, E ≠ Ev, an unaligned offset or a transposed
//! last dimension, so that the frontend composes the gradients, but what it accepts must be
//! right. Every case runs again with the forward's output and log-sum-exp given as saved values
//! (which a backend may use, e.g. in a tiled kernel that rounds P and dS to a 16-bit dtype for
//! its products: the bound then uses that dtype's roundoff). Dtypes not listed are refused.
//! Where `AttentionMask` is listed too, the same with additive masks (`attention_mask.rs`'s),
//! rows a mask removes entirely getting no gradient; where it is not, a masked kernel is refused.
//!
//! The allowed error is one rounding of each gradient plus the compute type's error in the
//! probabilities (relative, growing with the size of the scores), in the two dot products and in
//! the sums over keys or queries, each scaled by the magnitudes that enter the element's sum.

use crate::dtype::DType;
use crate::error::{Error, ErrorKind};
use crate::kernel::TensorArg;
use crate::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
use crate::kernel::{Kernel, Op};
use crate::layout::{Layout, contiguous_strides};

use super::attention::Lay;
use super::attention_mask::Mask;
use super::harness::Harness;
use super::reference::{Tolerance, accumulation_eps};
use super::{Operand, Spec};

/// One case: sizes, mask, and the layouts of (q, k, v, grad).
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    causal: bool,
    lays: [Lay; 4],
    mask: Mask,
}

/// The three gradients in f64 with the magnitude bounding each element's error, and the
/// forward's output and per-row log-sum-exp (what a backend may be given as saved values).
struct Reference {
    grads: [Vec<f64>; 3],
    bounds: [Vec<f64>; 3],
    out: Vec<f64>,
    lse: Vec<f64>,
}

fn dot(a: &[f64], b: &[f64]) -> (f64, f64) {
    a.iter()
        .zip(b)
        .fold((0.0, 0.0), |(s, m), (x, y)| (s + x * y, m + (x * y).abs()))
}

/// `kernel.rs`'s formula in f64, with a first-order bound of the error of a kernel computing in
/// a type of unit error `u`: each probability is off by a relative `4u·(|s_ij| + max_j |s_ij| +
/// 1)` (its score and the row's log-sum-exp, with `|s|` the magnitude `scale·Σ|q||k|`), each dP
/// by `4u·Σ|dO||v|`, D by the sum of both over the row; sums over up to max(L, S) terms add
/// `4u·sqrt(terms)` of the magnitudes they add up (`P·(|dP| + |D|)` for dS, so that forming
/// `Σ P dP k − D Σ P k` is allowed too). `out_u` is the unit roundoff of a saved output the
/// kernel may form D from (`D = dO·O`): D is then off by `out_u·Σ|dO|·Σ P|v|` more.
fn reference(c: &Case, scale: f64, u: f64, out_u: f64, [q, k, v, g]: [&[f64]; 4], mask: Option<&[f64]>) -> Reference {
    let (e, ev) = (c.e, c.ev);
    let mut grads = [
        vec![0.0; c.b * c.l * e],
        vec![0.0; c.b * c.s * e],
        vec![0.0; c.b * c.s * ev],
    ];
    let mut bounds = grads.clone();
    let (mut out, mut lse) = (vec![f64::NAN; c.b * c.l * ev], vec![f64::NEG_INFINITY; c.b * c.l]);
    let sum_err = 4.0 * u * (c.l.max(c.s).max(1) as f64).sqrt();
    for b in 0..c.b {
        let row = |n: usize, i: usize, w: usize| (b * n + i) * w..(b * n + i + 1) * w;
        for i in 0..c.l {
            let (qi, gi) = (&q[row(c.l, i, e)], &g[row(c.l, i, ev)]);
            let seen = if c.causal { c.s.min(i + 1) } else { c.s };
            // Scores with their magnitudes; dP with its magnitudes.
            let (mut p, mut size, mut dp) = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..seen {
                let (s, sm) = dot(qi, &k[row(c.s, j, e)]);
                // The mask views are [outer, inner, L, S] with outer · inner = B, row-major.
                let add = mask.map_or(0.0, |m| m[(b * c.l + i) * c.s + j]);
                p.push(scale * s + add);
                size.push(scale.abs() * sm + if add.is_finite() { add.abs() } else { 0.0 });
                dp.push(dot(gi, &v[row(c.s, j, ev)]));
            }
            let largest = size.iter().copied().fold(0.0, f64::max);
            let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if mask.is_some() && max == f64::NEG_INFINITY {
                // The mask removes every key of this row: output 0, lse −inf, no gradient.
                out[row(c.l, i, ev)].iter_mut().for_each(|o| *o = 0.0);
                continue;
            }
            let total: f64 = p.iter().map(|s| (s - max).exp()).sum();
            p.iter_mut().for_each(|s| *s = (*s - max).exp() / total);
            lse[b * c.l + i] = max + total.ln();
            let mut out_mag = 0.0;
            for x in 0..ev {
                let (mut o, mut o_abs) = (0.0, 0.0);
                for (j, pj) in p.iter().enumerate() {
                    let vx = v[row(c.s, j, ev).start + x];
                    o += pj * vx;
                    o_abs += pj * vx.abs();
                }
                out[(b * c.l + i) * ev + x] = o;
                out_mag += gi[x].abs() * o_abs;
            }
            let rel_p: Vec<f64> = size.iter().map(|a| 4.0 * u * (a + largest + 1.0)).collect();
            let delta: f64 = p.iter().zip(&dp).map(|(p, (d, _))| p * d).sum();
            let delta_err: f64 = (0..seen)
                .map(|j| p[j] * (rel_p[j] * dp[j].0.abs() + 4.0 * u * dp[j].1))
                .sum::<f64>()
                + out_u * out_mag;
            for (j, (&pj, &(d, dm))) in p.iter().zip(&dp).enumerate() {
                let ds = pj * (d - delta);
                let ds_err =
                    pj * (rel_p[j] * (d - delta).abs() + 4.0 * u * dm + delta_err + sum_err * (d.abs() + delta.abs()));
                let (kj, vj) = (row(c.s, j, e), row(c.s, j, ev));
                for x in 0..e {
                    let (qx, kx) = (qi[x], k[kj.start + x]);
                    grads[0][(b * c.l + i) * e + x] += scale * ds * kx;
                    bounds[0][(b * c.l + i) * e + x] += scale.abs() * ds_err * kx.abs();
                    grads[1][(b * c.s + j) * e + x] += scale * ds * qx;
                    bounds[1][(b * c.s + j) * e + x] += scale.abs() * ds_err * qx.abs();
                }
                for x in 0..ev {
                    grads[2][vj.start + x] += pj * gi[x];
                    bounds[2][vj.start + x] += (rel_p[j] + sum_err) * pj * gi[x].abs();
                }
            }
        }
    }
    Reference {
        grads,
        bounds,
        out,
        lse,
    }
}

/// The unit roundoff of a 16-bit float (a kernel may round P and dS to it for its products),
/// else 0.
fn half_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 0.0,
    }
}

/// One case; with `saved`, the forward's output (rounded to the dtype) and log-sum-exp (f32) go
/// with the kernel, which may then round P and dS to a 16-bit dtype for its products. A masked
/// case without them gets the same allowance: the kernel contract lets a backend that takes
/// masks only in its tiled kernel run its own forward first, in the dtype.
fn attention_backward_case(h: &Harness, dtype: DType, c: Case, saved: bool) {
    let spec = Spec::new((-1.0, 1.0), (-1, 1));
    let operand = |lay: Lay, shape: [usize; 3]| -> Operand {
        let v = lay.view(shape);
        let base = h.random_values(dtype, v.base_len, spec);
        h.operand_from(dtype, v, &base)
    };
    let mask = c.mask.operand(h, dtype, [c.b, c.l, c.s]);
    let q = operand(c.lays[0], [c.b, c.l, c.e]);
    let k = operand(c.lays[1], [c.b, c.s, c.e]);
    let v = operand(c.lays[2], [c.b, c.s, c.ev]);
    let g = operand(c.lays[3], [c.b, c.l, c.ev]);
    let scale = 2.0 / (c.e.max(1) as f64).sqrt();
    // Each gradient eight elements into a poisoned buffer with eight more after it: nothing
    // outside the gradients may be written.
    // The gradients keep the operands' batch dimensions (two with `Lay::TwoBatch`).
    let batched = |shape| c.lays[0].batched(shape);
    let out = |shape: [usize; 3]| {
        let shape = batched(shape);
        let numel: usize = shape.iter().product();
        let layout = Layout::from_parts(&shape, &contiguous_strides(&shape), 8).expect("suite shapes are small");
        (h.poisoned(dtype, numel + 16), layout)
    };
    let outs = [out([c.b, c.l, c.e]), out([c.b, c.s, c.e]), out([c.b, c.s, c.ev])];
    let inputs = [&q.values[..], &k.values[..], &v.values[..], &g.values[..]];
    let (u, out_u) = if saved || c.mask != Mask::None {
        let half = half_roundoff(dtype);
        (accumulation_eps(dtype).max(half), half)
    } else {
        (accumulation_eps(dtype), 0.0)
    };
    let want = reference(&c, scale, u, out_u, inputs, mask.as_ref().map(|m| &m.values[..]));
    let saved_bufs = saved.then(|| {
        // One element more than the views, so that no upload is empty.
        let out: Vec<f64> = want.out.iter().copied().chain([0.0]).collect();
        let lse: Vec<f64> = want.lse.iter().map(|&x| f64::from(x as f32)).chain([0.0]).collect();
        (h.upload(dtype, &out), h.upload(DType::F32, &lse))
    });
    let what = format!(
        "attention_backward {dtype} B {} L {} S {} E {} Ev {} {}{} (q {:?}, k {:?}, v {:?}, grad {:?}, mask {:?})",
        c.b,
        c.l,
        c.s,
        c.e,
        c.ev,
        if c.causal { "causal" } else { "full" },
        if saved { " with saved output and lse" } else { "" },
        c.lays[0],
        c.lays[1],
        c.lays[2],
        c.lays[3],
        c.mask
    );
    let kernel = Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: q.arg(),
        k: k.arg(),
        v: v.arg(),
        grad: g.arg(),
        scale,
        causal: c.causal,
        mask: mask.as_ref().map(|m| AttentionMask { values: m.arg() }),
        grad_q: outs[0].0.arg(&outs[0].1),
        grad_k: outs[1].0.arg(&outs[1].1),
        grad_v: outs[2].0.arg(&outs[2].1),
        saved: saved_bufs.as_ref().map(|(out, lse)| AttentionSaved {
            out: out.contiguous(&batched([c.b, c.l, c.ev])),
            lse: lse.contiguous(&[c.b, c.l]),
        }),
    }));
    let may_refuse = !matches!(c.e, 64 | 128) || c.e != c.ev || !c.lays.iter().all(|l| l.expected());
    match h.run(&kernel).and_then(|()| h.backend().synchronize()) {
        Ok(()) => {}
        Err(Error::Unsupported { .. }) if may_refuse => {
            h.count_check();
            return;
        }
        Err(e) => {
            h.fail(format!("{what}: launch failed with {} error: {e}", e.kind_name()));
            return;
        }
    }
    let tol = Tolerance::of(dtype);
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let (buf, layout) = &outs[n];
        let bound = &want.bounds[n];
        h.check_with(&format!("{what} {name}"), buf, layout, &want.grads[n], |i, w| {
            tol.allowed(w) + bound[i]
        });
    }
}

/// `AttentionBackward`: every dtype the backend lists over the case table; the others are refused.
pub fn attention_backward(h: &Harness) {
    use Lay::*;
    let case = |b, l, s, e, ev, causal, lays| Case {
        b,
        l,
        s,
        e,
        ev,
        causal,
        lays,
        mask: Mask::None,
    };
    let dense = [Dense; 4];
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.extend([
            case(2, 1, 1, 64, 64, causal, dense),
            case(3, 17, 17, 64, 64, causal, dense),
            case(2, 100, 37, 64, 64, causal, [Heads, Heads, Heads, Dense]),
            case(2, 37, 100, 128, 128, causal, [Padded, Broadcast, Heads, Padded]),
            case(1, 130, 129, 128, 128, causal, [Dense, Padded, Broadcast, Heads]),
            case(2, 5, 0, 64, 64, causal, dense),
            case(2, 0, 7, 64, 64, causal, dense),
            case(1, 200, 300, 64, 64, causal, dense),
            // May be refused (the frontend then composes), but must be right when accepted.
            case(2, 33, 20, 40, 24, causal, dense),
            case(2, 20, 45, 32, 48, causal, [Heads, Padded, Broadcast, Dense]),
            case(2, 9, 11, 64, 64, causal, [Offset, Dense, Transposed, Dense]),
            case(1, 6, 5, 300, 260, causal, dense),
            case(6, 70, 90, 64, 64, causal, [TwoBatch; 4]),
            case(4, 33, 33, 128, 128, causal, [TwoBatch; 4]),
            case(4, 20, 30, 32, 32, causal, [TwoBatch; 4]),
        ]);
    }
    let mut masked = Vec::new();
    for causal in [false, true] {
        for mask in [Mask::Padding, Mask::Shared, Mask::Full] {
            for (b, l, s, e, lays) in [
                (2, 17, 23, 64, dense),
                (3, 100, 37, 64, [Heads, Heads, Heads, Dense]),
                (2, 37, 100, 128, [Padded, Broadcast, Heads, Padded]),
                (4, 40, 70, 64, [TwoBatch; 4]),
            ] {
                masked.push(Case {
                    mask,
                    ..case(b, l, s, e, e, causal, lays)
                });
            }
        }
    }
    for dtype in DType::ALL {
        if !dtype.is_float() {
            continue;
        }
        if !h.supports(Op::AttentionBackward, dtype) {
            expect_refused(h, dtype, false);
            continue;
        }
        for c in &cases {
            attention_backward_case(h, dtype, *c, false);
            attention_backward_case(h, dtype, *c, true);
        }
        if h.supports(Op::AttentionMask, dtype) {
            for c in &masked {
                attention_backward_case(h, dtype, *c, false);
                attention_backward_case(h, dtype, *c, true);
            }
        } else {
            expect_refused(h, dtype, true);
        }
    }
    malformed_saved(h);
}

/// The backward of a small [1, 2, 4] attention in `dtype` (`masked`: with a [1, 1, 2, 2] mask)
/// is refused with `Unsupported`: where the backend does not list `AttentionBackward` for
/// `dtype` (masked or not), or lists it but not `AttentionMask` (masked; the frontend then
/// composes the gradients).
fn expect_refused(h: &Harness, dtype: DType, masked: bool) {
    let (buf, outs) = (h.upload(dtype, &[0.5; 8]), h.poisoned(dtype, 24));
    let mask = h.upload(dtype, &[0.0; 4]);
    let arg = buf.contiguous(&[1, 2, 4]);
    let grad = |n: usize| {
        let layout = Layout::from_parts(&[1, 2, 4], &[8, 4, 1], 8 * n).expect("small");
        outs.arg(&layout)
    };
    let kernel = Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: arg.clone(),
        k: arg.clone(),
        v: arg.clone(),
        grad: arg,
        scale: 0.5,
        causal: false,
        mask: masked.then(|| AttentionMask {
            values: mask.contiguous(&[1, 1, 2, 2]),
        }),
        grad_q: grad(0),
        grad_k: grad(1),
        grad_v: grad(2),
        saved: None,
    }));
    let what = if masked {
        "attention_backward with a mask"
    } else {
        "attention_backward"
    };
    h.expect_unsupported(&format!("{what} {dtype}"), &kernel);
}

/// Malformed saved values for a [1, 4, 8] attention (and a forward writing a malformed
/// log-sum-exp): an output of the wrong shape, a log-sum-exp of the wrong shape, dtype or
/// layout, and a gradient written over the saved output.
fn malformed_saved(h: &Harness) {
    use ErrorKind::*;
    let dtype = [DType::BF16, DType::F16, DType::F32]
        .into_iter()
        .find(|&d| h.supports(Op::AttentionBackward, d))
        .unwrap_or(DType::F32);
    let input = h.upload(dtype, &[0.25; 32]);
    let out = h.upload(dtype, &[0.5; 64]);
    let lse = h.upload(DType::F32, &[1.0; 8]);
    let lse_wide = h.upload(DType::F64, &[1.0; 8]);
    let grads = h.poisoned(dtype, 96);
    let grad_at = |n: usize| {
        let layout = Layout::from_parts(&[1, 4, 8], &[32, 8, 1], 32 * n).expect("small");
        grads.arg(&layout)
    };
    let arg = input.contiguous(&[1, 4, 8]);
    let backward = |saved_out: TensorArg, saved_lse: TensorArg, grad_q: TensorArg| {
        Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
            q: arg.clone(),
            k: arg.clone(),
            v: arg.clone(),
            grad: arg.clone(),
            scale: 0.5,
            causal: true,
            mask: None,
            grad_q,
            grad_k: grad_at(1),
            grad_v: grad_at(2),
            saved: Some(AttentionSaved {
                out: saved_out,
                lse: saved_lse,
            }),
        }))
    };
    let transposed = Layout::from_parts(&[1, 4], &[4, 2], 0).expect("small");
    let cases = [
        (
            "attention_backward with a saved output of [1, 4, 4]",
            backward(out.contiguous(&[1, 4, 4]), lse.contiguous(&[1, 4]), grad_at(0)),
            ShapeMismatch,
        ),
        (
            "attention_backward with a saved lse of [4]",
            backward(out.contiguous(&[1, 4, 8]), lse.contiguous(&[4]), grad_at(0)),
            InvalidArgument,
        ),
        (
            "attention_backward with a saved lse in f64",
            backward(out.contiguous(&[1, 4, 8]), lse_wide.contiguous(&[1, 4]), grad_at(0)),
            WrongDType,
        ),
        (
            "attention_backward with a strided saved lse",
            backward(out.contiguous(&[1, 4, 8]), lse.arg(&transposed), grad_at(0)),
            InvalidArgument,
        ),
        (
            "attention_backward writing grad_q over the saved output",
            backward(
                out.contiguous(&[1, 4, 8]),
                lse.contiguous(&[1, 4]),
                out.contiguous(&[1, 4, 8]),
            ),
            InvalidArgument,
        ),
        (
            "attention writing a log-sum-exp of [1, 2]",
            Kernel::Attention {
                q: arg.clone(),
                k: arg.clone(),
                v: arg.clone(),
                scale: 0.5,
                causal: false,
                mask: None,
                out: out.contiguous(&[1, 4, 8]),
                lse: Some(lse.contiguous(&[1, 2])),
            },
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        h.expect_refused(what, &kernel, kind);
    }
}
