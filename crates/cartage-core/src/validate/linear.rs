//! The structural rules of [`crate::Kernel::Linear`]: `input` [M, K] and `weight` [N, K] of one
//! float dtype, an optional bias [N] of that dtype, and a contiguous `out` [M, N] apart from
//! everything it reads.

use super::{aligned, apart, mismatch, same_dtype, writable};
use crate::error::{Error, Result};
use crate::kernel::TensorArg;

const NAME: &str = "linear";

/// `act(input · weightᵀ + bias)` into `out`.
pub(super) fn linear(input: &TensorArg, weight: &TensorArg, bias: Option<&TensorArg>, out: &TensorArg) -> Result<()> {
    let (i, w, o) = (input.layout.shape(), weight.layout.shape(), out.layout.shape());
    if i.len() != 2 || w.len() != 2 {
        return Err(mismatch(
            NAME,
            input,
            weight,
            "the linear kernel takes a rank-2 input [M, K] and weight [N, K]; merge the batch dimensions first",
        ));
    }
    if i[1] != w[1] {
        return Err(mismatch(
            NAME,
            input,
            weight,
            format!("the input has {} features but the weight [N, K] expects {}", i[1], w[1]),
        ));
    }
    if o != [i[0], w[0]] {
        return Err(mismatch(
            NAME,
            input,
            out,
            format!("the output must be [M, N] = [{}, {}], got {o:?}", i[0], w[0]),
        ));
    }
    if !input.dtype.is_float() {
        return Err(Error::invalid(
            NAME,
            format!("the linear kernel is float-only, got {}", input.dtype),
        ));
    }
    same_dtype(NAME, input, weight)?;
    same_dtype(NAME, input, out)?;
    if let Some(bias) = bias {
        if bias.layout.shape() != [w[0]] {
            return Err(mismatch(
                NAME,
                bias,
                weight,
                format!("the bias must be 1-D of the weight's {} output features", w[0]),
            ));
        }
        same_dtype(NAME, input, bias)?;
        aligned(NAME, bias)?;
        apart(NAME, bias, out)?;
    }
    if !out.layout.is_contiguous() {
        return Err(Error::invalid(
            NAME,
            "the output must be contiguous [M, N]; allocate a new tensor for it",
        ));
    }
    aligned(NAME, input)?;
    aligned(NAME, weight)?;
    aligned(NAME, out)?;
    writable(NAME, out)?;
    apart(NAME, input, out)?;
    apart(NAME, weight, out)
}
