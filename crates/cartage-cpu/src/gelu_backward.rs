//! `Kernel::GeluBackward`: the exact GELU's input gradient `g·(Φ(x) + x·φ(x))`, element by
//! element in the compute type (f32 for the half types), rounded once on store.

use cartage_core::{DType, Device, Error, Result, TensorArg};

use crate::elem::{Float, Real};
use crate::map::map2_real;

/// `out = grad·(Φ(input) + input·φ(input))` for a kernel `launch` has checked.
pub fn gelu_backward(input: &TensorArg, grad: &TensorArg, out: &TensorArg) -> Result<()> {
    match input.dtype {
        DType::F32 => run::<f32>(input, grad, out),
        DType::F64 => run::<f64>(input, grad, out),
        DType::F16 => run::<half::f16>(input, grad, out),
        DType::BF16 => run::<half::bf16>(input, grad, out),
        dtype => {
            return Err(Error::unsupported(
                "gelu_backward",
                dtype,
                Device::cpu(),
                "the GELU's gradient is defined for float dtypes only",
            ));
        }
    }
    Ok(())
}

fn run<T: Real>(input: &TensorArg, grad: &TensorArg, out: &TensorArg) {
    let half = T::C::from_f64(0.5);
    let inv_sqrt2 = T::C::from_f64(std::f64::consts::FRAC_1_SQRT_2);
    let density = T::C::from_f64(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
    // SAFETY: launch checked the kernel; `T` is the operands' storage type.
    unsafe {
        map2_real::<T>(input, grad, out, |x, g| {
            let cdf = half * (T::C::ONE + (x * inv_sqrt2).erf());
            let pdf = density * (-(half * x * x)).exp();
            g * (cdf + x * pdf)
        })
    }
}
