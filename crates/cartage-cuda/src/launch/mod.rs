//! Running a [`Kernel`]: one arm per variant, each building its kernel's arguments.
//!
//! The kernel's structure (shapes, dtypes, dims, bounds, alignment, aliasing) is validated once,
//! by core's [`Kernel::validate`], before [`launch`] is reached; the arms check only what CUDA
//! itself limits (the rank a kernel takes, 32-bit cuBLAS sizes). Each arm picks the contiguous
//! fast path (16-byte vector loads) when every operand is dense and aligned, and otherwise passes
//! the coalesced shape and strides so that strided and broadcast operands are read in place (no
//! hidden contiguous copy).

use cartage_core::{DType, Kernel, Result, TensorArg};

use crate::backend::CudaBackend;
use crate::modules::LoadedKernel;
use crate::{conv, matmul};

pub(crate) mod attention;
pub(crate) mod attention_backward;
pub(crate) mod attention_f32;
pub(crate) mod attention_f32_backward;
pub(crate) mod attention_flash_backward;
mod attention_masked_backward;
mod attention_operands;
pub(crate) use attention_operands::dims as attention_dims;
pub(crate) mod backward;
mod column_sum;
mod copy;
mod cross_entropy_backward;
mod elementwise;
pub mod geometry;
pub(crate) mod index;
mod index_rows;
mod norm_grads;
pub(crate) mod pool;
mod reduce;
mod rows;
mod scan;
mod sort;
mod sort_radix;
pub(crate) mod update;
mod update_many;

/// Queue the [`crate::modules::LoadedKernel`] `$kernel` on the compute stream after ordering it
/// behind the users of `$slices` (an array of the operands' buffers); the arguments must be
/// references to locals of the caller, in the kernel's parameter order.
macro_rules! launch_kernel {
    ($backend:expr, $kernel:expr, $cfg:expr, $slices:expr, $($arg:expr),+ $(,)?) => {{
        let backend: &$crate::backend::CudaBackend = $backend;
        let kernel: &$crate::modules::LoadedKernel = &$kernel;
        backend.order.before_compute(&backend.compute, &$slices)?;
        let mut builder = backend.compute.launch_builder(&kernel.function);
        $( cudarc::driver::PushKernelArg::arg(&mut builder, $arg); )+
        // SAFETY: the arguments follow the kernel's C parameter list (written together with the
        // .cu declaration: device addresses as u64, geometry structs with the C layout); every
        // address points into an operand whose extent `Kernel::validate` verified against its
        // buffer, a live block of this device (the contract of `launch`), or into a block the
        // arm allocated itself; the launch is queued on the compute stream after the operands'
        // earlier users (`StreamOrder::before_compute`).
        unsafe { builder.launch($cfg) }
            .map(|_| ())
            .map_err($crate::driver::error(backend.device, "launch kernel"))
    }};
}
pub(crate) use launch_kernel;

/// Run `kernel`.
///
/// # Safety
/// `kernel` passed [`Kernel::validate`] (or was built by this crate to the same rules), and every
/// operand lies in a live allocation of `backend`, freed only in stream order afterwards.
pub(crate) unsafe fn launch(backend: &CudaBackend, kernel: &Kernel) -> Result<()> {
    match kernel {
        Kernel::Fill { out, value } => elementwise::fill(backend, out, *value),
        Kernel::Arange { out, start, step } => elementwise::arange(backend, out, *start, *step),
        Kernel::Random {
            out,
            distribution,
            seed,
            offset,
        } => elementwise::random(backend, out, *distribution, *seed, *offset),
        Kernel::Cast { input, out } => elementwise::cast(backend, input, out),
        Kernel::Copy { input, out } => copy::copy(backend, input, out),
        Kernel::Unary { op, input, out } => elementwise::unary(backend, *op, input, out),
        Kernel::Binary { op, lhs, rhs, out } => elementwise::binary(backend, *op, lhs, rhs, out),
        Kernel::Compare { op, lhs, rhs, out } => elementwise::compare(backend, *op, lhs, rhs, out),
        Kernel::Where {
            cond,
            on_true,
            on_false,
            out,
        } => elementwise::select(backend, cond, on_true, on_false, out),
        Kernel::Reduce { op, input, dims, out } => reduce::reduce(backend, *op, input, dims, out),
        Kernel::Softmax {
            input,
            dim,
            log,
            causal,
            out,
        } => reduce::softmax(backend, input, *dim, *log, *causal, out),
        Kernel::Matmul { lhs, rhs, out } => {
            // SAFETY: validated operands in live blocks of this device (this function's contract).
            unsafe { matmul::matmul(backend, lhs, rhs, out) }
        }
        Kernel::Linear {
            input,
            weight,
            bias,
            activation,
            out,
        } => {
            // SAFETY: validated operands in live blocks of this device (this function's contract).
            unsafe { crate::linear::linear(backend, input, weight, bias.as_ref(), *activation, out) }
        }
        Kernel::Gather { input, index, dim, out } => index::gather(backend, input, index, *dim, out),
        Kernel::IndexSelect { input, index, dim, out } => index::index_select(backend, input, index, *dim, out),
        Kernel::Scan { op, input, dim, out } => scan::scan(backend, *op, input, *dim, out),
        Kernel::Sort {
            input,
            dim,
            descending,
            values,
            indices,
        } => sort::sort(backend, input, *dim, *descending, values, indices),
        Kernel::Scatter {
            mode,
            src,
            index,
            dim,
            out,
        } => index::scatter(backend, *mode, src, index, *dim, out),
        Kernel::Norm {
            kind,
            input,
            weight,
            bias,
            eps,
            out,
        } => rows::norm(backend, *kind, input, weight.as_ref(), bias.as_ref(), *eps, out),
        Kernel::CrossEntropy {
            logits,
            target,
            ignore_index,
            label_smoothing,
            out,
        } => rows::cross_entropy(backend, logits, target, *ignore_index, *label_smoothing, out),
        Kernel::Attention {
            q,
            k,
            v,
            scale,
            causal,
            mask,
            out,
            lse,
        } => attention::attention(backend, [q, k, v], *scale, *causal, mask.as_deref(), out, lse.as_ref()),
        Kernel::AttentionBackward(args) => attention_backward::attention_backward(backend, args),
        Kernel::Pool2d {
            mode,
            window,
            input,
            out,
            indices,
        } => pool::pool2d(backend, *mode, *window, input, out, indices.as_ref()),
        Kernel::Pool2dBackward {
            mode,
            window,
            grad,
            indices,
            out,
        } => pool::pool2d_backward(backend, *mode, *window, grad, indices.as_ref(), out),
        Kernel::Conv2d {
            input,
            weight,
            stride,
            padding,
            dilation,
            groups,
            out,
        } => {
            let window = conv::Window {
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                groups: *groups,
            };
            // SAFETY: validated operands in live blocks of this device (this function's contract).
            unsafe { conv::conv2d(backend, input, weight, window, out) }
        }
        Kernel::Conv2dBackwardInput {
            grad,
            weight,
            stride,
            padding,
            dilation,
            groups,
            out,
        } => {
            let window = conv::Window {
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                groups: *groups,
            };
            // SAFETY: validated operands in live blocks of this device (this function's contract).
            unsafe { conv::conv2d_backward_input(backend, grad, weight, window, out) }
        }
        Kernel::Conv2dBackwardWeight {
            input,
            grad,
            stride,
            padding,
            dilation,
            groups,
            out,
        } => {
            let window = conv::Window {
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                groups: *groups,
            };
            // SAFETY: validated operands in live blocks of this device (this function's contract).
            unsafe { conv::conv2d_backward_weight(backend, input, grad, window, out) }
        }
        Kernel::SoftmaxBackward {
            output,
            grad,
            dim,
            log,
            out,
        } => backward::softmax_backward(backend, output, grad, *dim, *log, out),
        Kernel::GeluBackward { input, grad, out } => elementwise::gelu_backward(backend, input, grad, out),
        Kernel::NormBackward(args) => backward::norm_backward(backend, args),
        Kernel::CrossEntropyBackward {
            logits,
            target,
            grad,
            ignore_index,
            label_smoothing,
            out,
        } => cross_entropy_backward::cross_entropy_backward(
            backend,
            logits,
            target,
            grad,
            *ignore_index,
            *label_smoothing,
            out,
        ),
        Kernel::Update {
            rule,
            grad,
            state,
            param,
        } => update::update(backend, rule, grad, state, param),
        Kernel::UpdateMany { rule, sets } => update_many::update_many(backend, rule, sets),
    }
}

/// The device address of the view's first element.
pub(crate) fn device_ptr(arg: &TensorArg) -> u64 {
    arg.buffer.segment().addr + arg.byte_offset() as u64
}

/// True when every address is 16-byte aligned (vector loads).
pub(crate) fn aligned16(args: &[&TensorArg]) -> bool {
    args.iter().all(|a| device_ptr(a).is_multiple_of(16))
}

/// True when every operand is dense row-major and 16-byte aligned: the vectorised fast path.
pub(crate) fn dense(args: &[&TensorArg]) -> bool {
    args.iter().all(|a| a.layout.is_contiguous()) && aligned16(args)
}

/// The `b<bytes>` part of by-size kernel names.
pub(crate) fn size_name(dtype: DType) -> &'static str {
    match dtype.size_in_bytes() {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        _ => "b8",
    }
}

/// Elements per 16-byte vector of `dtype`.
pub(crate) fn lanes(dtype: DType) -> u64 {
    (16 / dtype.size_in_bytes()) as u64
}

/// The blocks of one full wave of `kernel` on this device: what a grid-stride launch gets at most.
pub(crate) fn max_blocks(backend: &CudaBackend, kernel: &LoadedKernel) -> u32 {
    backend.sm_count * kernel.blocks_per_sm
}

/// The byte sizes of `symbol`'s parameters in the committed PTX of `file`, in order (a `.u64` is
/// 8, a struct `.b8 name[n]` is n): tests hold them against the arguments the host pushes.
#[cfg(test)]
pub(crate) fn ptx_param_bytes(file: crate::modules::SourceFile, symbol: &str) -> Vec<usize> {
    let ptx = crate::precompiled::entry_ptx(file, symbol).unwrap_or_else(|| panic!("{symbol} is not built"));
    let head = &ptx[ptx.find(".entry").expect("an entry")..];
    let params = &head[head.find('(').expect("a parameter list") + 1..head.find(')').expect("its end")];
    params
        .split(',')
        .map(|param| {
            let param = param.trim();
            match param.rfind('[') {
                Some(open) => param[open + 1..param.len() - 1].parse().expect("a byte count"),
                None if param.contains(".u64") => 8,
                None => panic!("{symbol}: unexpected parameter {param}"),
            }
        })
        .collect()
}
