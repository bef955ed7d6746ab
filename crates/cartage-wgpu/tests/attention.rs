//! The fused attention kernels on `wgpu:0` (`Kernel::Attention`, `Kernel::AttentionBackward`)
//! against the composed formula evaluated on the host in f64 from the same rounded inputs:
//! the output, each row's log-sum-exp and the three gradients, causal and not, L = S, L < S and
//! L > S, head dims 32, 64, 80 and 128, Ev ≠ E, several batch entries, lengths that are no
//! multiple of any tile, one key, no keys (NaN rows, −inf log-sum-exp, zero query gradient) and
//! no queries (zero key and value gradients), keys no causal query sees (zero gradients); the
//! backward both with the forward's saved output and log-sum-exp and without (it then runs the
//! forward itself). f32 within 2·10⁻⁵ of the largest magnitude, f16 and bf16 within their
//! rounding. The same with an additive mask ([`AttentionMask`]), causal and not: a key padding
//! mask broadcast over heads and query rows (strides 0), a full per-entry mask with −inf holes
//! and fully masked rows, one at a storage offset with padded rows, and one shared by every
//! batch entry and stored transposed; head dims 8, 64 and 100, L ≠ S, no keys and no queries.
//! A query row whose keys are all masked gives output 0, log-sum-exp −inf and zero gradients,
//! and nothing is NaN.
//! Then the ops are listed for f32, f16 and bf16 only, and head dims past 128 are refused with
//! `Unsupported` (the frontend then composes).

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
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

/// An additive mask `[outer, inner, L, S]` over the merged batch: its strides and storage
/// offset into `buffer` (the host values, rounded to the dtype).
struct Mask {
    shape: [usize; 4],
    strides: [usize; 4],
    offset: usize,
    buffer: Vec<f64>,
}

impl Mask {
    /// The mask of query row `i` and key `j` of batch entry `b`.
    fn at(&self, b: usize, i: usize, j: usize) -> f64 {
        let (inner, st) = (self.shape[1], self.strides);
        self.buffer[self.offset + b / inner * st[0] + b % inner * st[1] + i * st[2] + j * st[3]]
    }

    /// A key padding mask over `c.b = batch · heads` entries: keys from `lens[n]` on are −inf
    /// for every head and query row of batch `n` (`[batch, heads, L, S]`, strides `(S, 0, 0, 1)`).
    fn padding(c: &Case, lens: &[usize]) -> Mask {
        let batch = lens.len();
        let buffer = (0..batch * c.s)
            .map(|x| {
                if x % c.s < lens[x / c.s] {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Mask {
            shape: [batch, c.b / batch, c.l, c.s],
            strides: [c.s, 0, 0, 1],
            offset: 0,
            buffer,
        }
    }

    /// A `[B, 1, L, S]` mask of values in [-2, 2) with a −inf hole in about one pair of five,
    /// every key of the rows `dead` ((b, i) pairs) −inf, `offset` elements into its buffer and
    /// rows `pad` elements apart beyond S.
    fn full(c: &Case, seed: u64, dtype: DType, offset: usize, pad: usize, dead: &[(usize, usize)]) -> Mask {
        let row = c.s + pad;
        let mut buffer = values(offset + c.b * c.l * row, seed, dtype);
        buffer.iter_mut().for_each(|x| *x *= 2.0);
        for b in 0..c.b {
            for i in 0..c.l {
                for j in 0..c.s {
                    if (b * 7 + i * 3 + j * 2) % 5 == 0 || dead.contains(&(b, i)) {
                        buffer[offset + (b * c.l + i) * row + j] = f64::NEG_INFINITY;
                    }
                }
            }
        }
        Mask {
            shape: [c.b, 1, c.l, c.s],
            strides: [c.l * row, 0, row, 1],
            offset,
            buffer,
        }
    }

    /// One `[L, S]` mask of values in [-1, 1) shared by every batch entry (`[1, B, L, S]`,
    /// strides `(0, 0, 1, L)`: stored transposed), key 0 removed from every row past the first.
    fn shared_transposed(c: &Case, seed: u64, dtype: DType) -> Mask {
        let mut buffer = values(c.l * c.s, seed, dtype);
        // Element (i, 0) is at i.
        buffer[1..c.l].iter_mut().for_each(|x| *x = f64::NEG_INFINITY);
        Mask {
            shape: [1, c.b, c.l, c.s],
            strides: [0, 0, 1, c.l],
            offset: 0,
            buffer,
        }
    }
}

/// What the composed formula gives in f64: the output, each row's log-sum-exp, and the
/// gradients of q, k and v for the incoming gradient `g`.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    grads: [Vec<f64>; 3],
}

/// The reference of `c`, with `mask` added to the scaled scores when given. A row that sees
/// no key is NaN without a mask (0 / 0), 0 with one (every key masked); either way its
/// log-sum-exp is −inf and it adds to no gradient.
fn reference(c: &Case, [q, k, v, g]: [&[f64]; 4], mask: Option<&Mask>) -> Reference {
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
            let causal_end = if c.causal { c.s.min(i + 1) } else { c.s };
            let (keys, scores): (Vec<usize>, Vec<f64>) = (0..causal_end)
                .map(|j| (j, scale * dot(qr(i), kr(j)) + mask.map_or(0.0, |m| m.at(b, i, j))))
                .filter(|(_, s)| *s > f64::NEG_INFINITY)
                .unzip();
            if keys.is_empty() {
                if mask.is_some() {
                    out[(b * c.l + i) * ev..][..ev].iter_mut().for_each(|x| *x = 0.0);
                }
                continue;
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            let row_lse = max + total.ln();
            lse[b * c.l + i] = row_lse;
            let p: Vec<f64> = scores.iter().map(|s| (s - row_lse).exp()).collect();
            let o = &mut out[(b * c.l + i) * ev..][..ev];
            o.iter_mut().for_each(|x| *x = 0.0);
            for (&j, pj) in keys.iter().zip(&p) {
                for (x, vx) in o.iter_mut().zip(vr(j)) {
                    *x += pj * vx;
                }
            }
            let dp: Vec<f64> = keys.iter().map(|&j| dot(gr(i), vr(j))).collect();
            let d: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for (n, &j) in keys.iter().enumerate() {
                let ds = p[n] * (dp[n] - d);
                for x in 0..e {
                    grads[0][(b * c.l + i) * e + x] += scale * ds * kr(j)[x];
                    grads[1][(b * c.s + j) * e + x] += scale * ds * qr(i)[x];
                }
                for x in 0..ev {
                    grads[2][(b * c.s + j) * ev + x] += p[n] * gr(i)[x];
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

/// `buffers` and the mask's buffer when there is one.
fn with_mask<'a>(buffers: &[&'a DeviceBuffer], mask: Option<&'a DeviceBuffer>) -> Vec<&'a DeviceBuffer> {
    buffers.iter().copied().chain(mask).collect()
}

/// Run the forward (with its log-sum-exp) and the backward (with the saved values, then
/// without) for `c` and compare everything with the f64 reference.
fn check_case(b: &Arc<WgpuBackend>, dtype: DType, c: Case, seed: u64) {
    check(b, dtype, c, seed, None);
}

/// [`check_case`] with the additive `mask` (forward and backward); also checks that the rows
/// every key of which is masked are exactly 0 in the output and the query gradient.
fn check(b: &Arc<WgpuBackend>, dtype: DType, c: Case, seed: u64, mask: Option<&Mask>) {
    let what = format!(
        "{dtype} {c:?}{}",
        mask.map_or(String::new(), |m| format!(
            " mask {:?} strides {:?} offset {}",
            m.shape, m.strides, m.offset
        ))
    );
    let shapes = [[c.b, c.l, c.e], [c.b, c.s, c.e], [c.b, c.s, c.ev], [c.b, c.l, c.ev]];
    let host: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(n, s)| values(s.iter().product(), seed + n as u64, dtype))
        .collect();
    let dev: Vec<(DeviceBuffer, TensorArg)> = host.iter().zip(&shapes).map(|(v, s)| upload(b, v, s, dtype)).collect();
    let want = reference(&c, [&host[0], &host[1], &host[2], &host[3]], mask);
    let tol = tolerance(dtype);
    let mask_dev = mask.map(|m| {
        let (buf, _) = upload(b, &m.buffer, &[m.buffer.len()], dtype);
        let layout = Layout::from_parts(&m.shape, &m.strides, m.offset).expect("mask layout");
        let values = buf.arg(layout, dtype);
        (buf, AttentionMask { values })
    });
    let mask_arg = || mask_dev.as_ref().map(|(_, m)| m.clone());
    let mask_buf = mask_dev.as_ref().map(|(buf, _)| buf);
    // Rows that see no key (the reference's log-sum-exp is −inf).
    let dead: Vec<usize> = (0..c.b * c.l).filter(|&r| want.lse[r] == f64::NEG_INFINITY).collect();
    if mask.is_some() {
        for &r in &dead {
            assert!(
                want.out[r * c.ev..][..c.ev].iter().all(|&x| x == 0.0),
                "reference row {r}"
            );
        }
    }

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
        mask: mask_arg().map(Box::new),
        out: out.clone(),
        lse: Some(lse.clone()),
    }
    .run(&with_mask(
        &[&dev[0].0, &dev[1].0, &dev[2].0, &out_buf, &lse_buf],
        mask_buf,
    ))
    .unwrap_or_else(|e| panic!("attention {what}: {e}"));
    b.synchronize().expect("synchronize");
    let got_out = download(&out_buf, &out);
    let err = worst(&format!("out {what}"), &got_out, &want.out, 1e-3);
    assert!(err <= tol, "out {what}: worst error {err:.3e} of the largest magnitude");
    if mask.is_some() {
        for &r in &dead {
            let row = &got_out[r * c.ev..][..c.ev];
            assert!(
                row.iter().all(|&x| x == 0.0),
                "out {what}: fully masked row {r} is {row:?}"
            );
        }
    }
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
            mask: mask_arg(),
            grad_q: grads[0].1.clone(),
            grad_k: grads[1].1.clone(),
            grad_v: grads[2].1.clone(),
            saved: saved.then(|| AttentionSaved {
                out: out.clone(),
                lse: lse.clone(),
            }),
        }))
        .run(&with_mask(
            &[
                &dev[0].0,
                &dev[1].0,
                &dev[2].0,
                &dev[3].0,
                &out_buf,
                &lse_buf,
                &grads[0].0,
                &grads[1].0,
                &grads[2].0,
            ],
            mask_buf,
        ))
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
            if n == 0 && mask.is_some() {
                for &r in &dead {
                    let row = &got[r * c.e..][..c.e];
                    assert!(
                        row.iter().all(|&x| x == 0.0),
                        "grad_q {what} saved={saved}: fully masked row {r} is {row:?}"
                    );
                }
            }
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

/// The masked cases: each mask kind over a few shapes (L ≠ S, head dims 8, 64 and 100), causal
/// and not. `pick` keeps the ones to run.
fn masked_cases(dtype: DType, pick: impl Fn(usize) -> bool) -> Vec<(Case, Mask)> {
    let case = |b, l, s, e, ev, causal| Case { b, l, s, e, ev, causal };
    let mut cases = Vec::new();
    for causal in [false, true] {
        let n = cases.len() as u64;
        // Two batches of three heads; batch 1 pads all but 5 keys, and with 0 keys every row of
        // batch 0 is fully masked.
        let c = case(6, 19, 37, 8, 8, causal);
        cases.push((c, Mask::padding(&c, &[37, 5])));
        let c = case(4, 21, 30, 64, 64, causal);
        cases.push((c, Mask::padding(&c, &[0, 11])));
        // Rows (0, 0) and (1, 7), and a row past the first query tile, fully masked; causal,
        // row 0 sees only key 0, which the hole pattern masks in entry 0.
        let c = case(2, 40, 23, 64, 32, causal);
        cases.push((c, Mask::full(&c, 50 + n, dtype, 0, 0, &[(0, 0), (1, 7), (1, 35)])));
        let c = case(2, 17, 45, 100, 100, causal);
        cases.push((c, Mask::full(&c, 60 + n, dtype, 3, 2, &[(1, 16)])));
        let c = case(3, 33, 20, 64, 64, causal);
        cases.push((c, Mask::full(&c, 70 + n, dtype, 1, 0, &[])));
        let c = case(2, 26, 35, 8, 16, causal);
        cases.push((c, Mask::shared_transposed(&c, 80 + n, dtype)));
        // No keys (every row 0 with a mask) and no queries (zero key and value gradients).
        let c = case(2, 5, 0, 64, 64, causal);
        cases.push((c, Mask::padding(&c, &[0, 0])));
        let c = case(2, 0, 5, 64, 64, causal);
        cases.push((c, Mask::padding(&c, &[5, 2])));
    }
    cases
        .into_iter()
        .enumerate()
        .filter(|(n, _)| pick(*n))
        .map(|(_, c)| c)
        .collect()
}

#[test]
fn f32_with_an_additive_mask_matches_the_composed_formula() {
    let Some(b) = backend("f32_with_an_additive_mask_matches_the_composed_formula") else {
        return;
    };
    for (n, (c, mask)) in masked_cases(DType::F32, |_| true).into_iter().enumerate() {
        check(&b, DType::F32, c, 2000 + 10 * n as u64, Some(&mask));
    }
}

#[test]
fn half_types_with_an_additive_mask_match_the_composed_formula() {
    let Some(b) = backend("half_types_with_an_additive_mask_match_the_composed_formula") else {
        return;
    };
    for (k, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (n, (c, mask)) in masked_cases(dtype, |n| n % 2 == k).into_iter().enumerate() {
            check(&b, dtype, c, 3000 + 10 * n as u64, Some(&mask));
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
