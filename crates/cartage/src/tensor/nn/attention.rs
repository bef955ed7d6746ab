//! Scaled dot-product attention: the backend's fused `Kernel::Attention` where it lists one for
//! the dtype (q, k and v with the same batch dimensions, shapes and strides the kernel accepts,
//! and any mask as an additive `[outer, inner, L, S]` view the backend applies), else composed
//! from matmul, scale, masks built or applied on the device, softmax and matmul (the `[.., L, S]`
//! scores are materialised). Both give the same result; with a mask, a row that sees no key
//! gives 0 on both.
//! When a backward will follow, the fused kernel also leaves each query row's log-sum-exp for
//! the fused backward (see `formulas::nn::attention`).

use cartage_core::kernel::AttentionMask;
use cartage_core::{DType, Error, Kernel, Layout, Op, Result, Scalar, Site, broadcast_shapes};

use crate::autograd::{formulas, graph};
use crate::tensor::{Tensor, caller, check};

const NAME: &str = "scaled_dot_product_attention";

impl Tensor {
    /// `softmax(q·kᵀ · scale + mask) · v` for `q` `[.., L, E]`, `k` `[.., S, E]` and `v`
    /// `[.., S, Ev]`, giving `[.., L, Ev]`; batch dimensions broadcast as in
    /// [`Tensor::matmul`]. `scale` defaults to `1 / sqrt(E)`.
    ///
    /// `mask` broadcasts to the scores `[.., L, S]`: a bool mask keeps the positions where it is
    /// true (the others become `-inf`); a float mask (the query's dtype) is added. With
    /// `causal`, query `i` attends to keys `j ≤ i` only (the upper triangle becomes `-inf`,
    /// built on the device); it combines with `mask`. A row with every key masked gives 0, and
    /// passes no gradient, as PyTorch's does (from 2.5 on). Float dtypes.
    ///
    /// The fused kernel takes the mask where the backend applies one (wgpu), with the mask's
    /// broadcast dimensions read in place (stride 0, nothing copied); a float mask that needs
    /// its own gradient, or a backend without it, takes the composed path.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let q = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0], &[2, 2], &cpu)?;
    /// let k = q.clone();
    /// let v = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &cpu)?;
    /// let out = Tensor::scaled_dot_product_attention(&q, &k, &v, None, true, None)?;
    /// // The first query sees only the first key.
    /// assert_eq!(&out.to_vec::<f32>()?[..2], &[1.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let site = caller();
        if crate::autocast::autocast_dtype().is_some_and(|d| [q, k, v].iter().any(|t| t.dtype != d)) {
            let (lq, lk, lv) = (
                crate::autocast::lower(q)?,
                crate::autocast::lower(k)?,
                crate::autocast::lower(v)?,
            );
            if lq.dtype != q.dtype || lk.dtype != k.dtype || lv.dtype != v.dtype {
                // A float mask is lowered with them, as PyTorch's autocast casts every float
                // operand of attention.
                let lowered_mask = match mask {
                    Some(m) if m.dtype.is_float() => Some(crate::autocast::lower(m)?),
                    _ => None,
                };
                let mask = lowered_mask.as_ref().or(mask);
                return Tensor::scaled_dot_product_attention(&lq, &lk, &lv, mask, causal, scale);
            }
        }
        check::same_device_and_dtype(NAME, q, k)?;
        check::same_device_and_dtype(NAME, k, v)?;
        check::float(NAME, q.dtype)?;
        let mismatch = |lhs: &Tensor, rhs: &Tensor, reason: String| Error::ShapeMismatch {
            op: NAME,
            lhs: lhs.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
            reason,
        };
        if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
            return Err(mismatch(
                q,
                k,
                format!(
                    "query, key and value need at least two dimensions [.., L, E], [.., S, E], [.., S, Ev]; \
                     the value is {:?}",
                    v.shape()
                ),
            ));
        }
        let e = q.shape()[q.rank() - 1];
        let (s, ek) = (k.shape()[k.rank() - 2], k.shape()[k.rank() - 1]);
        let sv = v.shape()[v.rank() - 2];
        if e != ek {
            return Err(mismatch(
                q,
                k,
                format!("the query has embedding size {e} but the key has {ek}"),
            ));
        }
        if s != sv {
            return Err(mismatch(
                k,
                v,
                format!("the key has {s} positions but the value has {sv}"),
            ));
        }
        let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
        if !scale.is_finite() {
            return Err(Error::invalid(NAME, format!("the scale must be finite, got {scale}")));
        }
        let mask = match mask {
            Some(m) => Some(q.attention_additive_mask(m, &score_shape(q, k)?, site)?),
            None => None,
        };
        // A mask that needs its own gradient takes the composed path, which records its add.
        if !mask.as_ref().is_some_and(|m| graph::tracking(&[m])) {
            let tracked = graph::tracking(&[q, k, v]);
            let out = {
                let _plain = tracked.then(crate::autograd::no_grad);
                fused([q, k, v], mask.as_ref(), causal, scale, tracked, site)?
            };
            if let Some((out, lse)) = out {
                return Ok(graph::record(out, NAME, &[q, k, v], |out| {
                    let saved = lse.map(|lse| (out.clone(), lse));
                    formulas::nn::attention(q, k, v, mask, causal, scale, saved)
                }));
            }
        }
        composed(q, k, v, mask.as_ref(), causal, scale, site)
    }
}

/// The shape of the scores `[.., L, S]` of `q` `[.., L, E]` against `k` `[.., S, E]`: their
/// batch dimensions broadcast.
fn score_shape(q: &Tensor, k: &Tensor) -> Result<Vec<usize>> {
    let (qr, kr) = (q.rank(), k.rank());
    let mut shape = broadcast_shapes(&q.shape()[..qr - 2], &k.shape()[..kr - 2])?.to_vec();
    shape.extend([q.shape()[qr - 2], k.shape()[kr - 2]]);
    Ok(shape)
}

/// The attention composed from other ops: [`attention_probabilities`] (the additive `mask` from
/// [`Tensor::attention_additive_mask`]) times `v`. Recorded op by op where autograd is on. `q`, `k` and `v` have passed the checks of
/// [`Tensor::scaled_dot_product_attention`].
pub(super) fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    site: Site,
) -> Result<Tensor> {
    attention_probabilities(q, k, mask, causal, scale, site)?.matmul(v)
}

/// The attention probabilities `[.., L, S]` of the composed path (recorded op by op where
/// autograd is on), which the composed backward recomputes too: `q·scale` times `kᵀ`, the
/// additive `mask` added, the causal mask (in the softmax kernel where the backend has it and
/// there is no other mask, else a `where` over two i32 aranges), softmax (with a mask, rows
/// that see no key give 0: [`Tensor::masked_softmax`]).
pub(crate) fn attention_probabilities(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    site: Site,
) -> Result<Tensor> {
    let (l, s) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    // The scale on q ([.., L, E]) rather than on the scores ([.., L, S]): a smaller pass.
    let mut scores = q.mul_scalar(scale)?.matmul(&k.transpose(-2, -1)?)?;
    if let Some(mask) = mask {
        scores = scores.add(mask)?;
    }
    if causal {
        if mask.is_none()
            && let Some(p) = scores.causal_softmax()?
        {
            return Ok(p);
        }
        let rows = Tensor::arange(0.0, l as f64, 1.0, DType::I32, &q.device)?;
        let rows = rows.with_layout(rows.layout.unsqueeze(1)?);
        let cols = Tensor::arange(0.0, s as f64, 1.0, DType::I32, &q.device)?;
        let keep = cols.le(&rows)?;
        let neg_inf = scores.scalar_like(Scalar::Float(f64::NEG_INFINITY), site)?;
        scores = Tensor::where_cond(&keep, &scores, &neg_inf)?;
    }
    if mask.is_some() {
        scores.masked_softmax(site)
    } else {
        scores.softmax(-1)
    }
}

/// `Kernel::Attention` into a fresh output. The batch dimensions go to the kernel merged into
/// one where that is a view (the output contiguous); otherwise rank-4 operands with a dense last
/// dimension first go as they are (`[B1, B2, n, d]`, two batch strides: the heads of a packed
/// projection read in place, see [`attention_operands`]; the output the heads of a fresh
/// `[B1, L, B2, Ev]` block), and where the backend refuses those, or the strides allow neither,
/// each is merged through a contiguous copy (the output contiguous). `None` sends the caller to
/// the composed path: the backend does not list the op for the dtype, the batch dimensions of
/// q, k and v differ (broadcasting), or the backend refuses these sizes or strides with
/// `Unsupported`.
/// With `want_lse` (a backward will follow) the kernel also writes each query row's log-sum-exp
/// ([B, L] f32, B the merged batch), returned beside the output for the fused backward; a
/// backend that cannot write it runs the plain kernel and the second value is `None`.
pub(super) fn fused(
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    want_lse: bool,
    site: Site,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !q.backend().capabilities().supports(Op::Attention, q.dtype) {
        return Ok(None);
    }
    let rank = q.rank();
    let batch_dims = &q.shape()[..rank - 2];
    let same_batch = |t: &Tensor| t.rank() == rank && &t.shape()[..rank - 2] == batch_dims;
    if !same_batch(k) || !same_batch(v) {
        return Ok(None);
    }
    if k.shape()[rank - 2] == 0 {
        // No key at all: the kernels' rows would be 0 / 0; the composed path gives 0, as PyTorch.
        return Ok(None);
    }
    let (l, s) = (q.shape()[rank - 2], k.shape()[rank - 2]);
    let mask4 = match mask {
        Some(_) if !q.backend().capabilities().supports(Op::AttentionMask, q.dtype) => return Ok(None),
        Some(m) => match m.attention_mask_view(batch_dims, l, s)? {
            Some(view) => Some(view),
            None => return Ok(None),
        },
        None => None,
    };
    let run = |ops: &[Tensor]| {
        fused_run(
            [&ops[0], &ops[1], &ops[2]],
            mask4.as_ref(),
            causal,
            scale,
            want_lse,
            site,
        )
    };
    let (first, copies_left) = attention_operands(&[q, k, v])?;
    let mut done = match first {
        Some(ops) => run(&ops)?,
        None => None,
    };
    if done.is_none() && copies_left {
        done = run(&merged_copies(&[q, k, v], site)?)?;
    }
    let Some((out, lse)) = done else {
        return Ok(None);
    };
    if out.rank() == rank {
        // Two batch dimensions: the output is already [B1, B2, L, Ev] (a view of [B1, L, B2, Ev]).
        return Ok(Some((out, lse)));
    }
    let mut shape = batch_dims.to_vec();
    shape.extend([l, out.shape()[out.rank() - 1]]);
    Ok(Some((out.with_layout(Layout::contiguous(&shape)?), lse)))
}

/// The first way to hand `ts` (each `[batch.., n, d]`, one set of batch dimensions) to a fused
/// attention kernel, and whether merged copies remain to be tried after it: every operand
/// merged into a `[B, n, d]` view where all strides allow it (nothing copied, nothing left);
/// else, for rank 4 with dense last dimensions, the operands as they are (two batch strides,
/// which a backend may refuse; [`merged_copies`] left); else nothing first, only the copies.
pub(crate) fn attention_operands(ts: &[&Tensor]) -> Result<(Option<Vec<Tensor>>, bool)> {
    let rank = ts[0].rank();
    let batch: usize = ts[0].shape()[..rank - 2].iter().product();
    let mut views = Vec::with_capacity(ts.len());
    for t in ts {
        match t.layout.reshape(&[batch, t.shape()[rank - 2], t.shape()[rank - 1]])? {
            Some(layout) => views.push(t.with_layout(layout)),
            None => break,
        }
    }
    if views.len() == ts.len() {
        return Ok((Some(views), false));
    }
    let in_place = rank == 4 && ts.iter().all(|t| t.layout.strides().last() == Some(&1));
    Ok((in_place.then(|| ts.iter().map(|t| (*t).clone()).collect()), true))
}

/// `ts` (each `[batch.., n, d]`) merged into `[B, n, d]` through contiguous copies.
pub(crate) fn merged_copies(ts: &[&Tensor], site: Site) -> Result<Vec<Tensor>> {
    ts.iter()
        .map(|t| {
            let rank = t.rank();
            let shape = [
                t.shape()[..rank - 2].iter().product(),
                t.shape()[rank - 2],
                t.shape()[rank - 1],
            ];
            let dense = t.contiguous_at(site)?;
            let layout = dense.layout.reshape(&shape)?.ok_or_else(|| {
                Error::invalid(
                    NAME,
                    format!("a contiguous {:?} tensor did not reshape to {shape:?}", t.shape()),
                )
            })?;
            Ok(dense.with_layout(layout))
        })
        .collect()
}

/// One attempt of [`fused`] with the operands `[q, k, v]` as the kernel takes them (one or two
/// batch dimensions): `None` where the backend refuses with `Unsupported`.
fn fused_run(
    [q, k, v]: [&Tensor; 3],
    mask4: Option<&Tensor>,
    causal: bool,
    scale: f64,
    want_lse: bool,
    site: Site,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    let rank = q.rank();
    let batch: usize = q.shape()[..rank - 2].iter().product();
    let l = q.shape()[rank - 2];
    let ev = v.shape()[rank - 1];
    let out = if rank == 4 {
        // Two batch dimensions [B1, B2, L, Ev]: written as the heads of a [B1, L, B2, Ev] block,
        // so that `out.transpose(1, 2)` (the heads side by side again) is contiguous.
        let [b1, b2] = [q.shape()[0], q.shape()[1]];
        let block = q.alloc_like(&[b1, l, b2, ev], q.dtype, site)?;
        let layout = block.layout.permute(&[0, 2, 1, 3])?;
        block.with_layout(layout)
    } else {
        q.alloc_like(&[batch, l, ev], q.dtype, site)?
    };
    let kernel = |lse: Option<&Tensor>| Kernel::Attention {
        q: q.as_arg(),
        k: k.as_arg(),
        v: v.as_arg(),
        scale,
        causal,
        mask: mask4.map(|m| Box::new(AttentionMask { values: m.as_arg() })),
        out: out.as_arg(),
        lse: lse.map(Tensor::as_arg),
    };
    let mut lse = None;
    if want_lse && out.numel() > 0 {
        let rows = q.alloc_like(&[batch, l], DType::F32, site)?;
        let operands: Vec<&Tensor> = [&out, &rows, q, k, v].into_iter().chain(mask4).collect();
        let buffers: Vec<_> = operands.iter().map(|t| t.storage().device_buffer()).collect();
        crate::graph::hold(operands.iter().copied());
        match kernel(Some(&rows)).run(&buffers) {
            Ok(()) => lse = Some(rows),
            Err(Error::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if lse.is_none() {
        let inputs: Vec<&Tensor> = [q, k, v].into_iter().chain(mask4).collect();
        match out.launch(&kernel(None), &inputs, out.numel()) {
            Ok(()) => {}
            Err(Error::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some((out, lse)))
}
