//! Fused scaled dot-product attention (`Kernel::Attention`): cuDNN's fused attention where
//! `attention_cudnn` takes the call and chooses it, else the flash-attention forward of
//! `attention.cu`, one block per batch entry and tile of query rows. With an additive mask the
//! flash kernel's masked variant runs (`attention_masked_<dtype>_d<D>`, [`MaskArgs`]; f32: the
//! masked variant of [`super::attention_f32`]); cuDNN is not asked.
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

use super::attention_operands::{BatchStrides, dims};
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
    pub(super) q_inner: i64,
    pub(super) k_inner: i64,
    pub(super) v_inner: i64,
    pub(super) o_batch: i64,
    pub(super) o_inner: i64,
    pub(super) o_row: i64,
    pub(super) batch: u32,
    pub(super) l: u32,
    pub(super) s: u32,
    pub(super) m_blocks: u32,
    pub(super) scale_log2: f32,
    pub(super) causal: i32,
    pub(super) heads: u32,
    pub(super) pad: u32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for AttentionArgs {}

impl AttentionArgs {
    /// The arguments of a forward kernel over `[q, k, v]` (validated operands, one or two batch
    /// dimensions, `B` entries merged, `L` query rows, `S` keys) in `m_blocks` query tiles.
    pub(super) fn new(
        [q, k, v]: [&TensorArg; 3],
        out: &TensorArg,
        lse: Option<&TensorArg>,
        [batch, l, s, m_blocks]: [usize; 4],
        scale_log2: f32,
        causal: bool,
    ) -> AttentionArgs {
        let [qs, ks, vs, os] = [q, k, v, out].map(BatchStrides::of);
        AttentionArgs {
            q: device_ptr(q),
            k: device_ptr(k),
            v: device_ptr(v),
            out: device_ptr(out),
            lse: lse.map_or(0, device_ptr),
            q_batch: qs.outer,
            q_row: qs.row,
            k_batch: ks.outer,
            k_row: ks.row,
            v_batch: vs.outer,
            v_row: vs.row,
            q_inner: qs.inner,
            k_inner: ks.inner,
            v_inner: vs.inner,
            o_batch: os.outer,
            o_inner: os.inner,
            o_row: os.row,
            batch: batch as u32,
            l: l as u32,
            s: s as u32,
            m_blocks: m_blocks as u32,
            scale_log2,
            causal: i32::from(causal),
            heads: super::attention_operands::heads(q),
            pad: 0,
        }
    }
}

/// `struct AttnMask` of attention_mma.cuh: the additive mask `[outer, inner, L, S]` of the masked
/// kernels (forward and backward), strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MaskArgs {
    values: u64,
    outer: i64,
    inner: i64,
    row: i64,
    col: i64,
    inner_count: u32,
    pad: u32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for MaskArgs {}

impl MaskArgs {
    /// The kernels' view of `mask` (validated by `Kernel::validate`: `[outer, inner, L, S]` in
    /// q's dtype, `outer · inner` = the batch).
    pub(super) fn of(mask: &AttentionMask) -> MaskArgs {
        let st = mask.values.layout.strides();
        MaskArgs {
            values: device_ptr(&mask.values),
            outer: st[0] as i64,
            inner: st[1] as i64,
            row: st[2] as i64,
            col: st[3] as i64,
            inner_count: mask.values.layout.shape()[1].max(1) as u32,
            pad: 0,
        }
    }
}

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
    let kernel = |out: &TensorArg, lse: Option<&TensorArg>| flash(backend, qkv, scale, causal, mask, out, lse);
    let scoring = crate::attention_cudnn::Scoring { scale, causal, mask };
    if crate::attention_cudnn::forward(backend, qkv, scoring, out, lse, &kernel)? {
        return Ok(());
    }
    flash(backend, qkv, scale, causal, mask, out, lse)
}

/// Queue the flash kernel of `attention.cu` (see [`attention`]).
fn flash(
    backend: &CudaBackend,
    [q, k, v]: [&TensorArg; 3],
    scale: f64,
    causal: bool,
    mask: Option<&AttentionMask>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    let refuse = |reason: String| Error::unsupported("attention", q.dtype, backend.device, reason);
    let dtype = match q.dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => return super::attention_f32::attention_f32(backend, [q, k, v], scale, causal, mask, out, lse),
        other => {
            return Err(refuse(format!(
                "the fused attention kernels take bf16, f16 and f32, not {other}; the frontend composes it"
            )));
        }
    };
    let ((batch, l, e), (_, s, _), (_, _, ev)) = (dims(q), dims(k), dims(v));
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
    let args = AttentionArgs::new(
        [q, k, v],
        out,
        lse,
        [batch, l, s, m_blocks as usize],
        scale_log2,
        causal,
    );
    let name = if mask.is_some() {
        "attention_masked"
    } else {
        "attention"
    };
    let kernel = backend
        .modules
        .kernel(KernelName::new(SourceFile::Attention, [name, dtype, head, ""]))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (block_threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut touched = vec![q.buffer, k.buffer, v.buffer, out.buffer];
    touched.extend(lse.map(|lse| lse.buffer));
    match mask {
        None => launch_kernel!(backend, kernel, cfg, touched, &args),
        Some(mask) => {
            touched.push(mask.values.buffer);
            let m = MaskArgs::of(mask);
            launch_kernel!(backend, kernel, cfg, touched, &args, &m)
        }
    }
}

#[cfg(test)]
mod tests {
    use cartage_core::Op;

    use super::{AttentionArgs, DTYPES, MaskArgs};
    use crate::capabilities_for;
    use crate::modules::{KernelName, SourceFile};

    /// The 16-bit kernels the launch names are built into the committed PTX with the parameters
    /// it passes: the argument struct, and the mask after it for the masked variants.
    #[test]
    fn kernels_take_the_argument_structs() {
        let (args, mask) = (std::mem::size_of::<AttentionArgs>(), std::mem::size_of::<MaskArgs>());
        for dtype in ["bf16", "f16"] {
            for head in ["d64", "d128"] {
                for (name, params) in [("attention", vec![args]), ("attention_masked", vec![args, mask])] {
                    let kernel = KernelName::new(SourceFile::Attention, [name, dtype, head, ""]);
                    let found = super::super::ptx_param_bytes(kernel.file, &kernel.symbol());
                    assert_eq!(found, params, "{}", kernel.symbol());
                }
            }
        }
    }

    /// The fused kernels are listed for bf16, f16 (mma.sync) and f32 from Ampere on (cp.async),
    /// and for nothing else; other dtypes go through the composed path.
    #[test]
    fn attention_is_listed_where_the_kernel_runs() {
        let hopper = capabilities_for((9, 0));
        let turing = capabilities_for((7, 5));
        for dtype in cartage_core::DType::ALL {
            let fused = DTYPES.contains(&dtype);
            assert_eq!(hopper.supports(Op::Attention, dtype), fused, "{dtype} on sm_90");
            assert_eq!(
                hopper.supports(Op::AttentionMask, dtype),
                fused,
                "{dtype} masked on sm_90"
            );
            assert!(!turing.supports(Op::Attention, dtype), "{dtype} on sm_75");
            assert!(!turing.supports(Op::AttentionMask, dtype), "{dtype} masked on sm_75");
        }
    }
}
