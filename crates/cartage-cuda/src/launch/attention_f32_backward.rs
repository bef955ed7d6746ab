//! The tiled f32 flash-attention backward (`attention_f32_backward.cu`): for f32 with the head
//! dims of the f32 forward ([`super::attention_f32::HEAD_DIMS`], `Ev` = `E`) when the forward's
//! output and log-sum-exp come with the kernel ([`AttentionBackwardArgs::saved`]). Two launches
//! on the compute stream: a preprocess (`D_i = dO_i · O_i` into a `[B, L]` f32 scratch row from
//! the caching allocator, `grad_q` zeroed), then the main kernel (one block per batch
//! entry and tile of 64 keys, exact f32 FMAs on the CUDA cores; dK and dV in registers, dQ added
//! into `grad_q` with f32 atomics). Nothing of size L × S is stored.
//!
//! With the forward's additive mask the main kernel's `_masked` variant adds it to the
//! recomputed scores ([`super::attention::MaskArgs`]).
//!
//! [`eligible`] says whether the kernel takes a call; the caller runs the warp-per-row kernels
//! of `attention_backward.cu` otherwise (or, with a mask, refuses the call).

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{DType, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::attention::MaskArgs;
use super::attention_f32::head_part;
use super::attention_operands::{BatchStrides, dims};
use super::geometry::THREADS;
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// Keys per block and threads per block of the main kernel (`AB_BN`, `AB_NT` of the .cu file).
const BLOCK_KEYS: usize = 64;
const BLOCK_THREADS: u32 = 256;

/// The main kernel's dynamic shared memory in bytes (`AbSmem` of the .cu file): K, V, Q and dO
/// tiles of 64 rows of `head + 4` floats, the 64 × 68 Pᵀ / dSᵀ tile, and two rows of 64 floats.
const fn smem_bytes(head: usize) -> usize {
    (4 * 64 * (head + 4) + 64 * 68 + 2 * 64) * 4
}

/// `struct AttnF32BwdArgs` of attention_f32_backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct F32BwdArgs {
    q: u64,
    k: u64,
    v: u64,
    grad: u64,
    out: u64,
    lse: u64,
    grad_q: u64,
    grad_k: u64,
    grad_v: u64,
    delta: u64,
    q_batch: i64,
    q_row: i64,
    k_batch: i64,
    k_row: i64,
    v_batch: i64,
    v_row: i64,
    g_batch: i64,
    g_row: i64,
    o_batch: i64,
    o_row: i64,
    q_inner: i64,
    k_inner: i64,
    v_inner: i64,
    g_inner: i64,
    o_inner: i64,
    batch: u32,
    l: u32,
    s: u32,
    d: u32,
    scale: f32,
    scale_log2: f32,
    causal: i32,
    heads: u32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for F32BwdArgs {}

/// The saved forward values when the tiled f32 kernel takes this call: f32, E = Ev one of the
/// forward's head dims, q, k, v, the incoming gradient and the saved output with a dense last
/// dimension, row and batch strides that are multiples of 4 elements and 16-byte aligned starts,
/// 16-byte aligned gradients, sizes within 31 bits and a scale within f32.
pub(super) fn eligible(a: &AttentionBackwardArgs) -> Option<&AttentionSaved> {
    a.saved.as_ref()?;
    if a.q.dtype != DType::F32 {
        return None;
    }
    let ((batch, l, e), (_, s, _), (_, _, ev)) = (dims(&a.q), dims(&a.k), dims(&a.v));
    if head_part(e).is_none() || e != ev {
        return None;
    }
    let fits = |n: usize| n < i32::MAX as usize / 2;
    if !fits(batch) || !fits(l) || !fits(s) || !fits(s.div_ceil(BLOCK_KEYS).saturating_mul(batch)) {
        return None;
    }
    super::attention_operands::backward_operands(a)
}

/// Queue the tiled f32 backward (the caller checked [`eligible`]).
pub(super) fn attention_f32_backward(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    saved: &AttentionSaved,
) -> Result<()> {
    let ((batch, l, head), (_, s, _)) = (dims(&a.q), dims(&a.k));
    if batch == 0 || (l == 0 && s == 0) {
        return Ok(());
    }
    let names = kernel_names(head, a.mask.is_some()).ok_or_else(|| {
        cartage_core::Error::unsupported(
            "attention_backward",
            DType::F32,
            backend.device,
            format!("the tiled f32 attention backward has no kernel for head dim {head}"),
        )
    })?;
    let n_blocks = s.div_ceil(BLOCK_KEYS);
    let scratch = backend.allocator.alloc((batch * l * 4).max(16))?;
    let slice = scratch.slice();
    let [qs, ks, vs, gs, os] = [&a.q, &a.k, &a.v, &a.grad, &saved.out].map(BatchStrides::of);
    let args = F32BwdArgs {
        q: device_ptr(&a.q),
        k: device_ptr(&a.k),
        v: device_ptr(&a.v),
        grad: device_ptr(&a.grad),
        out: device_ptr(&saved.out),
        lse: device_ptr(&saved.lse),
        grad_q: device_ptr(&a.grad_q),
        grad_k: device_ptr(&a.grad_k),
        grad_v: device_ptr(&a.grad_v),
        delta: slice.addr(),
        q_batch: qs.outer,
        q_row: qs.row,
        k_batch: ks.outer,
        k_row: ks.row,
        v_batch: vs.outer,
        v_row: vs.row,
        g_batch: gs.outer,
        g_row: gs.row,
        o_batch: os.outer,
        o_row: os.row,
        q_inner: qs.inner,
        k_inner: ks.inner,
        v_inner: vs.inner,
        g_inner: gs.inner,
        o_inner: os.inner,
        batch: batch as u32,
        l: l as u32,
        s: s as u32,
        d: head as u32,
        scale: a.scale as f32,
        scale_log2: (a.scale * std::f64::consts::LOG2_E) as f32,
        causal: i32::from(a.causal),
        heads: super::attention_operands::heads(&a.q),
    };
    let queued = (|| {
        let rows = (batch * l) as u64;
        if rows > 0 {
            // A thread per row for D, then per four elements of grad_q to zero it.
            let prep = backend.modules.kernel(names[0])?;
            let units = rows * (head / 4) as u64;
            let cfg = LaunchConfig {
                grid_dim: (
                    units
                        .div_ceil(u64::from(THREADS))
                        .clamp(1, u64::from(max_blocks(backend, &prep))) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let touched = [a.grad.buffer, saved.out.buffer, a.grad_q.buffer, slice];
            launch_kernel!(backend, prep, cfg, touched, &args)?;
        }
        if n_blocks > 0 {
            let main = backend.modules.kernel(names[1])?;
            let smem = smem_bytes(head);
            main.function
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(crate::driver::error(
                    backend.device,
                    "set the shared memory of a kernel",
                ))?;
            let cfg = LaunchConfig {
                grid_dim: ((n_blocks * batch) as u32, 1, 1),
                block_dim: (BLOCK_THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let touched = [
                a.q.buffer,
                a.k.buffer,
                a.v.buffer,
                a.grad.buffer,
                saved.lse.buffer,
                a.grad_q.buffer,
                a.grad_k.buffer,
                a.grad_v.buffer,
                slice,
            ];
            match &a.mask {
                None => launch_kernel!(backend, main, cfg, touched, &args)?,
                Some(mask) => {
                    let m = MaskArgs::of(mask);
                    let touched = [&touched[..], &[mask.values.buffer]].concat();
                    launch_kernel!(backend, main, cfg, touched, &args, &m)?
                }
            }
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(scratch);
    queued
}

/// The two kernels (preprocess, main: its masked variant when `masked`) for head dim `head`, if
/// it is one of [`HEAD_DIMS`].
///
/// [`HEAD_DIMS`]: super::attention_f32::HEAD_DIMS
fn kernel_names(head: usize, masked: bool) -> Option<[KernelName; 2]> {
    let main = if masked {
        "attention_f32_backward_masked"
    } else {
        "attention_f32_backward"
    };
    Some([
        KernelName::new(
            SourceFile::AttentionF32Backward,
            ["attention_f32_backward_prep", "", "", ""],
        ),
        KernelName::new(SourceFile::AttentionF32Backward, [main, head_part(head)?, "", ""]),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::attention_f32::HEAD_DIMS;
    use super::{F32BwdArgs, MaskArgs, kernel_names, smem_bytes};
    use crate::modules::SourceFile;

    /// The argument struct is what the kernels declare, and every kernel the launch names is
    /// built into the committed PTX with that one parameter.
    #[test]
    fn kernels_take_the_argument_struct() {
        let size = std::mem::size_of::<F32BwdArgs>();
        assert_eq!(size, 10 * 8 + 15 * 8 + 8 * 4);
        for head in HEAD_DIMS {
            let names = kernel_names(head, false).expect("a listed head dim");
            for name in &names {
                assert_eq!(name.file, SourceFile::AttentionF32Backward);
                let params = super::super::ptx_param_bytes(name.file, &name.symbol());
                assert_eq!(params, [size], "{}", name.symbol());
            }
            let masked = kernel_names(head, true).expect("a listed head dim")[1];
            let params = super::super::ptx_param_bytes(masked.file, &masked.symbol());
            assert_eq!(params, [size, std::mem::size_of::<MaskArgs>()], "{}", masked.symbol());
            assert!(
                names[1].symbol().ends_with(&format!("_d{head}")),
                "{}",
                names[1].symbol()
            );
        }
        assert!(kernel_names(256, false).is_none());
    }

    /// The shared memory fits an sm_80 block (163 KiB with the opt-in the launch sets).
    #[test]
    fn shared_memory_fits() {
        for head in HEAD_DIMS {
            assert!(smem_bytes(head) <= 163 * 1024, "head dim {head}");
        }
        assert_eq!(smem_bytes(128), 153_088);
    }
}
