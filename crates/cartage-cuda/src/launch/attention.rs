//! Fused scaled dot-product attention (`Kernel::Attention`): cuDNN's fused attention where
//! `attention_cudnn` takes the call and chooses it, else the flash-attention forward of
//! `attention.cu`, one block per batch entry and tile of query rows. With an additive mask only
//! f32 is fused (the masked variant of [`super::attention_f32`]).
//!
//! The kernel takes bf16 and f16 with head dims 64 and 128 (`Ev` = `E`); f32 goes to its own
//! kernel on the CUDA cores ([`super::attention_f32`]). q, k and v are read in
//! place with their batch and row strides, provided the last dimension is dense and every row
//! starts on 16 bytes (the tiles are copied with 16-byte `cp.async`). Anything else is refused
//! with [`Error::Unsupported`], so the frontend composes the result instead. With an `lse`
//! operand the kernel also writes each query row's log-sum-exp, for the tiled backward.

use cartage_core::kernel::AttentionMask;
use cartage_core::{DType, Error, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{device_ptr, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// Query rows per block and threads per block of the kernel for head dim `head` (the `BM` and
/// `BM / (16 MT) × 32` of its `ATTENTION(..)` line in attention.cu).
const fn config(head: usize) -> (u64, u32) {
    match head {
        64 => (128, 128),
        _ => (64, 128),
    }
}
/// The element types the kernels (this one and the f32 one) are built for.
pub(crate) const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// `struct AttnArgs` of attention_mma.cuh, taken by attention.cu and attention_f32.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AttentionArgs {
    pub(super) q: u64,
    pub(super) k: u64,
    pub(super) v: u64,
    pub(super) out: u64,
    pub(super) lse: u64,
    pub(super) q_batch: i64,
    pub(super) q_row: i64,
    pub(super) k_batch: i64,
    pub(super) k_row: i64,
    pub(super) v_batch: i64,
    pub(super) v_row: i64,
    pub(super) batch: u32,
    pub(super) l: u32,
    pub(super) s: u32,
    pub(super) m_blocks: u32,
    pub(super) scale_log2: f32,
    pub(super) causal: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for AttentionArgs {}

/// Queue `out = softmax(scale · q kᵀ) v` for `[q, k, v]` (validated operands), and each row's
/// log-sum-exp into `lse` when given: through cuDNN's fused attention where `attention_cudnn`
/// takes the call and chooses it, else through the flash kernel.
pub(super) fn attention(
    backend: &CudaBackend,
    qkv: [&TensorArg; 3],
    scale: f64,
    causal: bool,
    mask: Option<&AttentionMask>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    if let Some(mask) = mask {
        // An additive mask: the f32 kernel's masked variant; bf16 and f16 are composed.
        return match qkv[0].dtype {
            DType::F32 => super::attention_f32::attention_f32(backend, qkv, scale, causal, Some(mask), out, lse),
            other => Err(Error::unsupported(
                "attention",
                other,
                backend.device,
                "the fused attention takes an additive mask in f32 only; the frontend composes masked \
                 bf16 and f16 attention",
            )),
        };
    }
    let kernel = |out: &TensorArg, lse: Option<&TensorArg>| flash(backend, qkv, scale, causal, out, lse);
    if crate::attention_cudnn::forward(backend, qkv, scale, causal, out, lse, &kernel)? {
        return Ok(());
    }
    flash(backend, qkv, scale, causal, out, lse)
}

/// Queue the flash kernel of `attention.cu` (see [`attention`]).
fn flash(
    backend: &CudaBackend,
    [q, k, v]: [&TensorArg; 3],
    scale: f64,
    causal: bool,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    let refuse = |reason: String| Error::unsupported("attention", q.dtype, backend.device, reason);
    let dtype = match q.dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => return super::attention_f32::attention_f32(backend, [q, k, v], scale, causal, None, out, lse),
        other => {
            return Err(refuse(format!(
                "the fused attention kernels take bf16, f16 and f32, not {other}; the frontend composes it"
            )));
        }
    };
    let (qs, ks, vs) = (q.layout.shape(), k.layout.shape(), v.layout.shape());
    let (batch, l, s, e, ev) = (qs[0], qs[1], ks[1], qs[2], vs[2]);
    let head = match (e, ev) {
        (64, 64) => "d64",
        (128, 128) => "d128",
        _ => {
            return Err(refuse(format!(
                "the fused attention kernel takes head dims 64 and 128 (equal for keys and values), \
                 got E = {e}, Ev = {ev}"
            )));
        }
    };
    if batch == 0 || l == 0 {
        return Ok(());
    }
    super::attention_operands::forward_operands("fused attention kernel", [q, k, v], out, refuse)?;
    let (block_rows, block_threads) = config(e);
    let m_blocks = (l as u64).div_ceil(block_rows);
    let blocks = m_blocks * batch as u64;
    let fits = |n: usize| u32::try_from(n).is_ok_and(|n| n < i32::MAX as u32);
    if !fits(l) || !fits(s) || !fits(batch) || blocks > i32::MAX as u64 {
        return Err(refuse(format!(
            "the fused attention kernel takes fewer than 2^31 rows and blocks; got B = {batch}, L = {l}, S = {s}"
        )));
    }
    let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
    if !scale_log2.is_finite() {
        return Err(refuse(format!(
            "the fused attention kernel takes a scale within f32, got {scale}"
        )));
    }
    let stride = |arg: &TensorArg, i: usize| arg.layout.strides()[i] as i64;
    let args = AttentionArgs {
        q: device_ptr(q),
        k: device_ptr(k),
        v: device_ptr(v),
        out: device_ptr(out),
        lse: lse.map_or(0, device_ptr),
        q_batch: stride(q, 0),
        q_row: stride(q, 1),
        k_batch: stride(k, 0),
        k_row: stride(k, 1),
        v_batch: stride(v, 0),
        v_row: stride(v, 1),
        batch: batch as u32,
        l: l as u32,
        s: s as u32,
        m_blocks: m_blocks as u32,
        scale_log2,
        causal: i32::from(causal),
    };
    let kernel = backend
        .modules
        .kernel(KernelName::new(SourceFile::Attention, ["attention", dtype, head, ""]))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (block_threads, 1, 1),
        shared_mem_bytes: 0,
    };
    match lse {
        Some(lse) => launch_kernel!(
            backend,
            kernel,
            cfg,
            [q.buffer, k.buffer, v.buffer, out.buffer, lse.buffer],
            &args
        ),
        None => launch_kernel!(backend, kernel, cfg, [q.buffer, k.buffer, v.buffer, out.buffer], &args),
    }
}

#[cfg(test)]
mod tests {
    use cartage_core::Op;

    use super::DTYPES;
    use crate::capabilities_for;

    /// The fused kernels are listed for bf16, f16 (mma.sync) and f32 from Ampere on (cp.async),
    /// and for nothing else; other dtypes go through the composed path.
    #[test]
    fn attention_is_listed_where_the_kernel_runs() {
        let hopper = capabilities_for((9, 0));
        let turing = capabilities_for((7, 5));
        for dtype in cartage_core::DType::ALL {
            let fused = DTYPES.contains(&dtype);
            assert_eq!(hopper.supports(Op::Attention, dtype), fused, "{dtype} on sm_90");
            assert!(!turing.supports(Op::Attention, dtype), "{dtype} on sm_75");
        }
    }
}
