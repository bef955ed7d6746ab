//! [`Kernel::validate`]: every structural rule of every [`Kernel`] variant, written once.
//!
//! A backend calls `validate` before it touches memory and then checks only its own hardware
//! limits (binding sizes, 32-bit BLAS sizes, rank limits). The rules:
//! - every operand's layout fits inside its buffer (overflow-checked), and every buffer is
//!   aligned for its element type;
//! - shapes and dtypes agree with what the variant promises (outputs shaped like the broadcast
//!   operands, reductions keeping the rank, `[B, M, K] × [B, K, N] → [B, M, N]`, index dtypes
//!   i32/i64 and index shapes);
//! - dims are in range, reduce dims sorted and distinct, argmax/argmin over exactly one dim;
//! - no output has two elements at one address (a broadcast view cannot be written), and no
//!   output overlaps an input, except an element-wise kernel writing exactly over one of its
//!   inputs (the same view, in place), where each element is read before it is written.
//!
//! The cheap checks run inline; every error is built in a `#[cold]` function so that the tiny-op
//! path stays short.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::{AttentionMask, Kernel, ReduceOp, TensorArg};
use crate::validate_backward as backward;
use conv_backward::Window;

mod attention_backward;
mod conv_backward;
mod linear;
mod pool;

impl Kernel {
    /// Check every structural rule of this kernel (see the module docs). Backends call it
    /// before touching memory, so a malformed kernel is an `Error`, never an out-of-bounds
    /// access, a data race inside the kernel or a panic.
    #[inline]
    pub fn validate(&self) -> Result<()> {
        self.check_bounds()?;
        match self {
            Kernel::Fill { out, .. } | Kernel::Arange { out, .. } | Kernel::Random { out, .. } => {
                aligned(self.name(), out)?;
                writable(self.name(), out)
            }
            Kernel::Cast { input, out } => {
                same_shape("cast", input, out)?;
                aligned("cast", input)?;
                aligned("cast", out)?;
                writable("cast", out)?;
                in_place_or_apart("cast", input, out)
            }
            Kernel::Copy { input, out } => elementwise("copy", &[input], out),
            Kernel::Unary { op, input, out } => elementwise(op.name(), &[input], out),
            Kernel::Binary { op, lhs, rhs, out } => elementwise(op.name(), &[lhs, rhs], out),
            Kernel::Compare { op, lhs, rhs, out } => {
                let name = op.name();
                same_shape(name, lhs, out)?;
                same_shape(name, rhs, out)?;
                same_dtype(name, lhs, rhs)?;
                dtype_is(name, out, DType::Bool, "a comparison writes a bool output")?;
                for arg in [lhs, rhs, out] {
                    aligned(name, arg)?;
                }
                writable(name, out)?;
                in_place_or_apart(name, lhs, out)?;
                in_place_or_apart(name, rhs, out)
            }
            Kernel::Where {
                cond,
                on_true,
                on_false,
                out,
            } => {
                for arg in [cond, on_true, on_false] {
                    same_shape("where", arg, out)?;
                    aligned("where", arg)?;
                }
                aligned("where", out)?;
                dtype_is("where", cond, DType::Bool, "the condition of `where` must be bool")?;
                same_dtype("where", on_true, out)?;
                same_dtype("where", on_false, out)?;
                writable("where", out)?;
                for arg in [cond, on_true, on_false] {
                    in_place_or_apart("where", arg, out)?;
                }
                Ok(())
            }
            Kernel::Reduce { op, input, dims, out } => reduce(*op, input, dims, out),
            Kernel::Softmax {
                input,
                dim,
                causal,
                out,
                ..
            } => {
                let name = self.name();
                same_shape(name, input, out)?;
                same_dtype(name, input, out)?;
                dim_in_range(name, *dim, input.layout.rank())?;
                let rank = input.layout.rank();
                if *causal && (rank < 2 || *dim != rank - 1) {
                    return Err(Error::invalid(
                        name,
                        format!(
                            "a causal softmax runs over the last of at least two dimensions [.., L, S]; \
                             got dim {dim} of a rank-{rank} input"
                        ),
                    ));
                }
                aligned(name, input)?;
                aligned(name, out)?;
                writable(name, out)?;
                apart(name, input, out)
            }
            Kernel::Matmul { lhs, rhs, out } => matmul(lhs, rhs, out),
            Kernel::Gather { input, index, dim, out } => gather(input, index, *dim, out),
            Kernel::IndexSelect { input, index, dim, out } => index_select(input, index, *dim, out),
            Kernel::Scan { op, input, dim, out } => {
                let name = op.name();
                same_shape(name, input, out)?;
                same_dtype(name, input, out)?;
                dim_in_range(name, *dim, input.layout.rank())?;
                aligned(name, input)?;
                aligned(name, out)?;
                writable(name, out)?;
                apart(name, input, out)
            }
            Kernel::Sort {
                input,
                dim,
                values,
                indices,
                ..
            } => sort(input, *dim, values, indices),
            Kernel::Scatter {
                mode,
                src,
                index,
                dim,
                out,
            } => scatter(mode.name(), src, index, *dim, out),
            Kernel::Norm {
                kind,
                input,
                weight,
                bias,
                out,
                eps,
            } => norm(kind.name(), input, weight.as_ref(), bias.as_ref(), *eps, out),
            Kernel::CrossEntropy {
                logits,
                target,
                label_smoothing,
                out,
                ..
            } => cross_entropy(logits, target, *label_smoothing, out),
            Kernel::Conv2d {
                input,
                weight,
                stride,
                padding,
                dilation,
                groups,
                out,
            } => conv2d(input, weight, *stride, *padding, *dilation, *groups, out),
            Kernel::Conv2dBackwardInput {
                grad,
                weight,
                stride,
                padding,
                dilation,
                groups,
                out,
            } => conv_backward::input(grad, weight, Window::new(*stride, *padding, *dilation, *groups), out),
            Kernel::Conv2dBackwardWeight {
                input,
                grad,
                stride,
                padding,
                dilation,
                groups,
                out,
            } => conv_backward::weight(input, grad, Window::new(*stride, *padding, *dilation, *groups), out),
            Kernel::Attention {
                q,
                k,
                v,
                scale,
                mask,
                out,
                lse,
                ..
            } => attention(q, k, v, *scale, mask.as_deref(), out, lse.as_ref()),
            Kernel::Linear {
                input,
                weight,
                bias,
                out,
                ..
            } => linear::linear(input, weight, bias.as_ref(), out),
            Kernel::AttentionBackward(args) => attention_backward::attention_backward(args),
            Kernel::Pool2d {
                mode,
                window,
                input,
                out,
                indices,
            } => pool::forward(*mode, *window, input, out, indices.as_ref()),
            Kernel::Pool2dBackward {
                mode,
                window,
                grad,
                indices,
                out,
            } => pool::backward(*mode, *window, grad, indices.as_ref(), out),
            Kernel::SoftmaxBackward {
                output, grad, dim, out, ..
            } => backward::softmax(self.name(), output, grad, *dim, out),
            Kernel::GeluBackward { input, grad, out } => backward::elementwise(self.name(), input, grad, out),
            Kernel::NormBackward(args) => backward::norm(args),
            Kernel::CrossEntropyBackward {
                logits,
                target,
                grad,
                label_smoothing,
                out,
                ..
            } => backward::cross_entropy(logits, target, grad, *label_smoothing, out),
            Kernel::Update {
                rule,
                grad,
                state,
                param,
            } => backward::update(rule, grad, state, param),
            Kernel::UpdateMany { rule, sets } => backward::update_many(rule, sets),
        }
    }

    /// The op's static name, for error messages on the launch path (no allocation).
    fn name(&self) -> &'static str {
        match self {
            Kernel::Fill { .. } => "fill",
            Kernel::Arange { .. } => "arange",
            Kernel::Random { .. } => "rand",
            Kernel::Cast { .. } => "cast",
            Kernel::Copy { .. } => "copy",
            Kernel::Unary { op, .. } => op.name(),
            Kernel::Binary { op, .. } => op.name(),
            Kernel::Compare { op, .. } => op.name(),
            Kernel::Where { .. } => "where",
            Kernel::Reduce { op, .. } => op.name(),
            Kernel::Softmax { log: false, .. } => "softmax",
            Kernel::Softmax { log: true, .. } => "log_softmax",
            Kernel::Matmul { .. } => "matmul",
            Kernel::Gather { .. } => "gather",
            Kernel::IndexSelect { .. } => "index_select",
            Kernel::Scan { op, .. } => op.name(),
            Kernel::Sort { .. } => "sort",
            Kernel::Scatter { mode, .. } => mode.name(),
            Kernel::Norm { kind, .. } => kind.name(),
            Kernel::CrossEntropy { .. } => "cross_entropy",
            Kernel::Conv2d { .. } => "conv2d",
            Kernel::Conv2dBackwardInput { .. } => conv_backward::INPUT,
            Kernel::Conv2dBackwardWeight { .. } => conv_backward::WEIGHT,
            Kernel::Attention { .. } => "attention",
            Kernel::Linear { .. } => "linear",
            Kernel::AttentionBackward(_) => "attention_backward",
            Kernel::Pool2d { mode, .. } => mode.kind().name(),
            Kernel::Pool2dBackward { mode, .. } => mode.kind().backward_name(),
            Kernel::SoftmaxBackward { log: false, .. } => "softmax_backward",
            Kernel::SoftmaxBackward { log: true, .. } => "log_softmax_backward",
            Kernel::GeluBackward { .. } => "gelu_backward",
            Kernel::NormBackward(a) => backward::norm_name(a.kind),
            Kernel::CrossEntropyBackward { .. } => "cross_entropy_backward",
            Kernel::Update { rule, .. } => rule.kind().name(),
            Kernel::UpdateMany { rule, .. } => rule.kind().many_name(),
        }
    }
}

/// Same shape and dtype for every input and the output, alignment, a writable output that is
/// either exactly an input (in place) or apart from all of them.
#[inline(always)]
fn elementwise(op: &'static str, inputs: &[&TensorArg], out: &TensorArg) -> Result<()> {
    for input in inputs {
        same_shape(op, input, out)?;
        same_dtype(op, input, out)?;
        aligned(op, input)?;
    }
    aligned(op, out)?;
    writable(op, out)?;
    for input in inputs {
        in_place_or_apart(op, input, out)?;
    }
    Ok(())
}

pub(crate) fn mismatch(op: &'static str, a: &TensorArg, b: &TensorArg, reason: impl Into<String>) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: a.layout.shape().to_vec(),
        rhs: b.layout.shape().to_vec(),
        reason: reason.into(),
    }
}

/// Element-wise comparison of two short shapes (cheaper than a `memcmp` call for small ranks).
#[inline(always)]
fn shapes_equal(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[inline(always)]
pub(crate) fn same_shape(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if shapes_equal(a.layout.shape(), b.layout.shape()) {
        Ok(())
    } else {
        Err(shape_error(op, a, b))
    }
}

#[cold]
fn shape_error(op: &'static str, a: &TensorArg, b: &TensorArg) -> Error {
    mismatch(
        op,
        a,
        b,
        "the kernel's operands must have the output's shape (broadcast before launch)",
    )
}

#[inline(always)]
pub(crate) fn same_dtype(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(dtype_error(op, a, b))
    }
}

#[cold]
fn dtype_error(op: &'static str, a: &TensorArg, b: &TensorArg) -> Error {
    Error::invalid(
        op,
        format!(
            "operands of dtypes {} and {} in one kernel; they must match",
            a.dtype, b.dtype
        ),
    )
}

pub(crate) fn dtype_is(op: &'static str, arg: &TensorArg, dtype: DType, expected: &'static str) -> Result<()> {
    if arg.dtype == dtype {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype: arg.dtype,
            expected,
        })
    }
}

#[inline(always)]
pub(crate) fn aligned(op: &'static str, arg: &TensorArg) -> Result<()> {
    let size = arg.dtype.size_in_bytes() as u64;
    if arg.buffer.addr() & (size - 1) == 0 {
        Ok(())
    } else {
        Err(alignment_error(op, arg))
    }
}

#[cold]
fn alignment_error(op: &'static str, arg: &TensorArg) -> Error {
    Error::invalid(
        op,
        format!(
            "a {} buffer at byte offset {} is not aligned to its {}-byte elements; \
             views must start on an element boundary",
            arg.dtype,
            arg.buffer.offset(),
            arg.dtype.size_in_bytes()
        ),
    )
}

/// The output has no two elements at one address (a broadcast or overlapping view cannot be
/// written: two threads would race on one element).
#[inline(always)]
pub(crate) fn writable(op: &'static str, out: &TensorArg) -> Result<()> {
    if out.layout.is_non_overlapping() {
        Ok(())
    } else {
        Err(overlapping_output(op, out))
    }
}

#[cold]
fn overlapping_output(op: &'static str, out: &TensorArg) -> Error {
    Error::invalid(
        op,
        format!(
            "the output view (shape {:?}, strides {:?}) maps several elements to one address; \
             write into a tensor that owns its elements (e.g. `.contiguous()` of a broadcast view)",
            out.layout.shape(),
            out.layout.strides()
        ),
    )
}

/// The bytes `[start, end)` of the segment an operand can touch (empty for zero elements).
#[inline(always)]
fn span(arg: &TensorArg) -> (usize, usize) {
    let size = arg.dtype.size_in_bytes();
    let extent = arg.layout.extent();
    if extent == 0 {
        return (0, 0);
    }
    let base = arg.buffer.offset();
    (
        base.saturating_add(arg.layout.offset().saturating_mul(size)),
        base.saturating_add(extent.saturating_mul(size)),
    )
}

/// True when the memory the two operands can touch intersects.
#[inline(always)]
fn intersects(a: &TensorArg, b: &TensorArg) -> bool {
    let (x, y) = (&a.buffer, &b.buffer);
    // Different blocks (the common case: separate tensors) cannot share an element.
    if !x.same_segment(y) || x.offset() >= y.offset() + y.len() || y.offset() >= x.offset() + x.len() {
        return false;
    }
    let ((a0, a1), (b0, b1)) = (span(a), span(b));
    a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
}

/// An element-wise input may be exactly the output (the same elements at the same addresses,
/// read before written); any other overlap is refused.
#[inline(always)]
fn in_place_or_apart(op: &'static str, input: &TensorArg, out: &TensorArg) -> Result<()> {
    if !intersects(input, out) {
        return Ok(());
    }
    let same_view = input.buffer.offset() == out.buffer.offset()
        && input.dtype.size_in_bytes() == out.dtype.size_in_bytes()
        && input.layout.offset() == out.layout.offset()
        && shapes_equal(input.layout.strides(), out.layout.strides());
    if same_view { Ok(()) } else { Err(aliasing_error(op)) }
}

/// Kernels that read other elements than the one they write: no overlap at all.
#[inline(always)]
pub(crate) fn apart(op: &'static str, input: &TensorArg, out: &TensorArg) -> Result<()> {
    if intersects(input, out) {
        Err(aliasing_error(op))
    } else {
        Ok(())
    }
}

#[cold]
fn aliasing_error(op: &'static str) -> Error {
    Error::invalid(
        op,
        "the output shares memory with an input (not as the same view); write into a new tensor, \
         or copy the input first",
    )
}

pub(crate) fn dim_in_range(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim < rank {
        Ok(())
    } else {
        Err(Error::DimOutOfRange {
            op,
            dim: dim as isize,
            rank,
        })
    }
}

fn reduce(op: ReduceOp, input: &TensorArg, dims: &[usize], out: &TensorArg) -> Result<()> {
    let name = op.name();
    let rank = input.layout.rank();
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::invalid(
            name,
            format!("dims {dims:?} must be sorted and distinct"),
        ));
    }
    for &d in dims {
        dim_in_range(name, d, rank)?;
    }
    if out.layout.rank() != rank
        || (0..rank).any(|d| out.layout.shape()[d] != if dims.contains(&d) { 1 } else { input.layout.shape()[d] })
    {
        return Err(mismatch(
            name,
            input,
            out,
            format!("the output keeps the input's rank with the reduced dims {dims:?} of size 1"),
        ));
    }
    if out.dtype != op.output_dtype(input.dtype) {
        return Err(Error::WrongDType {
            op: name,
            dtype: out.dtype,
            expected: "argmax/argmin write i64; the other reductions keep the input dtype",
        });
    }
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && dims.len() != 1 {
        return Err(Error::invalid(name, "argmax/argmin reduce exactly one dimension"));
    }
    let reduced_empty = dims.iter().any(|&d| input.layout.shape()[d] == 0);
    if reduced_empty
        && out.layout.numel() > 0
        && matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
    {
        return Err(Error::invalid(name, "the reduction of zero elements has no value"));
    }
    aligned(name, input)?;
    aligned(name, out)?;
    writable(name, out)?;
    apart(name, input, out)
}

fn matmul(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    let (l, r, o) = (lhs.layout.shape(), rhs.layout.shape(), out.layout.shape());
    if l.len() != 3 || r.len() != 3 || o.len() != 3 {
        return Err(mismatch(
            "matmul",
            lhs,
            rhs,
            "the matmul kernel takes rank-3 operands [B, M, K] × [B, K, N]",
        ));
    }
    if l[0] != r[0] || l[2] != r[1] || o != [l[0], l[1], r[2]] {
        return Err(mismatch(
            "matmul",
            lhs,
            rhs,
            format!("[B, M, K] × [B, K, N] → [B, M, N] does not hold with output {o:?}"),
        ));
    }
    same_dtype("matmul", lhs, rhs)?;
    same_dtype("matmul", lhs, out)?;
    if !out.layout.is_contiguous() {
        return Err(Error::invalid(
            "matmul",
            "the output must be contiguous [B, M, N]; allocate a new tensor for it",
        ));
    }
    apart("matmul", lhs, out)?;
    apart("matmul", rhs, out)?;
    aligned("matmul", lhs)?;
    aligned("matmul", rhs)?;
    aligned("matmul", out)
}

pub(crate) fn index_dtype(op: &'static str, index: &TensorArg) -> Result<()> {
    if index.dtype.is_index() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype: index.dtype,
            expected: "indices must be i32 or i64 (convert float indices with `.to_dtype(DType::I64)`)",
        })
    }
}

fn gather(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    index_dtype("gather", index)?;
    let rank = input.layout.rank();
    dim_in_range("gather", dim, rank)?;
    same_dtype("gather", input, out)?;
    same_shape("gather", index, out)?;
    let (i, x) = (index.layout.shape(), input.layout.shape());
    if i.len() != rank || (0..rank).any(|d| d != dim && i[d] > x[d]) {
        return Err(mismatch(
            "gather",
            input,
            index,
            format!("the index must have the input's rank and fit inside it except along dim {dim}"),
        ));
    }
    for arg in [input, index, out] {
        aligned("gather", arg)?;
    }
    writable("gather", out)?;
    apart("gather", input, out)?;
    apart("gather", index, out)
}

fn index_select(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    index_dtype("index_select", index)?;
    let rank = input.layout.rank();
    dim_in_range("index_select", dim, rank)?;
    same_dtype("index_select", input, out)?;
    if index.layout.rank() != 1 {
        return Err(mismatch(
            "index_select",
            input,
            index,
            "the index must be one-dimensional",
        ));
    }
    let (x, o) = (input.layout.shape(), out.layout.shape());
    let fits = o.len() == rank && (0..rank).all(|d| o[d] == if d == dim { index.layout.shape()[0] } else { x[d] });
    if !fits {
        let mut expected = x.to_vec();
        expected[dim] = index.layout.shape()[0];
        return Err(mismatch(
            "index_select",
            input,
            out,
            format!("the output must have shape {expected:?}"),
        ));
    }
    for arg in [input, index, out] {
        aligned("index_select", arg)?;
    }
    writable("index_select", out)?;
    apart("index_select", input, out)?;
    apart("index_select", index, out)
}

fn sort(input: &TensorArg, dim: usize, values: &TensorArg, indices: &TensorArg) -> Result<()> {
    dim_in_range("sort", dim, input.layout.rank())?;
    same_shape("sort", input, values)?;
    same_shape("sort", input, indices)?;
    same_dtype("sort", input, values)?;
    dtype_is("sort", indices, DType::I64, "sort writes i64 indices")?;
    for arg in [input, values, indices] {
        aligned("sort", arg)?;
    }
    writable("sort", values)?;
    writable("sort", indices)?;
    apart("sort", input, values)?;
    apart("sort", input, indices)?;
    apart("sort", values, indices)
}

fn scatter(name: &'static str, src: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    index_dtype(name, index)?;
    let rank = out.layout.rank();
    dim_in_range(name, dim, rank)?;
    same_dtype(name, src, out)?;
    let (i, s, o) = (index.layout.shape(), src.layout.shape(), out.layout.shape());
    if i.len() != rank || s.len() != rank {
        return Err(mismatch(
            name,
            src,
            index,
            format!("the index and the source must have the destination's rank {rank}"),
        ));
    }
    if (0..rank).any(|d| i[d] > s[d] || (d != dim && i[d] > o[d])) {
        return Err(mismatch(
            name,
            src,
            index,
            format!(
                "the index {i:?} must fit inside the source {s:?}, and inside the destination {o:?} \
                 except along dim {dim}"
            ),
        ));
    }
    for arg in [src, index, out] {
        aligned(name, arg)?;
    }
    writable(name, out)?;
    apart(name, src, out)?;
    apart(name, index, out)
}

fn norm(
    name: &'static str,
    input: &TensorArg,
    weight: Option<&TensorArg>,
    bias: Option<&TensorArg>,
    eps: f64,
    out: &TensorArg,
) -> Result<()> {
    let shape = input.layout.shape();
    let Some(&last) = shape.last() else {
        return Err(Error::invalid(
            name,
            "the input needs at least one dimension to normalise",
        ));
    };
    same_shape(name, input, out)?;
    same_dtype(name, input, out)?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(name, format!("eps must be finite and ≥ 0, got {eps}")));
    }
    if bias.is_some() && name == "rms_norm" {
        return Err(Error::invalid(name, "RMS norm takes no bias"));
    }
    for param in [weight, bias].into_iter().flatten() {
        same_dtype(name, param, input)?;
        if param.layout.shape() != [last] {
            return Err(mismatch(
                name,
                input,
                param,
                format!("weight and bias must be 1-D of the last dim's size {last}"),
            ));
        }
        aligned(name, param)?;
        apart(name, param, out)?;
    }
    aligned(name, input)?;
    aligned(name, out)?;
    writable(name, out)?;
    apart(name, input, out)
}

fn cross_entropy(logits: &TensorArg, target: &TensorArg, smoothing: f64, out: &TensorArg) -> Result<()> {
    let name = "cross_entropy";
    index_dtype(name, target)?;
    let (l, t, o) = (logits.layout.shape(), target.layout.shape(), out.layout.shape());
    if l.len() != 2 || t.len() != 1 || t[0] != l[0] || o != [l[0]] {
        return Err(mismatch(
            name,
            logits,
            target,
            format!("logits [N, C] and target [N] give a per-row loss [N]; the output is {o:?}"),
        ));
    }
    same_dtype(name, logits, out)?;
    if !(0.0..=1.0).contains(&smoothing) {
        return Err(Error::invalid(
            name,
            format!("label smoothing must lie in [0, 1], got {smoothing}"),
        ));
    }
    for arg in [logits, target, out] {
        aligned(name, arg)?;
    }
    writable(name, out)?;
    apart(name, logits, out)?;
    apart(name, target, out)
}

/// The output size of one convolution or pooling axis: `(size + 2·padding − span) / stride + 1`
/// with `span = dilation·(kernel − 1) + 1`, or `None` when the window does not fit the padded
/// input, an intermediate overflows, or `kernel` or `stride` is 0.
///
/// ```
/// assert_eq!(cartage_core::conv_out_size(56, 3, 1, 1, 1), Some(56));
/// assert_eq!(cartage_core::conv_out_size(2, 5, 1, 0, 1), None);
/// ```
pub fn conv_out_size(size: usize, kernel: usize, stride: usize, padding: usize, dilation: usize) -> Option<usize> {
    let span = dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
    let padded = size.checked_add(padding.checked_mul(2)?)?;
    Some(padded.checked_sub(span)?.checked_div(stride)? + 1)
}

fn conv2d(
    input: &TensorArg,
    weight: &TensorArg,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    out: &TensorArg,
) -> Result<()> {
    let name = "conv2d";
    let (x, w, o) = (input.layout.shape(), weight.layout.shape(), out.layout.shape());
    if x.len() != 4 || w.len() != 4 || o.len() != 4 {
        return Err(mismatch(
            name,
            input,
            weight,
            "the conv2d kernel takes input [N, C, H, W], weight [O, C/groups, kh, kw] and output [N, O, OH, OW]",
        ));
    }
    if stride.contains(&0) || dilation.contains(&0) || groups == 0 {
        return Err(Error::invalid(
            name,
            format!("stride {stride:?}, dilation {dilation:?} and groups {groups} must be ≥ 1"),
        ));
    }
    if x[1] % groups != 0 || w[0] % groups != 0 || w[1] * groups != x[1] || w[2] == 0 || w[3] == 0 {
        return Err(mismatch(
            name,
            input,
            weight,
            format!(
                "input has {} channels but weight expects {} (× groups {groups}), with O = {} divisible by groups",
                x[1], w[1], w[0]
            ),
        ));
    }
    let oh = conv_out_size(x[2], w[2], stride[0], padding[0], dilation[0]);
    let ow = conv_out_size(x[3], w[3], stride[1], padding[1], dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) if o == [x[0], w[0], oh, ow] => {}
        _ => {
            return Err(mismatch(
                name,
                input,
                out,
                format!(
                    "the output must be [N, O, OH, OW] = {:?} for this window",
                    [x[0], w[0], oh.unwrap_or(0), ow.unwrap_or(0)]
                ),
            ));
        }
    }
    same_dtype(name, input, weight)?;
    same_dtype(name, input, out)?;
    if !out.layout.is_contiguous() {
        return Err(Error::invalid(name, "the output must be contiguous [N, O, OH, OW]"));
    }
    for arg in [input, weight, out] {
        aligned(name, arg)?;
    }
    apart(name, input, out)?;
    apart(name, weight, out)
}

fn attention(
    q: &TensorArg,
    k: &TensorArg,
    v: &TensorArg,
    scale: f64,
    mask: Option<&AttentionMask>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    let name = "attention";
    let (qs, ks, vs, os) = (q.layout.shape(), k.layout.shape(), v.layout.shape(), out.layout.shape());
    let r = qs.len();
    let ranks = (r == 3 || r == 4) && ks.len() == r && vs.len() == r && os.len() == r;
    let fits = ranks
        && ks[..r - 2] == qs[..r - 2]
        && vs[..r - 2] == qs[..r - 2]
        && ks[r - 1] == qs[r - 1]
        && vs[r - 2] == ks[r - 2]
        && os[..r - 1] == qs[..r - 1]
        && os[r - 1] == vs[r - 1];
    if !fits {
        return Err(mismatch(
            name,
            q,
            k,
            "the attention kernel takes q [B, L, E], k [B, S, E], v [B, S, Ev] and writes [B, L, Ev] \
             (or the same with two batch dimensions [B1, B2, ..])",
        ));
    }
    let batch: usize = qs[..r - 2].iter().product();
    let (l, s) = (qs[r - 2], ks[r - 2]);
    if !scale.is_finite() {
        return Err(Error::invalid(name, format!("the scale must be finite, got {scale}")));
    }
    same_dtype(name, q, k)?;
    same_dtype(name, q, v)?;
    same_dtype(name, q, out)?;
    // Contiguous; with two batch dimensions also any non-overlapping view with a dense last
    // dimension (the heads of a [B1, L, B2, Ev] block, the layout a packed projection's consumer
    // reads on).
    let strided_ok = r == 4 && out.layout.strides()[3] == 1 && out.layout.is_non_overlapping();
    if !out.layout.is_contiguous() && !strided_ok {
        return Err(Error::invalid(
            name,
            format!(
                "the output must be contiguous [B, L, Ev] (or, with two batch dimensions, a \
                 non-overlapping view with a dense last dimension); got strides {:?}",
                out.layout.strides()
            ),
        ));
    }
    for arg in [q, k, v, out] {
        aligned(name, arg)?;
    }
    apart(name, q, out)?;
    apart(name, k, out)?;
    apart(name, v, out)?;
    if let Some(mask) = mask {
        attention_backward::mask(name, mask, q, [batch, l, s])?;
        apart(name, &mask.values, out)?;
    }
    if let Some(lse) = lse {
        attention_backward::lse_rows(name, lse, [batch, l])?;
        for input in [q, k, v, out].into_iter().chain(mask.map(|m| &m.values)) {
            apart(name, input, lse)?;
        }
    }
    Ok(())
}
