//! Derivatives of the fused primitives: layer norm, RMS norm and the per-row cross-entropy.
//! Half-precision inputs are differentiated in f32 and the gradients cast back, as the forward
//! kernels compute in f32.

use cartage_core::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
use cartage_core::{DType, Error, Kernel, NormKind, Op, Result};

use super::when;
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The dtype the backward math runs in: f32 for half types, else the input's.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

/// The backward of `layer_norm`/`rms_norm` over the last dimension. The node's inputs are the
/// input, then the weight and the bias when given. Where the backend has the fused kernel, one
/// `Kernel::NormBackward` gives the input gradient and, for the parameters that need one, the
/// weight gradient `Σ_batch g·x̂` and the bias gradient `Σ_batch g`. Elsewhere they are composed:
/// `x̂` from one forward norm kernel, the products summed over the batch, accumulated in f32
/// for half inputs.
pub(crate) fn norm(
    kind: NormKind,
    x: &Tensor,
    weight: Option<&Tensor>,
    has_bias: bool,
    eps: f64,
) -> (BackwardFn, Saved) {
    let x = x.detach();
    let weight = weight.map(Tensor::detach);
    let saved: Vec<&Tensor> = std::iter::once(&x).chain(weight.as_ref()).collect();
    saving(keep(&saved), move |g, need| {
        let weight_slot = weight.is_some().then_some(1);
        let bias_slot = has_bias.then_some(1 + usize::from(weight.is_some()));
        let want_weight = weight_slot.is_some_and(|i| need[i]);
        let want_bias = bias_slot.is_some_and(|i| need[i]);
        if (need[0] || want_weight || want_bias)
            && let Some(fused) = x.norm_backward_fused(kind, weight.as_ref(), g, eps, want_weight, want_bias)?
        {
            let mut grads = vec![need[0].then_some(fused.input)];
            if weight_slot.is_some() {
                grads.push(fused.weight);
            }
            if bias_slot.is_some() {
                grads.push(fused.bias);
            }
            return Ok(grads);
        }
        let dtype = x.dtype();
        let wide = compute_dtype(dtype);
        let gx = when(need[0], || norm_input_grad(kind, &x, weight.as_ref(), g, eps))?;
        let batch_dims: Vec<isize> = (0..x.rank() as isize - 1).collect();
        let over_batch = |t: Tensor| -> Result<Tensor> {
            let summed = if batch_dims.is_empty() {
                t
            } else {
                t.sum(&batch_dims, false)?
            };
            summed.to_dtype(dtype)
        };
        let mut grads = vec![gx];
        if weight.is_some() {
            grads.push(when(want_weight, || {
                let xw = x.to_dtype(wide)?;
                let xhat = match kind {
                    NormKind::Layer => xw.layer_norm(None, None, eps)?,
                    NormKind::Rms => xw.rms_norm(None, eps)?,
                };
                over_batch(g.to_dtype(wide)?.mul(&xhat)?)
            })?);
        }
        if has_bias {
            grads.push(when(want_bias, || over_batch(g.to_dtype(wide)?))?);
        }
        Ok(grads)
    })
}

/// The input gradient of a norm, composed from other ops (backends without the fused kernel):
/// `r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))` for layer norm, without the `mean(ĝ)` term for RMS norm.
fn norm_input_grad(kind: NormKind, x: &Tensor, weight: Option<&Tensor>, g: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let wide = compute_dtype(dtype);
    let (xw, gw) = (x.to_dtype(wide)?, g.to_dtype(wide)?);
    let last = [-1isize];
    let (xhat, rstd) = match kind {
        NormKind::Layer => {
            let centred = xw.sub(&xw.mean(&last, true)?)?;
            let rstd = centred.square()?.mean(&last, true)?.add_scalar(eps)?.rsqrt()?;
            (centred.mul(&rstd)?, rstd)
        }
        NormKind::Rms => {
            let rstd = xw.square()?.mean(&last, true)?.add_scalar(eps)?.rsqrt()?;
            (xw.mul(&rstd)?, rstd)
        }
    };
    let gxhat = match weight {
        Some(w) => gw.mul(&w.to_dtype(wide)?)?,
        None => gw,
    };
    let proj = gxhat.mul(&xhat)?.mean(&last, true)?;
    let mut inner = gxhat.sub(&xhat.mul(&proj)?)?;
    if kind == NormKind::Layer {
        inner = inner.sub(&gxhat.mean(&last, true)?)?;
    }
    inner.mul(&rstd)?.to_dtype(dtype)
}

/// The backward of the per-row cross-entropy of `logits` `[N, C]` against class indices
/// `target` `[N]`: `g · (softmax(logits) - (1 - ε)·onehot(target) - ε / C)`, zero on ignored rows;
/// one fused kernel where the backend has it, else composed.
pub(crate) fn cross_entropy(
    logits: &Tensor,
    target: &Tensor,
    ignore_index: i64,
    label_smoothing: f64,
) -> (BackwardFn, Saved) {
    let (logits, target) = (logits.detach(), target.detach());
    saving(keep(&[&logits, &target]), move |g, _| {
        if let Some(fused) = logits.cross_entropy_backward_fused(&target, g, ignore_index, label_smoothing)? {
            return Ok(vec![Some(fused)]);
        }
        let dtype = logits.dtype();
        let wide = compute_dtype(dtype);
        let [n, c] = [logits.shape()[0], logits.shape()[1]];
        let probs = logits.to_dtype(wide)?.softmax(1)?;
        let ignore = Tensor::full(&[], ignore_index, target.dtype(), &target.device())?;
        let kept = target.ne(&ignore)?;
        let zero_index = Tensor::zeros(&[], target.dtype(), &target.device())?;
        let safe = Tensor::where_cond(&kept, &target, &zero_index)?.reshape(&[n, 1])?;
        let hit = Tensor::full(&[n, 1], -(1.0 - label_smoothing), wide, &logits.device())?;
        let mut grad = probs.scatter_add(1, &safe, &hit)?;
        if label_smoothing > 0.0 && c > 0 {
            grad = grad.sub_scalar(label_smoothing / c as f64)?;
        }
        let scale = g.to_dtype(wide)?.mul(&kept.to_dtype(wide)?)?.reshape(&[n, 1])?;
        Ok(vec![Some(grad.mul(&scale)?.to_dtype(dtype)?)])
    })
}

/// The backward of the reduced `cross_entropy` whose forward wrote `grad`, the logits'
/// gradient for a unit output gradient: that gradient as it is when `g` is the engine's unit
/// seed (the node is released once it has run, so nothing else holds the gradient), else
/// scaled by `g`.
pub(crate) fn cross_entropy_grad_ahead(grad: Tensor) -> (BackwardFn, Saved) {
    saving(keep(&[&grad]), move |g, _| {
        if crate::autograd::engine::is_unit_seed(g) {
            return Ok(vec![Some(grad.clone())]);
        }
        Ok(vec![Some(grad.mul(&g.to_dtype(grad.dtype())?)?)])
    })
}

/// The backward of the fused `scaled_dot_product_attention(q, k, v, None, causal)`, with the
/// probabilities recomputed from the saved inputs:
/// `dV = Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ - rowsum(dO·Vᵀ ∘ P))`, `dQ = s·dS·K`, `dK = s·dSᵀ·Q`.
/// `saved` is the forward's output and per-row log-sum-exp ([B, L] f32, B the merged batch)
/// where the fused forward wrote one; both are kept (with q, k and v) under the version-counter
/// check. One fused `Kernel::AttentionBackward` where the backend lists it for the dtype, and
/// either `saved` is there (the backend may then run a tiled kernel that reads them, faster than
/// the composed formula at every size) or the composed formula's score matrix would be large
/// (see [`FUSED_BACKWARD_MIN_SCORE_BYTES`]); else composed from matmuls and a softmax over the
/// `[.., L, S]` scores.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<Tensor>,
    causal: bool,
    scale: f64,
    saved: Option<(Tensor, Tensor)>,
) -> (BackwardFn, Saved) {
    let (q, k, v) = (q.detach(), k.detach(), v.detach());
    let mask = mask.map(|m| m.detach());
    let saved = saved.map(|(out, lse)| (out.detach(), lse.detach()));
    let mut kept = vec![&q, &k, &v];
    kept.extend(&mask);
    kept.extend(saved.iter().flat_map(|(out, lse)| [out, lse]));
    saving(keep(&kept), move |g, need| {
        let mask = mask.as_ref();
        Ok(attention_grads([&q, &k, &v], g, mask, causal, scale, saved.as_ref(), need)?.to_vec())
    })
}

/// The backward of [`Tensor::scaled_dot_product_attention_packed`]: the node's one input is
/// `qkv` `[B, T, 3·H·E]`, saved with the node's own `[B, T, H·E]` output (the storage the next
/// layer keeps as well, viewed as `[B, H, T, E]` here; the fused backward then reads a copy made
/// for the pass) and log-sum-exp where the fused forward wrote one, and the additive mask if
/// any. The gradients of q, k and v come from [`attention`]'s formula on
/// views of `qkv` (fused where the backend has it), and go into one fresh `[B, T, 3, H, E]`
/// tensor, one strided copy each (`Tensor::stack`): no zero-filled gradient of the whole `qkv`
/// per part, no sum of three.
pub(crate) fn attention_packed(
    qkv: &Tensor,
    heads: usize,
    mask: Option<Tensor>,
    causal: bool,
    scale: f64,
    saved: Option<(Tensor, Tensor)>,
) -> (BackwardFn, Saved) {
    let qkv = qkv.detach();
    let mask = mask.map(|m| m.detach());
    let saved = saved.map(|(out, lse)| (out.detach(), lse.detach()));
    let mut kept = vec![&qkv];
    kept.extend(&mask);
    kept.extend(saved.iter().flat_map(|(out, lse)| [out, lse]));
    saving(keep(&kept), move |g, need| {
        if !need[0] {
            return Ok(vec![None]);
        }
        let [q, k, v] = qkv.packed_attention_parts(heads)?;
        let (b, t) = (qkv.shape()[0], qkv.shape()[1]);
        let head = q.shape()[3];
        let g = g.reshape(&[b, t, heads, head])?.transpose(1, 2)?;
        // The saved output is the node's [B, T, H·E] result: its [B, H, T, E] view.
        let saved = match &saved {
            Some((out, lse)) => Some((out.reshape(&[b, t, heads, head])?.transpose(1, 2)?, lse.clone())),
            None => None,
        };
        let grads = attention_grads(
            [&q, &k, &v],
            &g,
            mask.as_ref(),
            causal,
            scale,
            saved.as_ref(),
            &[true; 3],
        )?;
        let parts = grads
            .into_iter()
            .map(|part| {
                let part = part.ok_or_else(|| {
                    Error::invalid(
                        "scaled_dot_product_attention_packed",
                        "a part's gradient was not computed",
                    )
                })?;
                part.transpose(1, 2)
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(vec![Some(Tensor::stack(&refs, 2)?.reshape(qkv.shape())?)])
    })
}

/// The gradients of q, k and v (those `need` asks for) of the attention whose output gradient
/// is `g`: one fused kernel where [`attention_fused`] runs, else composed from matmuls and a
/// softmax over the `[.., L, S]` scores.
fn attention_grads(
    [q, k, v]: [&Tensor; 3],
    g: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    saved: Option<&(Tensor, Tensor)>,
    need: &[bool],
) -> Result<[Option<Tensor>; 3]> {
    let fused = attention_fused([q, k, v], g, mask, causal, scale, saved)?;
    if let Some([gq, gk, gv]) = fused {
        let keep = |t: Tensor, i: usize| need[i].then_some(t);
        return Ok([keep(gq, 0), keep(gk, 1), keep(gv, 2)]);
    }
    let p = crate::tensor::nn::attention_probabilities(q, k, mask, causal, scale, crate::tensor::caller())?;
    let gv = when(need[2], || p.transpose(-2, -1)?.matmul(g))?;
    let (gq, gk) = if need[0] || need[1] {
        let dp = g.matmul(&v.transpose(-2, -1)?)?;
        // The softmax's input gradient, `p·(dp − Σ dp·p)`: one fused kernel where the
        // backend has it. The scale goes on the two [.., L|S, E] products, not on ds.
        let last = p.rank() - 1;
        let ds = match p.softmax_backward_fused(&dp, last, false)? {
            Some(ds) => ds,
            None => p.mul(&dp.sub(&dp.mul(&p)?.sum(&[-1], true)?)?)?,
        };
        (
            when(need[0], || ds.matmul(k)?.mul_scalar(scale))?,
            when(need[1], || ds.transpose(-2, -1)?.matmul(q)?.mul_scalar(scale))?,
        )
    } else {
        (None, None)
    };
    Ok([gq, gk, gv])
}

/// The size of one f32 `[.., L, S]` score matrix from which the attention backward runs fused.
///
/// The fused kernels recompute the probabilities row by row and hold no L × S matrix, but they
/// run on CUDA cores, not tensor cores: on an H200, one GPT layer's attention backward (64 × 6
/// heads, L = S = 256, head size 64, bf16) took 7.3 ms fused, more than half of the whole
/// training step's GPU time, while the composed formula's four products run on tensor cores
/// and its scores, probabilities and their gradient (100 MiB each there) come and go within
/// the backward. Below this size the composed formula is the faster and its memory passing;
/// above it the matrices would crowd out the rest of training, and the fused kernels keep it
/// running.
pub(crate) const FUSED_BACKWARD_MIN_SCORE_BYTES: usize = 1 << 30;

/// The three attention gradients from one `Kernel::AttentionBackward`, with the batch dimensions
/// of q, k, v and `g` (the same for all four, as the fused forward requires) merged into one;
/// `None` where the backend does not list the kernel for the dtype or refuses these sizes or
/// strides with `Unsupported`, or where nothing was saved and the scores are small.
fn attention_fused(
    [q, k, v]: [&Tensor; 3],
    g: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    saved: Option<&(Tensor, Tensor)>,
) -> Result<Option<[Tensor; 3]>> {
    let dtype = q.dtype();
    if !q.backend().capabilities().supports(Op::AttentionBackward, dtype) {
        return Ok(None);
    }
    let rank = q.rank();
    let batch: usize = q.shape()[..rank - 2].iter().product();
    let (l, s) = (q.shape()[rank - 2], k.shape()[rank - 2]);
    let score_bytes = batch.saturating_mul(l).saturating_mul(s).saturating_mul(4);
    if saved.is_none() && score_bytes < FUSED_BACKWARD_MIN_SCORE_BYTES {
        return Ok(None);
    }
    let mask4 = match mask {
        Some(_) if !q.backend().capabilities().supports(Op::AttentionMask, dtype) => return Ok(None),
        Some(m) => match m.attention_mask_view(&q.shape()[..rank - 2], l, s)? {
            Some(view) => Some(view),
            None => return Ok(None),
        },
        None => None,
    };
    let mut g = g.to_dtype(dtype)?;
    if saved.is_some() && g.layout().strides().last() != Some(&1) {
        // The tiled kernel reads rows with a dense last dimension.
        g = g.contiguous()?;
    }
    // q, k, v, dO and the saved output as the kernel takes them: merged views, else (rank 4) as
    // they are, two batch strides, and merged copies where the backend refuses those.
    let mut operands: Vec<&Tensor> = vec![q, k, v, &g];
    operands.extend(saved.map(|(out, _)| out));
    let lse = saved.map(|(_, lse)| lse);
    let run = |ops: &[Tensor]| attention_fused_run(ops, lse, mask4.as_ref(), causal, scale);
    let (first, copies_left) = crate::tensor::nn::attention_operands(&operands)?;
    let mut grads = match first {
        Some(ops) => run(&ops)?,
        None => None,
    };
    if grads.is_none() && copies_left {
        grads = run(&crate::tensor::nn::merged_copies(&operands, crate::tensor::caller())?)?;
    }
    let Some(grads) = grads else {
        return Ok(None);
    };
    let [gq, gk, gv] = grads;
    Ok(Some([
        gq.reshape(q.shape())?,
        gk.reshape(k.shape())?,
        gv.reshape(v.shape())?,
    ]))
}

/// One attempt of [`attention_fused`]: `ops` = q, k, v, dO and (with `lse`) the saved output,
/// all with one batch dimension or all with two; the gradients in their shapes, contiguous, or
/// `None` where the backend refuses with `Unsupported`.
fn attention_fused_run(
    ops: &[Tensor],
    lse: Option<&Tensor>,
    mask4: Option<&Tensor>,
    causal: bool,
    scale: f64,
) -> Result<Option<[Tensor; 3]>> {
    let (dtype, device) = (ops[0].dtype(), ops[0].device());
    let grads = [
        Tensor::empty(ops[0].shape(), dtype, &device)?,
        Tensor::empty(ops[1].shape(), dtype, &device)?,
        Tensor::empty(ops[2].shape(), dtype, &device)?,
    ];
    let saved = ops.get(4).zip(lse);
    let kernel = Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q: ops[0].as_arg(),
        k: ops[1].as_arg(),
        v: ops[2].as_arg(),
        grad: ops[3].as_arg(),
        scale,
        causal,
        mask: mask4.map(|m| AttentionMask { values: m.as_arg() }),
        grad_q: grads[0].as_arg(),
        grad_k: grads[1].as_arg(),
        grad_v: grads[2].as_arg(),
        saved: saved.map(|(out, lse)| AttentionSaved {
            out: out.as_arg(),
            lse: lse.as_arg(),
        }),
    }));
    let operands: Vec<&Tensor> = ops.iter().chain(lse).chain(mask4).chain(&grads).collect();
    let buffers: Vec<_> = operands.iter().map(|t| t.storage().device_buffer()).collect();
    crate::graph::hold(operands.iter().copied());
    match kernel.run(&buffers) {
        Ok(()) => Ok(Some(grads)),
        Err(Error::Unsupported { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The backward of `out = layer_norm(x, γ, β) · Wᵀ + b` ([`Tensor::layer_norm_linear`]). The
/// node's inputs are `x`, then `γ` and `β` when given, then `W` and `b` when given; it saves
/// `x`, `γ`, `β` and `W`. `gW = gᵀ·y` with `y` the norm recomputed (in `W`'s dtype, as the
/// forward's linear layer read it), `gb` the rows' sum of `g`, and the norm's gradients from
/// `g·W` as [`norm`]'s backward gives them.
pub(crate) fn layer_norm_linear(
    x: &Tensor,
    norm_weight: Option<&Tensor>,
    norm_bias: Option<&Tensor>,
    eps: f64,
    w: &Tensor,
    has_bias: bool,
) -> (BackwardFn, Saved) {
    let (x, w) = (x.detach(), w.detach());
    let (gamma, beta) = (norm_weight.map(Tensor::detach), norm_bias.map(Tensor::detach));
    let saved: Vec<&Tensor> = [Some(&x), gamma.as_ref(), beta.as_ref(), Some(&w)]
        .into_iter()
        .flatten()
        .collect();
    saving(keep(&saved), move |g, need| {
        let norm_slots = 1 + usize::from(gamma.is_some()) + usize::from(beta.is_some());
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let rows = x.numel() / k.max(1);
        let g_rows = || g.reshape(&[rows, n]);
        let gw = when(need[norm_slots], || {
            let y = x.layer_norm(gamma.as_ref(), beta.as_ref(), eps)?;
            let y = if y.dtype() == w.dtype() {
                y
            } else {
                y.to_dtype(w.dtype())?
            };
            g_rows()?.t()?.matmul(&y.reshape(&[rows, k])?)
        })?;
        let gb = when(has_bias && need[norm_slots + 1], || {
            // In g's dtype even where a live autocast scope would sum in f32.
            g_rows()?.sum(&[0], false)?.to_dtype(g.dtype())
        })?;
        let norm_need = &need[..norm_slots];
        let mut grads = if norm_need.iter().any(|&n| n) {
            let gy = g.matmul(&w)?;
            let gy = if gy.dtype() == x.dtype() {
                gy
            } else {
                gy.to_dtype(x.dtype())?
            };
            let (norm_backward, _) = norm(NormKind::Layer, &x, gamma.as_ref(), beta.is_some(), eps);
            norm_backward(&gy, norm_need)?
        } else {
            vec![None; norm_slots]
        };
        grads.push(gw);
        if has_bias {
            grads.push(gb);
        }
        Ok(grads)
    })
}
