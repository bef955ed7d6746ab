//! `Kernel::Linear`: `act(input · weightᵀ + bias)`, composed from this backend's own matmul (the
//! weight read through a transposed view, never copied) and one in-place element-wise pass over
//! the output for the bias and the activation, computed in the compute type (f32 for f16/bf16).
//! The product is rounded to the dtype once before that pass, which the kernel's contract allows.

use cartage_core::{Device, Epilogue, Error, Layout, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real, float_fn};
use crate::map::{map1_real, map2_real};
use crate::matmul;

/// `Kernel::Linear` on validated operands.
pub fn linear(
    input: &TensorArg,
    weight: &TensorArg,
    bias: Option<&TensorArg>,
    activation: Epilogue,
    out: &TensorArg,
) -> Result<()> {
    let (m, n) = (input.layout.shape()[0], weight.layout.shape()[0]);
    let lhs = TensorArg {
        layout: input.layout.unsqueeze(0)?,
        ..input.clone()
    };
    let rhs = TensorArg {
        layout: weight.layout.transpose(0, 1)?.unsqueeze(0)?,
        ..weight.clone()
    };
    let product = TensorArg {
        layout: out.layout.unsqueeze(0)?,
        ..out.clone()
    };
    matmul::matmul(&lhs, &rhs, &product)?;
    if m == 0 || n == 0 || (bias.is_none() && activation == Epilogue::Identity) {
        return Ok(());
    }
    with_float!(out.dtype, T => {
        match bias {
            Some(bias) => {
                // The bias broadcast over the rows: stride 0 down, its own stride across.
                let rows = Layout::from_parts(&[m, n], &[0, bias.layout.strides()[0]], bias.layout.offset())?;
                let bias = TensorArg { layout: rows, ..bias.clone() };
                // SAFETY: validated operands (shapes, dtypes, bounds, alignment); `out` is
                // written exactly over itself, element by element, and is apart from the bias.
                unsafe { map2_real::<T>(out, &bias, out, |y, b| act::<<T as Real>::C>(activation, y + b)) };
            }
            // SAFETY: as above, one operand read and written in place.
            None => unsafe { map1_real::<T>(out, out, |y| act::<<T as Real>::C>(activation, y)) },
        }
        Ok(())
    }, else Err(Error::unsupported("linear", out.dtype, Device::cpu(), "linear is defined for floats")))
}

/// The activation in the compute type.
#[inline(always)]
fn act<F: Float>(activation: Epilogue, x: F) -> F {
    match activation {
        Epilogue::Identity => x,
        Epilogue::Relu => float_fn::relu(x),
        Epilogue::Gelu => float_fn::gelu(x),
        Epilogue::GeluTanh => {
            let c = F::from_f64((2.0 / std::f64::consts::PI).sqrt());
            let cubic = F::from_f64(0.044715) * x * x * x;
            F::from_f64(0.5) * x * (F::ONE + (c * (x + cubic)).tanh())
        }
    }
}
