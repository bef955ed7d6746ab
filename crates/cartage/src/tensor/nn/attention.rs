//! Scaled dot-product attention: the backend's fused `Kernel::Attention` where it lists one for
//! the dtype (no explicit mask, q, k and v with the same batch dimensions, shapes and strides the
//! kernel accepts), else composed from matmul, scale, masks built or applied on the device,
//! softmax and matmul (the `[.., L, S]` scores are materialised). Both give the same result.
//! When a backward will follow, the fused kernel also leaves each query row's log-sum-exp for
//! the fused backward (see `formulas::nn::attention`).

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
    /// built on the device); it combines with `mask`. A row with every key masked gives NaN, as
    /// PyTorch's reference implementation does. Float dtypes.
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
        if mask.is_none() {
            let tracked = graph::tracking(&[q, k, v]);
            let out = {
                let _plain = tracked.then(crate::autograd::no_grad);
                fused(q, k, v, causal, scale, tracked, site)?
            };
            if let Some((out, lse)) = out {
                return Ok(graph::record(out, NAME, &[q, k, v], |out| {
                    let saved = lse.map(|lse| (out.clone(), lse));
                    formulas::nn::attention(q, k, v, causal, scale, saved)
                }));
            }
        }
        composed(q, k, v, mask, causal, scale, site)
    }
}

/// The attention composed from other ops: `q·scale` times `kᵀ`, the mask applied, the causal
/// mask (in the softmax kernel where the backend has it, else a `where` over two i32 aranges),
/// softmax, times `v`. Recorded op by op where autograd is on. `q`, `k` and `v` have passed the
/// checks of [`Tensor::scaled_dot_product_attention`].
pub(super) fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    site: Site,
) -> Result<Tensor> {
    let mismatch = |lhs: &Tensor, rhs: &Tensor, reason: String| Error::ShapeMismatch {
        op: NAME,
        lhs: lhs.shape().to_vec(),
        rhs: rhs.shape().to_vec(),
        reason,
    };
    let (l, s) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    // The scale on q ([.., L, E]) rather than on the scores ([.., L, S]): a smaller pass.
    let mut scores = q.mul_scalar(scale)?.matmul(&k.transpose(-2, -1)?)?;
    if let Some(mask) = mask {
        check::same_device(NAME, q, mask)?;
        let fits = broadcast_shapes(mask.shape(), scores.shape()).is_ok_and(|b| b.as_slice() == scores.shape());
        if !fits {
            return Err(mismatch(
                mask,
                &scores,
                "the mask must broadcast to the attention scores [.., L, S] (the right-hand shape)".into(),
            ));
        }
        scores = if mask.dtype == DType::Bool {
            let neg_inf = scores.scalar_like(Scalar::Float(f64::NEG_INFINITY), site)?;
            Tensor::where_cond(mask, &scores, &neg_inf)?
        } else {
            check::same_dtype(NAME, q, mask)?;
            scores.add(mask)?
        };
    }
    if causal {
        if let Some(p) = scores.causal_softmax()? {
            return p.matmul(v);
        }
        let rows = Tensor::arange(0.0, l as f64, 1.0, DType::I32, &q.device)?;
        let rows = rows.with_layout(rows.layout.unsqueeze(1)?);
        let cols = Tensor::arange(0.0, s as f64, 1.0, DType::I32, &q.device)?;
        let keep = cols.le(&rows)?;
        let neg_inf = scores.scalar_like(Scalar::Float(f64::NEG_INFINITY), site)?;
        scores = Tensor::where_cond(&keep, &scores, &neg_inf)?;
    }
    scores.softmax(-1)?.matmul(v)
}

/// `Kernel::Attention` into a fresh contiguous output, with the batch dimensions merged into one
/// (a view where the strides allow it, else a contiguous copy). `None` sends the caller to the
/// composed path: the backend does not list the op for the dtype, the batch dimensions of q, k
/// and v differ (broadcasting), or the backend refuses these sizes or strides with `Unsupported`.
/// With `want_lse` (a backward will follow) the kernel also writes each query row's log-sum-exp
/// ([B, L] f32, B the merged batch), returned beside the output for the fused backward; a
/// backend that cannot write it runs the plain kernel and the second value is `None`.
pub(super) fn fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
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
    let batch: usize = batch_dims.iter().product();
    let merged = |t: &Tensor| -> Result<Tensor> {
        let shape = [batch, t.shape()[rank - 2], t.shape()[rank - 1]];
        if let Some(layout) = t.layout.reshape(&shape)? {
            return Ok(t.with_layout(layout));
        }
        let dense = t.contiguous_at(site)?;
        let layout = dense.layout.reshape(&shape)?.ok_or_else(|| {
            Error::invalid(
                NAME,
                format!("a contiguous {:?} tensor did not reshape to {shape:?}", t.shape()),
            )
        })?;
        Ok(dense.with_layout(layout))
    };
    let (q3, k3, v3) = (merged(q)?, merged(k)?, merged(v)?);
    let (l, ev) = (q.shape()[rank - 2], v.shape()[rank - 1]);
    let out = q.alloc_like(&[batch, l, ev], q.dtype, site)?;
    let kernel = |lse: Option<&Tensor>| Kernel::Attention {
        q: q3.as_arg(),
        k: k3.as_arg(),
        v: v3.as_arg(),
        scale,
        causal,
        mask: None,
        out: out.as_arg(),
        lse: lse.map(Tensor::as_arg),
    };
    let mut lse = None;
    if want_lse && out.numel() > 0 {
        let rows = q.alloc_like(&[batch, l], DType::F32, site)?;
        let buffers = [&out, &rows, &q3, &k3, &v3].map(|t| t.storage().device_buffer());
        crate::graph::hold([&out, &rows, &q3, &k3, &v3]);
        match kernel(Some(&rows)).run(&buffers) {
            Ok(()) => lse = Some(rows),
            Err(Error::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if lse.is_none() {
        match out.launch(&kernel(None), &[&q3, &k3, &v3], out.numel()) {
            Ok(()) => {}
            Err(Error::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let mut shape = batch_dims.to_vec();
    shape.extend([l, ev]);
    Ok(Some((out.with_layout(Layout::contiguous(&shape)?), lse)))
}
