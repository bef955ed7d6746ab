//! Scaled dot-product attention over one packed projection `[B, T, 3·H·E]` (queries, keys and
//! values side by side, as a transformer's single q/k/v linear layer gives them), recorded as
//! one autograd node whose only input is that tensor. Its backward builds the packed gradient
//! once (see `formulas::nn::attention_packed`), where selecting q, k and v as separate views
//! would give each part's backward a zero-filled gradient of the whole projection to add up.

use cartage_core::{Error, Result};

use super::attention::{composed, fused};
use crate::autograd::{formulas, graph};
use crate::tensor::{Tensor, caller, check};

const NAME: &str = "scaled_dot_product_attention_packed";

impl Tensor {
    /// Self-attention on a packed projection: `qkv` `[B, T, 3·H·E]` holds the queries (features
    /// `0..H·E`), keys (`H·E..2·H·E`) and values (`2·H·E..3·H·E`), each head-major (head `h` takes
    /// the `E` features from `h·E`), as GPT-2's fused `c_attn` lays them out. Gives
    /// `[B, T, H·E]`: every head's [`Tensor::scaled_dot_product_attention`] (`mask`, `causal`
    /// and `scale` as there: the mask broadcasts to the scores `[B, H, T, T]`, e.g. a key
    /// padding mask `[B, 1, 1, T]`), the heads side by side again.
    ///
    /// The same result and gradients as the three views through
    /// [`Tensor::scaled_dot_product_attention`], with the fused kernels where the backend has
    /// them; recorded as one node whose backward writes the q, k and v gradients into one fresh
    /// gradient of `qkv`, where three views would each build one of `qkv`'s size from zeros and
    /// add them. Where the backend has no fused kernel the forward is composed and the backward
    /// recomputes the probabilities from the saved `qkv` (no `[B, H, T, T]` matrix is kept
    /// between the passes). A float mask that needs its own gradient goes through the three
    /// recorded views instead, so that its gradient is recorded. Under [`crate::autocast`] an f32
    /// `qkv` (and an f32 mask) is cast to the autocast dtype on entry.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// // One sequence of two positions, one head of size 2: q, k and v side by side.
    /// let qkv = Tensor::from_slice(
    ///     &[1.0f32, 0.0, /* k */ 1.0, 0.0, /* v */ 1.0, 2.0,
    ///       0.0, 1.0, /* k */ 0.0, 1.0, /* v */ 3.0, 4.0],
    ///     &[1, 2, 6],
    ///     &cpu,
    /// )?;
    /// let out = Tensor::scaled_dot_product_attention_packed(&qkv, 1, None, true, None)?;
    /// assert_eq!(out.shape(), &[1, 2, 2]);
    /// // The first position sees only itself.
    /// assert_eq!(&out.to_vec::<f32>()?[..2], &[1.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn scaled_dot_product_attention_packed(
        qkv: &Tensor,
        heads: usize,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let site = caller();
        if crate::autocast::autocast_dtype().is_some_and(|d| qkv.dtype != d) {
            let lowered = crate::autocast::lower(qkv)?;
            if lowered.dtype != qkv.dtype {
                let lowered_mask = match mask {
                    Some(m) if m.dtype.is_float() => Some(crate::autocast::lower(m)?),
                    _ => None,
                };
                let mask = lowered_mask.as_ref().or(mask);
                return Tensor::scaled_dot_product_attention_packed(&lowered, heads, mask, causal, scale);
            }
        }
        check::float(NAME, qkv.dtype)?;
        let [b, t, head] = qkv.packed_attention_sizes(heads)?;
        let scale = scale.unwrap_or(1.0 / (head as f64).sqrt());
        if !scale.is_finite() {
            return Err(Error::invalid(NAME, format!("the scale must be finite, got {scale}")));
        }
        let mask = match mask {
            Some(m) => Some(qkv.attention_additive_mask(m, &[b, heads, t, t], site)?),
            None => None,
        };
        if mask.as_ref().is_some_and(|m| graph::tracking(&[m])) {
            // A mask that needs its own gradient: attention on the recorded views, whose
            // composed path records the mask's add.
            let split = qkv.reshape(&[b, t, 3, heads, head])?;
            let part = |i: isize| split.select(2, i)?.transpose(1, 2);
            let (q, k, v) = (part(0)?, part(1)?, part(2)?);
            let out = Tensor::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), causal, Some(scale))?;
            return out.transpose(1, 2)?.reshape(&[b, t, heads * head]);
        }
        let tracked = graph::tracking(&[qkv]);
        let (out, lse) = {
            // The views and kernels below are this one node's forward: none of them is recorded.
            let _plain = tracked.then(crate::autograd::no_grad);
            let [q, k, v] = qkv.packed_attention_parts(heads)?;
            let (heads_out, lse) = match fused([&q, &k, &v], mask.as_ref(), causal, scale, tracked, site)? {
                Some(done) => done,
                // The backward recomputes the probabilities from the saved qkv.
                None => (composed(&q, &k, &v, mask.as_ref(), causal, scale, site)?, None),
            };
            // [B, H, T, E] → [B, T, H·E]
            let out = heads_out
                .transpose(1, 2)?
                .reshape_internal(&[b, t, heads * head], site)?;
            (out, lse)
        };
        // The backward reads the output through the node's own result (the heads side by side,
        // the tensor the next layer keeps too), not the kernel's [B, H, T, E] output: one copy
        // of it lives between the passes, not two.
        Ok(graph::record(out, NAME, &[qkv], |out| {
            let saved = lse.map(|lse| (out.clone(), lse));
            formulas::nn::attention_packed(qkv, heads, mask, causal, scale, saved)
        }))
    }

    /// The queries, keys and values of a packed `[B, T, 3·H·E]` projection as `[B, H, T, E]`
    /// views (through a contiguous copy where `self`'s strides allow no view), after the checks
    /// of [`Tensor::scaled_dot_product_attention_packed`] on the shape and `heads`.
    #[track_caller]
    pub(crate) fn packed_attention_parts(&self, heads: usize) -> Result<[Tensor; 3]> {
        let [b, t, head] = self.packed_attention_sizes(heads)?;
        let split = self.reshape_internal(&[b, t, 3, heads, head], caller())?;
        let part = |i: isize| split.select(2, i)?.transpose(1, 2);
        Ok([part(0)?, part(1)?, part(2)?])
    }

    /// `[B, T, E]` of a packed `[B, T, 3·H·E]` projection with `heads` heads, after the checks of
    /// [`Tensor::scaled_dot_product_attention_packed`] on the shape and `heads`.
    fn packed_attention_sizes(&self, heads: usize) -> Result<[usize; 3]> {
        let &[b, t, width] = self.shape() else {
            return Err(Error::invalid(
                NAME,
                format!(
                    "qkv must be [batch, positions, 3 · heads · head size], got shape {:?} (rank {}); \
                     add a batch dimension of 1 with `unsqueeze(0)` to a single sequence",
                    self.shape(),
                    self.rank()
                ),
            ));
        };
        if heads == 0 {
            return Err(Error::invalid(NAME, "heads must be at least 1"));
        }
        if width == 0 || !width.is_multiple_of(3 * heads) {
            return Err(Error::invalid(
                NAME,
                format!(
                    "the last dimension {width} must be a positive multiple of 3 · heads = {}: the \
                     queries, keys and values side by side, each heads × head size features; check \
                     `heads` and the width of the projection that made qkv",
                    3 * heads
                ),
            ));
        }
        Ok([b, t, width / (3 * heads)])
    }
}
