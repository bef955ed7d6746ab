//! The tiled flash-attention backward (`attention_flash_backward.cu`): for bf16 and f16 with head
//! dims 64 and 128 (`Ev` = `E`) when the forward's output and log-sum-exp come with the kernel
//! ([`AttentionBackwardArgs::saved`]). Three launches on the compute stream: a per-row
//! preprocess (`D_i = dO_i · O_i`, the log-sum-exp in base 2, a zeroed f32 dQ accumulator), the
//! main kernel (one block per batch entry and tile of keys, on the tensor cores; dK and dV
//! in registers, dQ through f32 atomics), and the conversion of dQ to the dtype. The scratch
//! (`B·L·E` f32 for dQ and two `[B, L]` f32 rows, L rounded up to the query tile) comes from the
//! caching allocator; nothing of size L × S is stored.
//!
//! With an additive mask (`a.mask`) the main kernel's masked variant adds it to the recomputed
//! scores ([`MaskArgs`]).
//!
//! [`eligible`] says whether the kernel takes a call; the caller runs the warp-per-row kernels
//! of `attention_backward.cu` otherwise.

use cartage_core::kernel::{AttentionBackwardArgs, AttentionSaved};
use cartage_core::{DType, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::attention::MaskArgs;
use super::attention_operands::{BatchStrides, dims};
use super::geometry::THREADS;
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The element types the kernels are built for.
pub(crate) const DTYPES: [DType; 2] = [DType::BF16, DType::F16];

/// The main kernel's block shape for head dim `head`: query rows per tile (`BM`) and warps
/// (`NW`, each owning 16 keys); its `ATTENTION_FLASH_MAIN(..)` lines in the .cu file.
const fn config(head: usize) -> (usize, usize) {
    match head {
        64 => (64, 8),
        _ => (32, 8),
    }
}

/// The main kernel's dynamic shared memory in bytes (`FbSmem` of the .cu file): K and V tiles,
/// two Q and two dO tiles, the dSᵀ tile, two lse and two D rows.
const fn smem_bytes(head: usize, bm: usize, nw: usize) -> usize {
    let bn = 16 * nw;
    2 * bn * head * 2 + 4 * bm * head * 2 + bn * bm * 2 + 4 * bm * 4
}

/// `struct FlashBwdArgs` of attention_flash_backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FlashBwdArgs {
    q: u64,
    k: u64,
    v: u64,
    grad: u64,
    out: u64,
    lse: u64,
    grad_q: u64,
    grad_k: u64,
    grad_v: u64,
    dq_acc: u64,
    lse2: u64,
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
    lp: u32,
    n_blocks: u32,
    scale: f32,
    scale_log2: f32,
    causal: i32,
    d: u32,
    heads: u32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for FlashBwdArgs {}

/// The saved forward values when the tiled kernel takes this call: bf16 or f16, head dims 64 or
/// 128 for both E and Ev, q, k, v, the incoming gradient and the saved output with a dense last
/// dimension, row and batch strides that are multiples of 8 elements and 16-byte aligned starts,
/// 16-byte aligned gradients, sizes within 32 bits and a scale within f32.
pub(super) fn eligible(a: &AttentionBackwardArgs) -> Option<&AttentionSaved> {
    a.saved.as_ref()?;
    if !DTYPES.contains(&a.q.dtype) {
        return None;
    }
    let ((batch, l, e), (_, s, _), (_, _, ev)) = (dims(&a.q), dims(&a.k), dims(&a.v));
    if !matches!(e, 64 | 128) || e != ev {
        return None;
    }
    let fits = |n: usize| n < i32::MAX as usize / 2;
    let (bm, nw) = config(e);
    if !fits(batch) || !fits(l.next_multiple_of(bm)) || !fits(s) || !fits(s.div_ceil(16 * nw) * batch) {
        return None;
    }
    super::attention_operands::backward_operands(a)
}

/// Queue the tiled backward (the caller checked [`eligible`]).
pub(super) fn attention_flash_backward(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    saved: &AttentionSaved,
) -> Result<()> {
    let dtype = a.q.dtype;
    let ((batch, l, head), (_, s, _)) = (dims(&a.q), dims(&a.k));
    if batch == 0 || (l == 0 && s == 0) {
        return Ok(());
    }
    let (bm, nw) = config(head);
    let lp = l.next_multiple_of(bm);
    let n_blocks = s.div_ceil(16 * nw);
    // The dQ accumulator, then the lse and D rows (each a multiple of 16 bytes: BM ≥ 4).
    let acc_bytes = batch * l * head * 4;
    let row_bytes = batch * lp * 4;
    let scratch = backend.allocator.alloc((acc_bytes + 2 * row_bytes).max(16))?;
    let slice = scratch.slice();
    let [qs, ks, vs, gs, os] = [&a.q, &a.k, &a.v, &a.grad, &saved.out].map(BatchStrides::of);
    let args = FlashBwdArgs {
        q: device_ptr(&a.q),
        k: device_ptr(&a.k),
        v: device_ptr(&a.v),
        grad: device_ptr(&a.grad),
        out: device_ptr(&saved.out),
        lse: device_ptr(&saved.lse),
        grad_q: device_ptr(&a.grad_q),
        grad_k: device_ptr(&a.grad_k),
        grad_v: device_ptr(&a.grad_v),
        dq_acc: slice.addr(),
        lse2: slice.addr() + acc_bytes as u64,
        delta: slice.addr() + (acc_bytes + row_bytes) as u64,
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
        lp: lp as u32,
        n_blocks: n_blocks as u32,
        scale: a.scale as f32,
        scale_log2: (a.scale * std::f64::consts::LOG2_E) as f32,
        causal: i32::from(a.causal),
        d: head as u32,
        heads: super::attention_operands::heads(&a.q),
    };
    let queued = (|| {
        let names = kernel_names(dtype, head, a.mask.is_some());
        let inputs = [
            a.q.buffer,
            a.k.buffer,
            a.v.buffer,
            a.grad.buffer,
            saved.out.buffer,
            saved.lse.buffer,
        ];
        let rows = (batch * lp) as u64;
        let grid = |units: u64, per_block: u64, max: u32| LaunchConfig {
            grid_dim: (units.div_ceil(per_block).clamp(1, u64::from(max)) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if rows > 0 {
            let prep = backend.modules.kernel(names[0])?;
            let cfg = grid(rows, u64::from(THREADS / 32), max_blocks(backend, &prep));
            let touched = [inputs[3], inputs[4], inputs[5], slice];
            launch_kernel!(backend, prep, cfg, touched, &args)?;
        }
        if n_blocks > 0 {
            let main = backend.modules.kernel(names[1])?;
            let smem = smem_bytes(head, bm, nw);
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
                block_dim: (32 * nw as u32, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let mut touched = vec![
                inputs[0],
                inputs[1],
                inputs[2],
                inputs[3],
                a.grad_k.buffer,
                a.grad_v.buffer,
                slice,
            ];
            match &a.mask {
                None => launch_kernel!(backend, main, cfg, touched, &args)?,
                Some(mask) => {
                    touched.push(mask.values.buffer);
                    let m = MaskArgs::of(mask);
                    launch_kernel!(backend, main, cfg, touched, &args, &m)?
                }
            }
        }
        if l > 0 {
            let dq = backend.modules.kernel(names[2])?;
            let cfg = grid(
                (batch * l * head / 4) as u64,
                u64::from(THREADS),
                max_blocks(backend, &dq),
            );
            launch_kernel!(backend, dq, cfg, [a.grad_q.buffer, slice], &args)?;
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(scratch);
    queued
}

/// The three kernels (preprocess, main: its masked variant when `masked`, dQ conversion) for
/// `dtype` and head dim `head`.
fn kernel_names(dtype: DType, head: usize, masked: bool) -> [KernelName; 3] {
    let (head_part, main_part) = match head {
        64 => ("d64", "d64_m64_w8"),
        _ => ("d128", "d128_m32_w8"),
    };
    [
        KernelName::new(
            SourceFile::AttentionFlashBackward,
            ["attention_flash_backward_prep", dtype.name(), head_part, ""],
        ),
        KernelName::new(
            SourceFile::AttentionFlashBackward,
            [
                if masked {
                    "attention_flash_backward_masked"
                } else {
                    "attention_flash_backward"
                },
                dtype.name(),
                main_part,
                "",
            ],
        ),
        KernelName::new(
            SourceFile::AttentionFlashBackward,
            ["attention_flash_backward_dq", dtype.name(), "", ""],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::{DTYPES, FlashBwdArgs, MaskArgs, config, kernel_names, smem_bytes};
    use crate::modules::SourceFile;

    /// The argument struct is what the kernels declare, every kernel the launch names is built
    /// into the committed PTX with that one parameter, and the main kernel's block shape is the
    /// one its name says.
    #[test]
    fn kernels_take_the_argument_struct() {
        let size = std::mem::size_of::<FlashBwdArgs>();
        assert_eq!(size, 12 * 8 + 15 * 8 + 10 * 4);
        for dtype in DTYPES {
            for head in [64, 128] {
                let names = kernel_names(dtype, head, false);
                for name in &names {
                    assert_eq!(name.file, SourceFile::AttentionFlashBackward);
                    let params = super::super::ptx_param_bytes(name.file, &name.symbol());
                    assert_eq!(params, [size], "{}", name.symbol());
                }
                let masked = kernel_names(dtype, head, true)[1];
                assert!(masked.symbol().starts_with("attention_flash_backward_masked_"));
                let params = super::super::ptx_param_bytes(masked.file, &masked.symbol());
                assert_eq!(params, [size, std::mem::size_of::<MaskArgs>()], "{}", masked.symbol());
                let (bm, nw) = config(head);
                assert!(
                    names[1].symbol().ends_with(&format!("_d{head}_m{bm}_w{nw}")),
                    "{}",
                    names[1].symbol()
                );
            }
        }
    }

    /// The shared memory fits an sm_80 block (163 KiB with the opt-in).
    #[test]
    fn shared_memory_fits() {
        for head in [64, 128] {
            let (bm, nw) = config(head);
            assert!(smem_bytes(head, bm, nw) <= 163 * 1024, "head dim {head}");
        }
    }
}
