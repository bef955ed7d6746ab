//! The backward of attention with an additive mask (`Kernel::AttentionBackward` with `mask`):
//! only the tiled f32 kernel's masked variant applies a mask ([`super::attention_f32_backward`]).
//! It needs the forward's output and log-sum-exp; where the call brings none (the frontend always
//! saves them, a direct caller may not), the masked f32 forward writes them first into a block of
//! the caching allocator, as the kernel contract lets a backend that ignores saved values do.
//! Every other masked backward is refused with [`Error::Unsupported`], so that the frontend
//! composes the gradients.

use cartage_core::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
use cartage_core::{DType, Error, Layout, Result, TensorArg};

use crate::backend::CudaBackend;

/// Queue the gradients of masked attention (`mask` is `a.mask`).
pub(super) fn attention_masked_backward(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    mask: &AttentionMask,
) -> Result<()> {
    let refuse = || {
        Error::unsupported(
            "attention_backward",
            a.q.dtype,
            backend.device,
            "the fused attention backward takes an additive mask in f32 only, with head dims the f32 \
             kernels take (32 to 128, multiples of 16); the frontend composes it",
        )
    };
    if a.q.dtype != DType::F32 {
        return Err(refuse());
    }
    if a.saved.is_some() {
        let saved = super::attention_f32_backward::eligible(a).ok_or_else(refuse)?;
        return super::attention_f32_backward::attention_f32_backward(backend, a, saved);
    }
    // No saved forward: the masked forward writes the output and lse into one f32 block (the
    // output first: [B, L, Ev] of a head dim that is a multiple of 16 keeps the lse on 16 bytes).
    let (qs, vs) = (a.q.layout.shape(), a.v.layout.shape());
    let (batch, l, ev) = (qs[0], qs[1], vs[2]);
    let out_len = batch * l * ev;
    let block = backend.allocator.alloc(((out_len + batch * l) * 4).max(16))?;
    let outcome = (|| {
        let out = TensorArg {
            buffer: block.slice(),
            layout: Layout::contiguous(&[batch, l, ev])?,
            dtype: DType::F32,
        };
        let lse = TensorArg {
            buffer: block.slice(),
            layout: Layout::from_parts(&[batch, l], &[l, 1], out_len)?,
            dtype: DType::F32,
        };
        super::attention_f32::attention_f32(
            backend,
            [&a.q, &a.k, &a.v],
            a.scale,
            a.causal,
            Some(mask),
            &out,
            Some(&lse),
        )?;
        let with_saved = AttentionBackwardArgs {
            saved: Some(AttentionSaved { out, lse }),
            ..a.clone()
        };
        let saved = super::attention_f32_backward::eligible(&with_saved).ok_or_else(refuse)?;
        super::attention_f32_backward::attention_f32_backward(backend, &with_saved, saved)
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(block);
    outcome
}
