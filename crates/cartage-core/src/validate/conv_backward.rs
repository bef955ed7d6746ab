//! The structural rules of `Conv2dBackwardInput` and `Conv2dBackwardWeight`, in the terms of
//! `Conv2d`'s: the forward input `[N, C, H, W]`, weight `[O, C/groups, kh, kw]` and output
//! gradient `[N, O, OH, OW]` form one convolution (`OH` is `Conv2d`'s output size for `H`),
//! every operand has one float dtype, and the gradient written is contiguous, aligned and apart
//! from both operands it reads.

use super::{aligned, apart, conv_out_size, mismatch, same_dtype};
use crate::error::{Error, Result};
use crate::kernel::TensorArg;

/// The input gradient's op name.
pub(super) const INPUT: &str = "conv2d_backward_input";
/// The weight gradient's op name.
pub(super) const WEIGHT: &str = "conv2d_backward_weight";

/// The forward's window: stride, padding and dilation per axis (height, width), and groups.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Window {
    pub(super) fn new(stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], groups: usize) -> Self {
        Window {
            stride,
            padding,
            dilation,
            groups,
        }
    }
}

/// `Conv2dBackwardInput`: `grad` [N, O, OH, OW] and `weight` [O, C/g, kh, kw] into the
/// contiguous input gradient `out` [N, C, H, W].
pub(super) fn input(grad: &TensorArg, weight: &TensorArg, window: Window, out: &TensorArg) -> Result<()> {
    geometry(INPUT, out, weight, grad, window)?;
    written(INPUT, &[grad, weight], out, "[N, C, H, W]")
}

/// `Conv2dBackwardWeight`: `input` [N, C, H, W] and `grad` [N, O, OH, OW] into the contiguous
/// weight gradient `out` [O, C/g, kh, kw].
pub(super) fn weight(input: &TensorArg, grad: &TensorArg, window: Window, out: &TensorArg) -> Result<()> {
    geometry(WEIGHT, input, out, grad, window)?;
    written(WEIGHT, &[input, grad], out, "[O, C/groups, kh, kw]")
}

/// `x` [N, C, H, W], `w` [O, C/g, kh, kw] and `y` [N, O, OH, OW] are the operands of one
/// convolution under `window`.
fn geometry(name: &'static str, x: &TensorArg, w: &TensorArg, y: &TensorArg, window: Window) -> Result<()> {
    let Window {
        stride,
        padding,
        dilation,
        groups,
    } = window;
    let (xs, ws, ys) = (x.layout.shape(), w.layout.shape(), y.layout.shape());
    if xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
        return Err(mismatch(
            name,
            x,
            w,
            format!(
                "the conv2d backward kernels take input [N, C, H, W], weight [O, C/groups, kh, kw] and gradient \
                 [N, O, OH, OW], all 4-D; the gradient is {ys:?}"
            ),
        ));
    }
    if stride.contains(&0) || dilation.contains(&0) || groups == 0 {
        return Err(Error::invalid(
            name,
            format!("stride {stride:?}, dilation {dilation:?} and groups {groups} must be ≥ 1"),
        ));
    }
    let channels_fit = xs[1] % groups == 0 && ws[0] % groups == 0 && ws[1].checked_mul(groups) == Some(xs[1]);
    if !channels_fit || ws[2] == 0 || ws[3] == 0 {
        return Err(mismatch(
            name,
            x,
            w,
            format!(
                "input has {} channels but weight {ws:?} expects {} (× groups {groups}), with O = {} divisible by \
                 groups and a window of at least 1×1",
                xs[1], ws[1], ws[0]
            ),
        ));
    }
    let oh = conv_out_size(xs[2], ws[2], stride[0], padding[0], dilation[0]);
    let ow = conv_out_size(xs[3], ws[3], stride[1], padding[1], dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) if ys == [xs[0], ws[0], oh, ow] => Ok(()),
        _ => Err(mismatch(
            name,
            x,
            y,
            format!(
                "the gradient must be [N, O, OH, OW] = {:?} for input {xs:?}, weight {ws:?}, stride {stride:?}, \
                 padding {padding:?} and dilation {dilation:?}, but it is {ys:?}",
                [xs[0], ws[0], oh.unwrap_or(0), ow.unwrap_or(0)]
            ),
        )),
    }
}

/// Shared by both kernels and by pooling's: one float dtype; `out` contiguous (`shape` names its
/// layout in the error), aligned and apart from every operand in `read`.
pub(super) fn written(name: &'static str, read: &[&TensorArg], out: &TensorArg, shape: &str) -> Result<()> {
    for arg in read {
        same_dtype(name, arg, out)?;
    }
    if !out.dtype.is_float() {
        return Err(Error::WrongDType {
            op: name,
            dtype: out.dtype,
            expected: "a float dtype",
        });
    }
    if !out.layout.is_contiguous() {
        return Err(Error::invalid(
            name,
            format!(
                "the result must be written contiguous {shape}, but its strides are {:?}",
                out.layout.strides()
            ),
        ));
    }
    for arg in read {
        aligned(name, arg)?;
        apart(name, arg, out)?;
    }
    aligned(name, out)
}
