//! The fused backward of scaled dot-product attention (`Kernel::AttentionBackward`). cuDNN's
//! fused attention runs it where `attention_cudnn` takes the call and chooses it. Else, where the
//! forward's output and log-sum-exp come with the kernel and a tiled kernel takes the dtype, head
//! dim and strides, it runs (the tensor-core one for bf16 and f16,
//! [`super::attention_flash_backward`]; the f32 one, [`super::attention_f32_backward`]); otherwise the
//! two launches of `attention_backward.cu`, a warp per query row (log-sum-exp, `D_i` and
//! `grad_q`), then a warp per key row (`grad_k`, `grad_v`), with a `[B, L]` pair of compute-type
//! scratch rows between them from the caching allocator. Nothing of size L × S is stored.
//!
//! The kernels read q, k, v and the incoming gradient in place through their strides, and take
//! head dims (E and Ev) up to [`MAX_HEAD_DIM`]; larger ones are refused with
//! [`Error::Unsupported`], so that the frontend composes the gradients instead. With an additive
//! mask only the masked f32 kernel runs ([`super::attention_masked_backward`]).

use cartage_core::kernel::AttentionBackwardArgs;
use cartage_core::{DType, Error, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::THREADS;
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The dtypes the kernels are built for.
pub(crate) const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The largest head dim a lane's registers hold (32 lanes × 8 elements).
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// `struct AttnBwdArgs` of attention_backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AttnBwdArgs {
    q: u64,
    k: u64,
    v: u64,
    grad: u64,
    grad_q: u64,
    grad_k: u64,
    grad_v: u64,
    lse: u64,
    delta: u64,
    q_s: [i64; 3],
    k_s: [i64; 3],
    v_s: [i64; 3],
    g_s: [i64; 3],
    rows: u64,
    keys: u64,
    scale: f64,
    l: u32,
    s: u32,
    e: u32,
    ev: u32,
    causal: i32,
    pad: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for AttnBwdArgs {}

/// The `n<N>` part of the kernel names: head-dim elements per lane, a power of two.
fn lanes_part(head: usize) -> &'static str {
    match head.div_ceil(32) {
        0 | 1 => "n1",
        2 => "n2",
        3 | 4 => "n4",
        _ => "n8",
    }
}

/// The two kernels (rows, keys) for `dtype` and the larger head dim `head`.
fn kernel_names(dtype: DType, head: usize) -> [KernelName; 2] {
    let n = lanes_part(head);
    [
        KernelName::new(
            SourceFile::AttentionBackward,
            ["attention_backward_rows", dtype.name(), n, ""],
        ),
        KernelName::new(
            SourceFile::AttentionBackward,
            ["attention_backward_keys", dtype.name(), n, ""],
        ),
    ]
}

/// The bytes of one compute-type scratch value (f64 for f64, else f32).
fn compute_bytes(dtype: DType) -> usize {
    if dtype == DType::F64 { 8 } else { 4 }
}

/// Queue the gradients of `softmax(scale · q kᵀ) v` (validated operands): through cuDNN's fused
/// attention where `attention_cudnn` takes the call, else through cartage's kernels.
pub(super) fn attention_backward(backend: &CudaBackend, a: &AttentionBackwardArgs) -> Result<()> {
    let kernels = |a: &AttentionBackwardArgs| match &a.mask {
        Some(mask) => super::attention_masked_backward::attention_masked_backward(backend, a, mask),
        None => kernels(backend, a),
    };
    if crate::attention_cudnn::backward(backend, a, &kernels)? {
        return Ok(());
    }
    kernels(a)
}

/// Queue the gradients through cartage's kernels: the tiled flash backward where it takes the
/// call, else the warp-per-row kernels.
fn kernels(backend: &CudaBackend, a: &AttentionBackwardArgs) -> Result<()> {
    if let Some(saved) = super::attention_flash_backward::eligible(a) {
        return super::attention_flash_backward::attention_flash_backward(backend, a, saved);
    }
    if let Some(saved) = super::attention_f32_backward::eligible(a) {
        return super::attention_f32_backward::attention_f32_backward(backend, a, saved);
    }
    let dtype = a.q.dtype;
    let refuse = |reason: String| Error::unsupported("attention_backward", dtype, backend.device, reason);
    if !DTYPES.contains(&dtype) {
        return Err(refuse(format!(
            "the fused attention backward takes f32, f64, f16 and bf16, not {dtype}"
        )));
    }
    if a.q.layout.rank() != 3 {
        return Err(refuse(
            "the warp-per-row attention backward reads one batch stride; operands with two batch \
             dimensions go through the tiled kernels (the frontend copies them into [B, L, E] otherwise)"
                .into(),
        ));
    }
    let (qs, ks, vs) = (a.q.layout.shape(), a.k.layout.shape(), a.v.layout.shape());
    let (batch, l, s, e, ev) = (qs[0], qs[1], ks[1], qs[2], vs[2]);
    let head = e.max(ev);
    if head > MAX_HEAD_DIM {
        return Err(refuse(format!(
            "the fused attention backward takes head dims up to {MAX_HEAD_DIM}, got E = {e}, Ev = {ev}; \
             the frontend composes the gradients"
        )));
    }
    let fits = |n: usize| u32::try_from(n).is_ok();
    if !fits(l) || !fits(s) || !fits(e) || !fits(ev) {
        return Err(refuse(format!(
            "the fused attention backward takes fewer than 2^32 rows; got L = {l}, S = {s}"
        )));
    }
    let rows = batch as u64 * l as u64;
    let keys = batch as u64 * s as u64;
    if keys == 0 && rows == 0 {
        return Ok(());
    }
    let strides = |arg: &TensorArg| {
        let st = arg.layout.strides();
        [st[0] as i64, st[1] as i64, st[2] as i64]
    };
    let scratch_bytes = rows as usize * compute_bytes(dtype);
    let scratch = backend.allocator.alloc(2 * scratch_bytes)?;
    let slice = scratch.slice();
    let args = AttnBwdArgs {
        q: device_ptr(&a.q),
        k: device_ptr(&a.k),
        v: device_ptr(&a.v),
        grad: device_ptr(&a.grad),
        grad_q: device_ptr(&a.grad_q),
        grad_k: device_ptr(&a.grad_k),
        grad_v: device_ptr(&a.grad_v),
        lse: slice.addr(),
        delta: slice.addr() + scratch_bytes as u64,
        q_s: strides(&a.q),
        k_s: strides(&a.k),
        v_s: strides(&a.v),
        g_s: strides(&a.grad),
        rows,
        keys,
        scale: a.scale,
        l: l as u32,
        s: s as u32,
        e: e as u32,
        ev: ev as u32,
        causal: i32::from(a.causal),
        pad: 0,
    };
    let queued = (|| {
        let [rows_name, keys_name] = kernel_names(dtype, head);
        let warps_per_block = u64::from(THREADS / 32);
        let config = |units: u64, max: u32| LaunchConfig {
            grid_dim: (units.div_ceil(warps_per_block).clamp(1, u64::from(max)) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let inputs = [a.q.buffer, a.k.buffer, a.v.buffer, a.grad.buffer];
        if rows > 0 {
            let kernel = backend.modules.kernel(rows_name)?;
            let cfg = config(rows, max_blocks(backend, &kernel));
            let touched = [inputs[0], inputs[1], inputs[2], inputs[3], a.grad_q.buffer, slice];
            launch_kernel!(backend, kernel, cfg, touched, &args)?;
        }
        if keys > 0 {
            let kernel = backend.modules.kernel(keys_name)?;
            let cfg = config(keys, max_blocks(backend, &kernel));
            let touched = [
                inputs[0],
                inputs[1],
                inputs[2],
                inputs[3],
                a.grad_k.buffer,
                a.grad_v.buffer,
                slice,
            ];
            launch_kernel!(backend, kernel, cfg, touched, &args)?;
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(scratch);
    queued
}

#[cfg(test)]
mod tests {
    use cartage_core::{DType, Op};

    use super::{AttnBwdArgs, DTYPES, kernel_names, lanes_part};
    use crate::modules::SourceFile;

    /// Head dims map to the smallest register layout that holds them.
    #[test]
    fn head_dims_pick_the_smallest_layout() {
        let cases = [
            (0, "n1"),
            (32, "n1"),
            (33, "n2"),
            (64, "n2"),
            (65, "n4"),
            (128, "n4"),
            (129, "n8"),
        ];
        for (head, part) in cases {
            assert_eq!(lanes_part(head), part, "head dim {head}");
        }
        assert_eq!(lanes_part(super::MAX_HEAD_DIM), "n8");
    }

    /// The argument struct is what the kernels declare, and every kernel the launch names is
    /// built into the committed PTX with that one parameter.
    #[test]
    fn kernels_take_the_argument_struct() {
        let size = std::mem::size_of::<AttnBwdArgs>();
        assert_eq!(size, 9 * 8 + 4 * 24 + 3 * 8 + 6 * 4);
        for dtype in DTYPES {
            for head in [16, 64, 100, 256] {
                for name in kernel_names(dtype, head) {
                    assert_eq!(name.file, SourceFile::AttentionBackward);
                    let params = super::super::ptx_param_bytes(name.file, &name.symbol());
                    assert_eq!(params, [size], "{}", name.symbol());
                }
            }
        }
    }

    /// Listed for every float dtype it is built for.
    #[test]
    fn listed_for_its_dtypes() {
        let caps = crate::backend::capabilities_for((9, 0));
        for dtype in DType::ALL {
            assert_eq!(
                caps.supports(Op::AttentionBackward, dtype),
                DTYPES.contains(&dtype),
                "{dtype}"
            );
        }
    }
}
