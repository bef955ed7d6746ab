//! The f32 flash-attention forward (`Kernel::Attention` for f32): `attention_f32.cu`, one block
//! per batch entry and tile of 64 query rows, exact f32 FMAs on the CUDA cores (no TF32).
//!
//! The kernel takes head dims that are multiples of 16 from 32 to 128 ([`HEAD_DIMS`], `Ev` =
//! `E`); q, k and v are read in place with their batch and row strides, provided the last
//! dimension is dense and every row starts on 16 bytes (the tiles are copied with 16-byte
//! `cp.async`). Anything else is refused with [`Error::Unsupported`], so the frontend composes the
//! result instead. With an `lse` operand the kernel also writes each query row's log-sum-exp, for
//! the tiled f32 backward ([`super::attention_f32_backward`]). With an additive mask the
//! `attention_f32_masked_d<D>` variant adds it to the scaled scores ([`MaskArgs`](super::attention::MaskArgs)); a row whose
//! keys the mask removes gives 0, as the kernel contract says.

use cartage_core::kernel::AttentionMask;
use cartage_core::{Error, Result, TensorArg};
use cudarc::driver::LaunchConfig;
use cudarc::driver::sys::CUfunction_attribute;

use super::attention::{AttentionArgs, MaskArgs};
use super::attention_operands::dims;
use super::launch_kernel;
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The head dims (E = Ev) the f32 kernels are built for: the `attention_f32_d<D>` and
/// `attention_f32_backward_d<D>` lines of the .cu files.
pub(crate) const HEAD_DIMS: [usize; 7] = [32, 48, 64, 80, 96, 112, 128];

/// Query rows per block and threads per block (`AF_BM`, `AF_NT` of attention_f32.cu).
const BLOCK_ROWS: u64 = 64;
const BLOCK_THREADS: u32 = 128;

/// The `d<D>` part of the kernel names, for a head dim in [`HEAD_DIMS`].
pub(crate) fn head_part(head: usize) -> Option<&'static str> {
    Some(match head {
        32 => "d32",
        48 => "d48",
        64 => "d64",
        80 => "d80",
        96 => "d96",
        112 => "d112",
        128 => "d128",
        _ => return None,
    })
}

/// The kernel's dynamic shared memory in bytes (`AfSmem` of attention_f32.cu): the Q, K and V
/// tiles of 64 rows of `head + 4` floats, and the 64 × 68 probability tile.
const fn smem_bytes(head: usize) -> usize {
    (3 * 64 * (head + 4) + 64 * 68) * 4
}

/// Queue `out = softmax(scale · q kᵀ + mask) v` in f32 for `[q, k, v]` (validated f32 operands),
/// and each row's log-sum-exp into `lse` when given.
pub(super) fn attention_f32(
    backend: &CudaBackend,
    [q, k, v]: [&TensorArg; 3],
    scale: f64,
    causal: bool,
    mask: Option<&AttentionMask>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    let refuse = |reason: String| Error::unsupported("attention", q.dtype, backend.device, reason);
    let ((batch, l, e), (_, s, _), (_, _, ev)) = (dims(q), dims(k), dims(v));
    let head = match head_part(e) {
        Some(part) if e == ev => part,
        _ => {
            return Err(refuse(format!(
                "the fused f32 attention kernel takes head dims {HEAD_DIMS:?} (equal for keys and \
                 values), got E = {e}, Ev = {ev}"
            )));
        }
    };
    if batch == 0 || l == 0 {
        return Ok(());
    }
    super::attention_operands::forward_operands("fused f32 attention kernel", [q, k, v], out, refuse)?;
    let m_blocks = (l as u64).div_ceil(BLOCK_ROWS);
    let blocks = m_blocks * batch as u64;
    let fits = |n: usize| u32::try_from(n).is_ok_and(|n| n < i32::MAX as u32);
    if !fits(l) || !fits(s) || !fits(batch) || blocks > i32::MAX as u64 {
        return Err(refuse(format!(
            "the fused f32 attention kernel takes fewer than 2^31 rows and blocks; got B = {batch}, L = {l}, S = {s}"
        )));
    }
    let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
    if !scale_log2.is_finite() {
        return Err(refuse(format!(
            "the fused f32 attention kernel takes a scale within f32, got {scale}"
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
        "attention_f32_masked"
    } else {
        "attention_f32"
    };
    let kernel = backend
        .modules
        .kernel(KernelName::new(SourceFile::AttentionF32, [name, head, "", ""]))?;
    let smem = smem_bytes(e);
    kernel
        .function
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(crate::driver::error(
            backend.device,
            "set the shared memory of a kernel",
        ))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    match (lse, mask) {
        (Some(lse), None) => launch_kernel!(
            backend,
            kernel,
            cfg,
            [q.buffer, k.buffer, v.buffer, out.buffer, lse.buffer],
            &args
        ),
        (None, None) => launch_kernel!(backend, kernel, cfg, [q.buffer, k.buffer, v.buffer, out.buffer], &args),
        (Some(lse), Some(mask)) => {
            let m = MaskArgs::of(mask);
            launch_kernel!(
                backend,
                kernel,
                cfg,
                [q.buffer, k.buffer, v.buffer, mask.values.buffer, out.buffer, lse.buffer],
                &args,
                &m
            )
        }
        (None, Some(mask)) => {
            let m = MaskArgs::of(mask);
            launch_kernel!(
                backend,
                kernel,
                cfg,
                [q.buffer, k.buffer, v.buffer, mask.values.buffer, out.buffer],
                &args,
                &m
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AttentionArgs, HEAD_DIMS, MaskArgs, head_part, smem_bytes};
    use crate::modules::{KernelName, SourceFile};

    /// Every head dim the launch names is built into the committed PTX, taking the argument
    /// struct of the 16-bit kernel, and no other head dim is named.
    #[test]
    fn kernels_take_the_argument_struct() {
        let size = std::mem::size_of::<AttentionArgs>();
        for head in HEAD_DIMS {
            let part = head_part(head).expect("a listed head dim");
            let name = KernelName::new(SourceFile::AttentionF32, ["attention_f32", part, "", ""]);
            let params = super::super::ptx_param_bytes(name.file, &name.symbol());
            assert_eq!(params, [size], "{}", name.symbol());
            let masked = KernelName::new(SourceFile::AttentionF32, ["attention_f32_masked", part, "", ""]);
            let params = super::super::ptx_param_bytes(masked.file, &masked.symbol());
            assert_eq!(params, [size, std::mem::size_of::<MaskArgs>()], "{}", masked.symbol());
        }
        for head in [0, 16, 40, 65, 127, 129, 256] {
            assert_eq!(head_part(head), None, "head dim {head}");
        }
    }

    /// The shared memory fits an sm_80 block (163 KiB with the opt-in the launch sets) and is
    /// the size the .cu file's `AfSmem` lays out.
    #[test]
    fn shared_memory_fits() {
        for head in HEAD_DIMS {
            assert!(smem_bytes(head) <= 163 * 1024, "head dim {head}");
        }
        assert_eq!(smem_bytes(64), 69_632);
        assert_eq!(smem_bytes(128), 118_784);
    }
}
