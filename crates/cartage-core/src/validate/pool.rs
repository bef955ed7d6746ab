//! The structural rules of [`crate::Kernel::Pool2d`] and [`crate::Kernel::Pool2dBackward`]: a
//! 4-D float input plane and its window's output size, padding at most half the kernel (so no
//! window is all padding), dilation 1 for averages, i64 indices exactly where max pooling
//! needs them, and a contiguous written operand apart from everything read.

use super::conv_backward::written;
use super::{aligned, apart, dtype_is, mismatch};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::TensorArg;
use crate::pool::{PoolMode, PoolWindow};

/// `Pool2d`: `input` [N, C, H, W] into the contiguous `out` [N, C, OH, OW] and, for max
/// pooling only, the optional contiguous i64 `indices` of `out`'s shape.
pub(super) fn forward(
    mode: PoolMode,
    window: PoolWindow,
    input: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) -> Result<()> {
    let name = mode.kind().name();
    let expected = geometry(name, mode, window, input)?;
    planes(name, input, out, expected, "output")?;
    written(name, &[input], out, "[N, C, OH, OW]")?;
    match (mode, indices) {
        (PoolMode::Avg { .. }, Some(_)) => Err(Error::invalid(
            name,
            "average pooling writes no indices; pass `None` (only max pooling records where its maxima were)",
        )),
        (PoolMode::Max, Some(indices)) => {
            dtype_is(name, indices, DType::I64, "i64 indices")?;
            if indices.layout.shape() != out.layout.shape() || !indices.layout.is_contiguous() {
                return Err(mismatch(
                    name,
                    indices,
                    out,
                    "the indices must be contiguous and shaped like the output [N, C, OH, OW]",
                ));
            }
            aligned(name, indices)?;
            apart(name, input, indices)?;
            apart(name, indices, out)
        }
        (_, None) => Ok(()),
    }
}

/// `Pool2dBackward`: `grad` [N, C, OH, OW] (and, for max pooling, the forward's i64 `indices`
/// of `grad`'s shape) into the contiguous input gradient `out` [N, C, H, W].
pub(super) fn backward(
    mode: PoolMode,
    window: PoolWindow,
    grad: &TensorArg,
    indices: Option<&TensorArg>,
    out: &TensorArg,
) -> Result<()> {
    let name = mode.kind().backward_name();
    let expected = geometry(name, mode, window, out)?;
    planes(name, out, grad, expected, "gradient")?;
    written(name, &[grad], out, "[N, C, H, W]")?;
    match (mode, indices) {
        (PoolMode::Max, None) => Err(Error::invalid(
            name,
            "max pooling's backward needs the forward's indices (run the forward with indices)",
        )),
        (PoolMode::Avg { .. }, Some(_)) => Err(Error::invalid(
            name,
            "average pooling's backward takes no indices; pass `None`",
        )),
        (PoolMode::Max, Some(indices)) => {
            dtype_is(name, indices, DType::I64, "i64 indices")?;
            if indices.layout.shape() != grad.layout.shape() {
                return Err(mismatch(
                    name,
                    indices,
                    grad,
                    "the indices must be shaped like the gradient [N, C, OH, OW]",
                ));
            }
            aligned(name, indices)?;
            apart(name, indices, out)
        }
        (PoolMode::Avg { .. }, None) => Ok(()),
    }
}

/// The window's rules for the input plane `[N, C, H, W]` of `plane`; returns `[OH, OW]`.
fn geometry(name: &'static str, mode: PoolMode, window: PoolWindow, plane: &TensorArg) -> Result<[usize; 2]> {
    let PoolWindow {
        kernel,
        stride,
        padding,
        dilation,
    } = window;
    if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
        return Err(Error::invalid(
            name,
            format!("kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must be ≥ 1 on each axis"),
        ));
    }
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(Error::invalid(
            name,
            format!("padding {padding:?} must be at most half the kernel {kernel:?} on each axis"),
        ));
    }
    if matches!(mode, PoolMode::Avg { .. }) && dilation != [1, 1] {
        return Err(Error::invalid(
            name,
            format!("average pooling has no dilation; it must be [1, 1], not {dilation:?}"),
        ));
    }
    let shape = plane.layout.shape();
    if shape.len() != 4 {
        return Err(Error::invalid(
            name,
            format!("pooling takes a 4-D [N, C, H, W] input plane; this one is {shape:?}"),
        ));
    }
    let plane = [shape[2], shape[3]];
    let out = window.output_size(plane).ok_or_else(|| {
        Error::invalid(
            name,
            format!(
                "no window fits the input plane {plane:?} with kernel {kernel:?}, padding {padding:?} and dilation \
                 {dilation:?}"
            ),
        )
    })?;
    // With dilation, padding of at most half the kernel no longer keeps every window in touch
    // with the input: a window whose taps all fall in the padding has no maximum and no
    // divisor, so it is refused.
    for axis in 0..2 {
        if let Some(i) = (0..out[axis]).find(|&i| !touches_plane(window, axis, i, plane[axis])) {
            return Err(Error::invalid(
                name,
                format!(
                    "window {i} along the {} reads only padding (plane {plane:?}, kernel {kernel:?}, stride \
                     {stride:?}, padding {padding:?}, dilation {dilation:?}); reduce the padding or the dilation",
                    ["height", "width"][axis]
                ),
            ));
        }
    }
    Ok(out)
}

/// Whether window `i` along `axis` has a tap inside a plane of `size` on that axis.
fn touches_plane(window: PoolWindow, axis: usize, i: usize, size: usize) -> bool {
    let start = i * window.stride[axis];
    (0..window.kernel[axis]).any(|a| {
        let pos = start + a * window.dilation[axis];
        pos >= window.padding[axis] && pos - window.padding[axis] < size
    })
}

/// `pooled` is `[N, C, OH, OW]` for the input plane `plane` `[N, C, H, W]`.
fn planes(name: &'static str, plane: &TensorArg, pooled: &TensorArg, expected: [usize; 2], what: &str) -> Result<()> {
    let (ps, qs) = (plane.layout.shape(), pooled.layout.shape());
    let want = [ps[0], ps[1], expected[0], expected[1]];
    if qs != want {
        return Err(mismatch(
            name,
            plane,
            pooled,
            format!("the {what} must be [N, C, OH, OW] = {want:?} for the input plane {ps:?}, but it is {qs:?}"),
        ));
    }
    Ok(())
}
