//! The element-wise kernels: `Fill`, `Arange`, `Random`, `Cast`, `Copy`, `Binary`,
//! `Compare` and `Where`, each dispatched on its dtype to a monomorphised map from [`crate::map`].
//!
//! Every function here expects a kernel that `launch` has already checked (bounds, shapes,
//! dtypes, alignment: see [`crate::validate`]).

use cartage_core::random::{normal_unit, uniform_unit};
use cartage_core::{BinaryOp, CompareOp, DType, Device, Distribution, Error, Result, Scalar, TensorArg};

use crate::cast::CastTarget;
use crate::dispatch::{with_bits, with_float, with_storage};
use crate::elem::{Arith, Bool8, Float, Pod, Real, fmax, fmin};
use crate::map::{copy, fill as fill_map, generate, map1, map2, map2_real, map3};

fn no_kernel(op: &str, dtype: DType) -> Error {
    Error::unsupported(op, dtype, Device::cpu(), "the op is not defined for this dtype")
}

/// The value `value` takes when stored as `T` (of dtype `dtype`), as `Scalar::to_bytes` does:
/// a float converts straight to the target (saturating into integers), an integer goes through
/// f64 into floats and wraps into narrower integers.
fn scalar_as<T: CastTarget>(value: Scalar, dtype: DType) -> T {
    match value {
        Scalar::Float(v) => T::cast_from(v),
        Scalar::Int(i) if dtype.is_float() => T::cast_from(i as f64),
        Scalar::Int(i) => T::cast_from(i),
        Scalar::Bool(b) => T::cast_from(Bool8::new(b)),
    }
}

/// `Kernel::Fill`.
pub fn fill(out: &TensorArg, value: Scalar) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is `out`'s storage type.
    with_storage!(out.dtype, T => unsafe { fill_map::<T>(out, scalar_as::<T>(value, out.dtype)) });
    Ok(())
}

/// `Kernel::Arange`: `out[i] = start + i * step` in f64, then cast.
pub fn arange(out: &TensorArg, start: f64, step: f64) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is `out`'s storage type.
    with_storage!(out.dtype, T => unsafe { generate(out, |i| T::cast_from(start + i as f64 * step)) });
    Ok(())
}

/// `Kernel::Random`: element `i` draws Philox counter `offset + i`.
pub fn random(out: &TensorArg, distribution: Distribution, seed: u64, offset: u64) -> Result<()> {
    with_float!(out.dtype, T => {
        let counter = move |i: usize| offset.wrapping_add(i as u64);
        // SAFETY: launch checked the kernel; `T` is `out`'s storage type.
        unsafe {
            match distribution {
                Distribution::Uniform { low, high } => generate(out, |i| {
                    T::cast_from(low + (high - low) * uniform_unit(seed, counter(i)) as f64)
                }),
                Distribution::Normal { mean, std } => generate(out, |i| {
                    T::cast_from(mean + std * normal_unit(seed, counter(i)) as f64)
                }),
            }
        }
    }, else return Err(no_kernel("rand", out.dtype)));
    Ok(())
}

/// `Kernel::Cast`, with Rust `as` semantics.
pub fn cast(input: &TensorArg, out: &TensorArg) -> Result<()> {
    with_storage!(input.dtype, S => with_storage!(out.dtype, D => {
        // SAFETY: launch checked the kernel; `S`/`D` are the operands' storage types.
        unsafe { map1(input, out, |x: S| D::cast_from(x)) }
    }));
    Ok(())
}

/// `Kernel::Copy` (same dtype): moves elements as bits.
pub fn copy_kernel(input: &TensorArg, out: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` has the dtype's size.
    with_bits!(input.dtype.size_in_bytes(), T => unsafe { copy::<T>(input, out) }, else return Err(odd_size("copy")));
    Ok(())
}

fn odd_size(op: &'static str) -> Error {
    Error::invalid(op, "elements of other than 1, 2, 4 or 8 bytes")
}

/// `Kernel::Binary`.
pub fn binary(op: BinaryOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    match lhs.dtype {
        DType::F32 => binary_real::<f32>(op, lhs, rhs, out),
        DType::F64 => binary_real::<f64>(op, lhs, rhs, out),
        DType::F16 => binary_real::<half::f16>(op, lhs, rhs, out),
        DType::BF16 => binary_real::<half::bf16>(op, lhs, rhs, out),
        DType::I32 => binary_typed::<i32>(op, lhs, rhs, out),
        DType::I64 => binary_typed::<i64>(op, lhs, rhs, out),
        DType::U8 => binary_typed::<u8>(op, lhs, rhs, out),
        DType::Bool => binary_bool(op, lhs, rhs, out),
    }
}

#[inline]
fn binary_real<T: Real>(op: BinaryOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is the operands' storage type.
    unsafe {
        match op {
            BinaryOp::Add => map2_real::<T>(lhs, rhs, out, |a, b| a + b),
            BinaryOp::Sub => map2_real::<T>(lhs, rhs, out, |a, b| a - b),
            BinaryOp::Mul => map2_real::<T>(lhs, rhs, out, |a, b| a * b),
            BinaryOp::Div => map2_real::<T>(lhs, rhs, out, |a, b| a / b),
            BinaryOp::Pow => map2_real::<T>(lhs, rhs, out, Float::powf),
            BinaryOp::Maximum => map2_real::<T>(lhs, rhs, out, fmax),
            BinaryOp::Minimum => map2_real::<T>(lhs, rhs, out, fmin),
        }
    }
    Ok(())
}

#[inline]
fn binary_typed<T: Arith>(op: BinaryOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is the operands' storage type.
    unsafe {
        match op {
            BinaryOp::Add => map2(lhs, rhs, out, T::add),
            BinaryOp::Sub => map2(lhs, rhs, out, T::sub),
            BinaryOp::Mul => map2(lhs, rhs, out, T::mul),
            BinaryOp::Div => map2(lhs, rhs, out, T::div),
            BinaryOp::Pow => map2(lhs, rhs, out, T::pow),
            BinaryOp::Maximum => map2(lhs, rhs, out, T::maximum),
            BinaryOp::Minimum => map2(lhs, rhs, out, T::minimum),
        }
    }
    Ok(())
}

fn binary_bool(op: BinaryOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; bool is stored as `Bool8`.
    unsafe {
        match op {
            BinaryOp::Maximum => map2(lhs, rhs, out, |a: Bool8, b: Bool8| Bool8::new(a.get() | b.get())),
            BinaryOp::Minimum => map2(lhs, rhs, out, |a: Bool8, b: Bool8| Bool8::new(a.get() & b.get())),
            _ => return Err(no_kernel(op.name(), DType::Bool)),
        }
    }
    Ok(())
}

/// `Kernel::Compare`: IEEE comparisons for floats (NaN is unequal to everything).
pub fn compare(op: CompareOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    with_storage!(lhs.dtype, T => compare_typed::<T>(op, lhs, rhs, out));
    Ok(())
}

fn compare_typed<T: Pod>(op: CompareOp, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) {
    // SAFETY: launch checked the kernel; `T` is the compared operands' storage type, the output
    // is bool.
    unsafe {
        match op {
            CompareOp::Eq => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a == b)),
            CompareOp::Ne => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a != b)),
            CompareOp::Lt => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a < b)),
            CompareOp::Le => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a <= b)),
            CompareOp::Gt => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a > b)),
            CompareOp::Ge => map2(lhs, rhs, out, |a: T, b: T| Bool8::new(a >= b)),
        }
    }
}

/// `Kernel::Where`: moves elements as bits, chosen by a bool condition.
pub fn where_kernel(cond: &TensorArg, on_true: &TensorArg, on_false: &TensorArg, out: &TensorArg) -> Result<()> {
    with_bits!(out.dtype.size_in_bytes(), T => {
        // SAFETY: launch checked the kernel; `T` has the values' size, `cond` is bool.
        unsafe { map3(cond, on_true, on_false, out, |c: Bool8, a: T, b: T| if c.get() { a } else { b }) }
    }, else return Err(odd_size("where")));
    Ok(())
}
