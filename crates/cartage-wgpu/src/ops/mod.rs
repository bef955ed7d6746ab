//! One arm per [`Kernel`] variant, each in the module of its kernel family.

pub(crate) mod attention;
pub(crate) mod attention_backward;
pub(crate) mod attention_mask;
pub(crate) mod cross_entropy;
pub(crate) mod cross_entropy_backward;
pub(crate) mod elementwise;
pub(crate) mod geometry;
pub(crate) mod index;
pub(crate) mod map;
pub(crate) mod matmul;
pub(crate) mod matmul_coop;
pub(crate) mod matmul_coop_staged;
pub(crate) mod matmul_coop_tiling;
#[cfg(test)]
mod matmul_naga;
mod matmul_split;
pub(crate) mod matmul_variant;
pub(crate) mod norm;
pub(crate) mod norm_backward;
pub(crate) mod patch;
pub(crate) mod pool;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod rows;
pub(crate) mod scan;
pub(crate) mod scatter;
pub(crate) mod softmax;
pub(crate) mod softmax_backward;
pub(crate) mod sort;
pub(crate) mod update;
pub(crate) mod update_many;

use cartage_core::{Kernel, Result};

use crate::backend::WgpuBackend;

/// Run `kernel`, already capability-checked and validated by [`Kernel::validate`] (shapes,
/// dtypes, dims, bounds, alignment, aliasing): the arms check only the adapter's limits.
pub(crate) fn launch(backend: &WgpuBackend, kernel: &Kernel) -> Result<()> {
    match kernel {
        Kernel::Fill { out, value } => elementwise::fill(backend, out, *value),
        Kernel::Arange { out, start, step } => elementwise::arange(backend, out, *start, *step),
        Kernel::Random {
            out,
            distribution,
            seed,
            offset,
        } => random::random(backend, out, *distribution, *seed, *offset),
        Kernel::Cast { input, out } => elementwise::cast(backend, input, out),
        Kernel::Copy { input, out } => elementwise::copy(backend, input, out),
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
        } => softmax::softmax(backend, input, *dim, *log, *causal, out),
        Kernel::Matmul { lhs, rhs, out } => matmul::matmul(backend, lhs, rhs, out),
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
        } => scatter::scatter(backend, *mode, src, index, *dim, out),
        Kernel::Norm {
            kind,
            input,
            weight,
            bias,
            eps,
            out,
        } => norm::norm(backend, *kind, input, weight.as_ref(), bias.as_ref(), *eps, out),
        Kernel::CrossEntropy {
            logits,
            target,
            ignore_index,
            label_smoothing,
            out,
        } => cross_entropy::cross_entropy(backend, logits, target, *ignore_index, *label_smoothing, out),
        Kernel::SoftmaxBackward {
            output,
            grad,
            dim,
            log,
            out,
        } => softmax_backward::softmax_backward(backend, output, grad, *dim, *log, out),
        Kernel::NormBackward(args) => norm_backward::norm_backward(backend, args),
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
        Kernel::Conv2d { .. }
        | Kernel::Conv2dBackwardInput { .. }
        | Kernel::Conv2dBackwardWeight { .. }
        | Kernel::Linear { .. }
        | Kernel::GeluBackward { .. } => Err(cartage_core::Error::unsupported(
            kernel.op().name(),
            kernel.dtype(),
            cartage_core::Backend::device(backend),
            "no fused kernel here; the frontend composes it from other kernels",
        )),
    }
}
