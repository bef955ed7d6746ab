//! `Attention` (the optional fused kernel): where a backend lists it for a dtype, q [B, L, E],
//! k [B, S, E] and v [B, S, Ev] against an f64 softmax reference, causal and not, with L ≠ S,
//! lengths that are not multiples of any tile (1, 17, 100, 1000, 1024), no keys at all (NaN rows),
//! head dims 64 and 128, heads interleaved in memory, a batch broadcast (stride 0) and padded
//! rows. A fused kernel may support only some head dims and layouts: for the others (head dim 40,
//! an unaligned offset, a transposed last dimension) it may refuse with `Unsupported`, so that the
//! frontend composes the result, but what it accepts must be right. Each case asks for the
//! per-row log-sum-exp too, checked where the backend writes it (it may refuse the kernel with
//! it, and must then run it without). Dtypes not listed are refused. Where `AttentionMask` is
//! listed too, additive masks (key padding and a mask shared by every batch entry, both read with
//! stride-0 dimensions, and one per entry from an offset) alone and with `causal`, rows the mask
//! removes entirely giving 0 and lse −inf; where it is not, a masked kernel is refused.

use crate::dtype::DType;
use crate::error::Error;
use crate::kernel::{AttentionMask, Kernel, Op};
use crate::layout::Layout;

use super::attention_mask::Mask;
use super::harness::Harness;
use super::reference::Tolerance;
use super::views::{View, ViewKind, view};
use super::{Operand, Spec};

/// How q, k or v (and, in the backward suite, the incoming gradient) is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lay {
    /// Row-major [B, N, E].
    Dense,
    /// Heads interleaved: a [N, B, E] buffer seen as [B, N, E] (batch stride E).
    Heads,
    /// One [1, N, E] block broadcast over the batch (stride 0).
    Broadcast,
    /// Rows padded to E + 8 elements.
    Padded,
    /// Dense, three elements into the buffer (rows off 16 bytes): may be refused.
    Offset,
    /// The last two dimensions swapped (last stride ≠ 1): may be refused.
    Transposed,
    /// Two batch dimensions [2, B / 2, N, E] that merge into no single stride, the heads of a
    /// [2, N, B / 2, E] buffer read in place (a packed projection's): may be refused (the
    /// frontend then copies). Every operand of a case takes it, or none.
    TwoBatch,
}

impl Lay {
    pub(super) fn view(self, shape: [usize; 3]) -> View {
        let [b, n, e] = shape;
        let parts = |kind, base_len, strides: [usize; 3], offset| View {
            kind,
            base_len,
            layout: Layout::from_parts(&shape, &strides, offset).expect("suite shapes are small"),
        };
        match self {
            Lay::Dense => view(ViewKind::Contiguous, &shape),
            Lay::Heads => parts(ViewKind::Permuted, n * b * e, [e, b * e, 1], 0),
            Lay::Broadcast => parts(ViewKind::Broadcast, n * e, [0, e, 1], 0),
            Lay::Padded => parts(ViewKind::Narrowed, b * n * (e + 8), [n * (e + 8), e + 8, 1], 0),
            Lay::Offset => view(ViewKind::Offset, &shape),
            Lay::Transposed => view(ViewKind::Transposed, &shape),
            Lay::TwoBatch => {
                let inner = b / 2;
                assert_eq!(2 * inner, b, "two batch dimensions split an even batch");
                View {
                    kind: ViewKind::Permuted,
                    base_len: b * n * e,
                    layout: Layout::from_parts(&[2, inner, n, e], &[n * inner * e, e, inner * e, 1], 0)
                        .expect("suite shapes are small"),
                }
            }
        }
    }

    /// Layouts a fused kernel is expected to read (the others it may refuse).
    pub(super) fn expected(self) -> bool {
        !matches!(self, Lay::Offset | Lay::Transposed | Lay::TwoBatch)
    }

    /// The shape `[b, n, e]` with the batch dimensions this layout gives a case's operands
    /// (two, `[2, b / 2, n, e]`, for [`Lay::TwoBatch`]), as its outputs and gradients take it.
    pub(super) fn batched(self, [b, n, e]: [usize; 3]) -> Vec<usize> {
        if self == Lay::TwoBatch {
            vec![2, b / 2, n, e]
        } else {
            vec![b, n, e]
        }
    }
}

/// One attention case.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    causal: bool,
    lays: [Lay; 3],
    mask: Mask,
}

/// What the f64 reference gives for one case.
struct Reference {
    /// `softmax(scale · q kᵀ) v`.
    out: Vec<f64>,
    /// For each output, the magnitude `Σ p |v| / Σ p` that bounds the error of rounding the
    /// probabilities.
    mag: Vec<f64>,
    /// Each row's log-sum-exp of its scaled scores (−inf for no key).
    lse: Vec<f64>,
    /// Each row's largest score magnitude `scale · Σ |q| |k|` (bounds the error of the lse).
    lse_mag: Vec<f64>,
}

/// The f64 reference of one case.
fn reference(c: &Case, scale: f64, q: &[f64], k: &[f64], v: &[f64], mask: Option<&Operand>) -> Reference {
    let (mut out, mut mag) = (vec![0.0; c.b * c.l * c.ev], vec![0.0; c.b * c.l * c.ev]);
    let (mut lse, mut lse_mag) = (vec![0.0; c.b * c.l], vec![0.0; c.b * c.l]);
    let mut p = vec![0.0; c.s];
    for b in 0..c.b {
        for i in 0..c.l {
            let qi = &q[(b * c.l + i) * c.e..][..c.e];
            let mut max = f64::NEG_INFINITY;
            let mut largest = 0.0f64;
            for (j, pj) in p.iter_mut().enumerate() {
                *pj = if c.causal && j > i {
                    f64::NEG_INFINITY
                } else {
                    let kj = &k[(b * c.s + j) * c.e..][..c.e];
                    // The mask views are [outer, inner, L, S] with outer · inner = B, row-major.
                    let add = mask.map_or(0.0, |m| m.values[(b * c.l + i) * c.s + j]);
                    largest = largest.max(scale.abs() * qi.iter().zip(kj).map(|(x, y)| (x * y).abs()).sum::<f64>());
                    scale * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>() + add
                };
                max = max.max(*pj);
            }
            if mask.is_some() && max == f64::NEG_INFINITY {
                // The mask removes every key of this row: 0, and lse −inf.
                lse[b * c.l + i] = f64::NEG_INFINITY;
                continue;
            }
            let mut sum = 0.0;
            for pj in p.iter_mut() {
                *pj = (*pj - max).exp();
                sum += *pj;
            }
            lse[b * c.l + i] = max + sum.ln();
            lse_mag[b * c.l + i] = largest;
            let row = (b * c.l + i) * c.ev;
            for d in 0..c.ev {
                let (mut acc, mut abs) = (0.0, 0.0);
                for (j, pj) in p.iter().enumerate() {
                    let x = v[(b * c.s + j) * c.ev + d];
                    acc += pj * x;
                    abs += pj * x.abs();
                }
                // No key at all: 0 / 0, NaN as the kernel contract says.
                out[row + d] = acc / sum;
                mag[row + d] = abs / sum;
            }
        }
    }
    Reference { out, mag, lse, lse_mag }
}

/// Unit roundoff of the probabilities and the output (f32 accumulation elsewhere).
fn roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-20),
        _ => 1e-12,
    }
}

fn attention_case(h: &Harness, dtype: DType, c: Case) {
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
    let scale = 1.0 / (c.e as f64).sqrt() * 2.0;
    // The output keeps the operands' batch dimensions (two with `Lay::TwoBatch`).
    let out_shape = c.lays[0].batched([c.b, c.l, c.ev]);
    // Eight poisoned elements either side: nothing outside the output may be written.
    let numel = c.b * c.l * c.ev;
    let out = h.poisoned(dtype, numel + 16);
    // With two batch dimensions the output is the heads of a [2, L, B / 2, Ev] block (a strided
    // view the contract allows, a backend may refuse); else contiguous.
    let out_strides = if c.lays[0] == Lay::TwoBatch {
        let inner = c.b / 2;
        vec![c.l * inner * c.ev, c.ev, inner * c.ev, 1]
    } else {
        crate::layout::contiguous_strides(&out_shape).to_vec()
    };
    let out_layout = Layout::from_parts(&out_shape, &out_strides, 8).expect("suite shapes are small");
    let what = format!(
        "attention {dtype} B {} L {} S {} E {} Ev {} {} (q {:?}, k {:?}, v {:?}, mask {:?})",
        c.b,
        c.l,
        c.s,
        c.e,
        c.ev,
        if c.causal { "causal" } else { "full" },
        c.lays[0],
        c.lays[1],
        c.lays[2],
        c.mask
    );
    // The log-sum-exp rows, eight elements into a poisoned f32 buffer with eight more after.
    let lse = h.poisoned(DType::F32, c.b * c.l + 16);
    let lse_layout = Layout::from_parts(&[c.b, c.l], &[c.l, 1], 8).expect("suite shapes are small");
    let kernel = |with_lse: bool| Kernel::Attention {
        q: q.arg(),
        k: k.arg(),
        v: v.arg(),
        scale,
        causal: c.causal,
        mask: mask.as_ref().map(|m| Box::new(AttentionMask { values: m.arg() })),
        out: out.arg(&out_layout),
        lse: with_lse.then(|| lse.arg(&lse_layout)),
    };
    let may_refuse = !matches!(c.e, 64 | 128) || c.e != c.ev || !c.lays.iter().all(|l| l.expected());
    let run = |with_lse| h.run(&kernel(with_lse)).and_then(|()| h.backend().synchronize());
    // A backend that cannot write the log-sum-exp refuses it; the plain kernel must then run.
    let with_lse = match run(true) {
        Ok(()) => true,
        Err(Error::Unsupported { .. }) => false,
        Err(e) => {
            h.fail(format!(
                "{what} with lse: launch failed with {} error: {e}",
                e.kind_name()
            ));
            return;
        }
    };
    if !with_lse {
        match run(false) {
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
    }
    let want = reference(&c, scale, &q.values, &k.values, &v.values, mask.as_ref());
    let u = roundoff(dtype);
    let tol = Tolerance::of(dtype);
    h.check_with(&what, &out, &out_layout, &want.out, |i, w| {
        2.0 * u * want.mag[i] + u * w.abs() + tol.abs
    });
    if with_lse {
        // Scores accumulate in f32 from the rounded inputs; exp and log are approximations.
        let f32_u = 2f64.powi(-20);
        h.check_with(&format!("{what} lse"), &lse, &lse_layout, &want.lse, |i, w| {
            4.0 * f32_u * (want.lse_mag[i] + w.abs() + 1.0) * (c.e.max(1) as f64).sqrt()
        });
    }
}

/// `Attention`: every dtype the backend lists over the case table; the others are refused.
pub fn attention(h: &Harness) {
    use Lay::*;
    let case = |b, l, s, e, causal, lays| Case {
        b,
        l,
        s,
        e,
        ev: e,
        causal,
        lays,
        mask: Mask::None,
    };
    let dense = [Dense; 3];
    let mut cases = Vec::new();
    for causal in [false, true] {
        for e in [64, 128] {
            cases.extend([
                case(2, 1, 1, e, causal, dense),
                case(3, 17, 17, e, causal, dense),
                case(2, 100, 37, e, causal, dense),
                case(2, 37, 100, e, causal, [Heads, Heads, Heads]),
                case(4, 130, 129, e, causal, [Padded, Broadcast, Heads]),
                case(2, 5, 0, e, causal, dense),
            ]);
        }
        cases.extend([
            case(1, 1024, 1024, 64, causal, dense),
            case(2, 300, 1000, 64, causal, [Heads, Dense, Padded]),
            case(1, 200, 200, 128, causal, [Dense, Padded, Broadcast]),
            // May be refused (the frontend then composes), but must be right when accepted.
            case(2, 33, 20, 40, causal, dense),
            case(2, 33, 20, 64, causal, [Offset, Dense, Dense]),
            case(2, 33, 20, 64, causal, [Dense, Transposed, Dense]),
            case(6, 70, 90, 64, causal, [TwoBatch; 3]),
            case(4, 33, 33, 128, causal, [TwoBatch; 3]),
            Case {
                ev: 32,
                ..case(2, 19, 23, 64, causal, dense)
            },
        ]);
    }
    let mut masked = Vec::new();
    for causal in [false, true] {
        for mask in [Mask::Padding, Mask::Shared, Mask::Full] {
            for (b, l, s, e, lays) in [
                (2, 17, 23, 64, dense),
                (3, 100, 37, 64, [Heads, Heads, Heads]),
                (2, 130, 129, 128, [Padded, Broadcast, Heads]),
                (4, 40, 70, 64, [TwoBatch; 3]),
            ] {
                masked.push(Case {
                    mask,
                    ..case(b, l, s, e, causal, lays)
                });
            }
        }
    }
    for dtype in DType::ALL {
        if !dtype.is_float() {
            continue;
        }
        if !h.supports(Op::Attention, dtype) {
            expect_refused(h, dtype, false);
            continue;
        }
        for c in &cases {
            attention_case(h, dtype, *c);
        }
        if h.supports(Op::AttentionMask, dtype) {
            for c in &masked {
                attention_case(h, dtype, *c);
            }
        } else {
            expect_refused(h, dtype, true);
        }
    }
}

/// A small [1, 2, 4] attention in `dtype` (`masked`: with a [1, 1, 2, 2] mask) is refused with
/// `Unsupported`: where the backend does not list `Attention` for `dtype` (masked or not), or
/// lists it but not `AttentionMask` (masked; the frontend then composes it).
fn expect_refused(h: &Harness, dtype: DType, masked: bool) {
    let (buf, out) = (h.upload(dtype, &[0.5; 8]), h.poisoned(dtype, 8));
    let mask = h.upload(dtype, &[0.0; 4]);
    let arg = buf.contiguous(&[1, 2, 4]);
    let kernel = Kernel::Attention {
        q: arg.clone(),
        k: arg.clone(),
        v: arg,
        scale: 0.5,
        causal: false,
        mask: masked.then(|| {
            Box::new(AttentionMask {
                values: mask.contiguous(&[1, 1, 2, 2]),
            })
        }),
        out: out.contiguous(&[1, 2, 4]),
        lse: None,
    };
    let what = if masked { "attention with a mask" } else { "attention" };
    h.expect_unsupported(&format!("{what} {dtype}"), &kernel);
}
