//! The backward of attention with an additive mask (`Kernel::AttentionBackward` with `mask`):
//! the masked variants of the tiled kernels apply it, [`super::attention_flash_backward`] for bf16
//! and f16, [`super::attention_f32_backward`] for f32. Both need the forward's output and
//! log-sum-exp; where the call brings none (the frontend always saves them, a direct caller may
//! not), the masked forward writes them first into a block of the caching allocator, as the
//! kernel contract lets a backend that ignores saved values do. Every other masked backward is
//! refused with [`Error::Unsupported`], so that the frontend composes the gradients.

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
            "the fused attention backward takes an additive mask in bf16 and f16 with head dims 64 and \
             128, and in f32 with head dims 32 to 128 (multiples of 16), equal for keys and values, \
             with dense rows on 16 bytes; the frontend composes it",
        )
    };
    if a.saved.is_some() {
        if let Some(saved) = super::attention_flash_backward::eligible(a) {
            return super::attention_flash_backward::attention_flash_backward(backend, a, saved);
        }
        let saved = super::attention_f32_backward::eligible(a).ok_or_else(refuse)?;
        return super::attention_f32_backward::attention_f32_backward(backend, a, saved);
    }
    if !super::attention::DTYPES.contains(&a.q.dtype) {
        return Err(refuse());
    }
    // No saved forward: the masked forward writes the output (q's dtype) and the f32 lse into one
    // block, the output first, rounded up to 16 bytes so that the lse starts on 16 bytes.
    let ((batch, l, _), (_, _, ev)) = (
        super::attention_operands::dims(&a.q),
        super::attention_operands::dims(&a.v),
    );
    // The output keeps q's batch dimensions (one or two), as the forward's contract asks.
    let qs = a.q.layout.shape();
    let out_shape: Vec<usize> = qs[..qs.len() - 1].iter().copied().chain([ev]).collect();
    let out_bytes = (batch * l * ev * a.q.dtype.size_in_bytes()).next_multiple_of(16);
    let block = backend.allocator.alloc((out_bytes + batch * l * 4).max(16))?;
    let outcome = (|| {
        let out = TensorArg {
            buffer: block.slice(),
            layout: Layout::contiguous(&out_shape)?,
            dtype: a.q.dtype,
        };
        let lse = TensorArg {
            buffer: block.slice(),
            layout: Layout::from_parts(&[batch, l], &[l, 1], out_bytes / 4)?,
            dtype: DType::F32,
        };
        super::attention::attention(
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
        super::attention_backward::attention_backward(backend, &with_saved)
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(block);
    outcome
}
