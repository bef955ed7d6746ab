//! `Kernel::Unary`: every [`UnaryOp`] for the float dtypes and the integer-defined ones for
//! i32, i64 and u8.
//!
//! f32, f16 and bf16 compute in f32. Their dense views run in blocks of f32 compiled for the
//! widest vector instructions available ([`crate::fast_math::simd`]), so the branch-free
//! functions vectorise: the rounding ops, and the transcendental ones (exp, log, tanh, sigmoid,
//! silu, erf, gelu, softplus), which come from [`crate::fast_math::vmath`] in f32 (within 2 ulp).
//! f64 keeps the standard library's and libm's functions. Strided views read in place through
//! [`crate::map`], with the very same functions, so both paths give the same bits.

use cartage_core::{DType, Device, Error, Result, TensorArg, UnaryOp};

use crate::elem::{Arith, Float, Real, float_fn};
use crate::fast_math::simd;
use crate::map::{base, map1, map1_real};
use crate::strided::{PARALLEL_MIN_ELEMENTS, for_ranges};

mod transcendental;

use transcendental::Transcendental;

fn no_kernel(op: &str, dtype: DType) -> Error {
    Error::unsupported(op, dtype, Device::cpu(), "the op is not defined for this dtype")
}

/// An `inline(always)` closure calling the function `$f` on an `$F` (see [`with_op`]).
macro_rules! inlined {
    ($F:ty, $($f:tt)+) => {{
        #[inline(always)]
        |x: $F| $($f)+(x)
    }};
}

/// Evaluate `$body` with `$f` bound to the compute-type function of `$op` (one arm per op, so
/// each map is monomorphised for its function and inlines it). Each is an `inline(always)`
/// closure, never a bare function item: an item's `Fn::call` shim may stay out of line,
/// compiled without the wide instructions and called once per element.
macro_rules! with_op {
    ($op:expr, $F:ty, $f:ident => $body:expr) => {
        match $op {
            UnaryOp::Neg => {
                let $f = {
                    #[inline(always)]
                    |x: $F| -x
                };
                $body
            }
            UnaryOp::Abs => {
                let $f = inlined!($F, <$F as Float>::abs);
                $body
            }
            UnaryOp::Relu => {
                let $f = inlined!($F, float_fn::relu::<$F>);
                $body
            }
            UnaryOp::Exp => {
                let $f = inlined!($F, <$F as Transcendental>::exp);
                $body
            }
            UnaryOp::Log => {
                let $f = inlined!($F, <$F as Transcendental>::ln);
                $body
            }
            UnaryOp::Sqrt => {
                let $f = inlined!($F, <$F as Float>::sqrt);
                $body
            }
            UnaryOp::Tanh => {
                let $f = inlined!($F, <$F as Transcendental>::tanh);
                $body
            }
            UnaryOp::Sigmoid => {
                let $f = inlined!($F, <$F as Transcendental>::sigmoid);
                $body
            }
            UnaryOp::Gelu => {
                let $f = inlined!($F, <$F as Transcendental>::gelu);
                $body
            }
            UnaryOp::Sin => {
                let $f = inlined!($F, <$F as Float>::sin);
                $body
            }
            UnaryOp::Cos => {
                let $f = inlined!($F, <$F as Float>::cos);
                $body
            }
            UnaryOp::Floor => {
                let $f = inlined!($F, <$F as Float>::floor);
                $body
            }
            UnaryOp::Ceil => {
                let $f = inlined!($F, <$F as Float>::ceil);
                $body
            }
            UnaryOp::Round => {
                let $f = inlined!($F, <$F as Float>::round_even);
                $body
            }
            UnaryOp::Trunc => {
                let $f = inlined!($F, <$F as Float>::trunc);
                $body
            }
            UnaryOp::Sign => {
                let $f = inlined!($F, float_fn::sign::<$F>);
                $body
            }
            UnaryOp::Rsqrt => {
                let $f = {
                    #[inline(always)]
                    |x: $F| <$F as Float>::ONE / x.sqrt()
                };
                $body
            }
            UnaryOp::Recip => {
                let $f = {
                    #[inline(always)]
                    |x: $F| <$F as Float>::ONE / x
                };
                $body
            }
            UnaryOp::Square => {
                let $f = {
                    #[inline(always)]
                    |x: $F| x * x
                };
                $body
            }
            UnaryOp::Erf => {
                let $f = inlined!($F, <$F as Transcendental>::erf);
                $body
            }
            UnaryOp::Log1p => {
                let $f = inlined!($F, <$F as Float>::ln_1p);
                $body
            }
            UnaryOp::Expm1 => {
                let $f = inlined!($F, <$F as Float>::exp_m1);
                $body
            }
            UnaryOp::Silu => {
                let $f = inlined!($F, <$F as Transcendental>::silu);
                $body
            }
            UnaryOp::Softplus => {
                let $f = inlined!($F, <$F as Transcendental>::softplus);
                $body
            }
        }
    };
}

/// `Kernel::Unary`.
pub fn unary(op: UnaryOp, input: &TensorArg, out: &TensorArg) -> Result<()> {
    match input.dtype {
        DType::F32 => unary_f32::<f32>(op, input, out),
        DType::F16 => unary_f32::<half::f16>(op, input, out),
        DType::BF16 => unary_f32::<half::bf16>(op, input, out),
        DType::F64 => {
            // SAFETY: launch checked the kernel; both operands are f64.
            unsafe { with_op!(op, f64, f => map1_real::<f64>(input, out, f)) };
            Ok(())
        }
        DType::I32 => unary_int::<i32>(op, input, out),
        DType::I64 => unary_int::<i64>(op, input, out),
        DType::U8 => unary_int::<u8>(op, input, out),
        DType::Bool => Err(no_kernel(op.name(), DType::Bool)),
    }
}

/// f32 compute: dense views through [`dense_f32`], others through [`map1_real`].
fn unary_f32<T: Real<C = f32>>(op: UnaryOp, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let dense = input.layout.is_contiguous() && out.layout.is_contiguous();
    // SAFETY: launch checked the kernel; `T` is both operands' storage type; `dense_f32` gets
    // contiguous views only.
    unsafe {
        if dense {
            with_op!(op, f32, f => dense_f32::<T>(input, out, f))
        } else {
            with_op!(op, f32, f => map1_real::<T>(input, out, f))
        }
    }
    Ok(())
}

/// Elements per block of the dense f32 path (4 KiB of f32: stays in L1).
const BLOCK: usize = 1024;

/// `out[i] = store(f(input[i].load()))` over dense views, in blocks of f32 compiled for the
/// widest vector instructions; large views spread over rayon.
///
/// # Safety
/// launch checked the kernel; `T` is both operands' storage type; both are contiguous (the
/// output may be the input itself, never a partial overlap: `Kernel::validate`).
unsafe fn dense_f32<T: Real<C = f32>>(input: &TensorArg, out: &TensorArg, f: impl Fn(f32) -> f32 + Sync + Copy) {
    let (i, o) = (base::<T>(input), base::<T>(out));
    let numel = out.layout.numel();
    // f32 storage needs no conversion: one pass from input to output, no staging block.
    let direct = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let range = |s: usize, e: usize| {
        simd(
            #[inline(always)]
            || {
                if direct {
                    let (src, dst) = (i.0 as *const f32, o.0 as *mut f32);
                    // SAFETY: `T` is f32; positions `s..e` of both dense views lie inside their
                    // buffers, which are the same memory (in place) or do not overlap at all
                    // (`Kernel::validate`), so the slices alias only when they are one slice.
                    unsafe {
                        if std::ptr::eq(src, dst) {
                            map_in_place(std::slice::from_raw_parts_mut(dst.add(s), e - s), f);
                        } else {
                            let from = std::slice::from_raw_parts(src.add(s), e - s);
                            map_into(from, std::slice::from_raw_parts_mut(dst.add(s), e - s), f);
                        }
                    }
                    return;
                }
                let mut buf = [0f32; BLOCK];
                let mut start = s;
                while start < e {
                    let len = BLOCK.min(e - start);
                    let x = &mut buf[..len];
                    // SAFETY: positions `start..start + len` of dense views lie inside their
                    // buffers; the input block is read completely before the output block (which
                    // may be the same memory) is borrowed for writing.
                    unsafe {
                        T::widen(std::slice::from_raw_parts(i.add(start), len), x);
                        map_in_place(x, f);
                        T::narrow(x, std::slice::from_raw_parts_mut(o.add(start), len));
                    }
                    start += len;
                }
            },
        )
    };
    if numel >= PARALLEL_MIN_ELEMENTS {
        for_ranges(numel, range);
    } else if numel > 0 {
        range(0, numel);
    }
}

/// `x[k] = f(x[k])`: one loop over a slice, which vectorises (the slice cannot alias anything).
#[inline(always)]
fn map_in_place(x: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in x {
        *v = f(*v);
    }
}

/// `to[k] = f(from[k])` over two slices that do not overlap, which vectorises without the
/// run-time overlap check (and scalar fallback) raw pointers would need.
#[inline(always)]
fn map_into(from: &[f32], to: &mut [f32], f: impl Fn(f32) -> f32) {
    for (t, &x) in to.iter_mut().zip(from) {
        *t = f(x);
    }
}

/// The integer unary functions beyond [`Arith`].
trait IntUnary: Arith {
    /// -1, 0 or 1.
    fn sign(self) -> Self;
    /// `x · x`, wrapping.
    fn square(self) -> Self;
}

macro_rules! int_unary {
    ($($t:ty),*) => {$(
        impl IntUnary for $t {
            #[inline(always)]
            fn sign(self) -> Self {
                self.signum()
            }
            #[inline(always)]
            fn square(self) -> Self {
                self.wrapping_mul(self)
            }
        }
    )*};
}
int_unary!(i32, i64);

impl IntUnary for u8 {
    #[inline(always)]
    fn sign(self) -> Self {
        (self != 0) as u8
    }
    #[inline(always)]
    fn square(self) -> Self {
        self.wrapping_mul(self)
    }
}

fn unary_int<T: IntUnary>(op: UnaryOp, input: &TensorArg, out: &TensorArg) -> Result<()> {
    // SAFETY: launch checked the kernel; `T` is the operands' storage type.
    unsafe {
        match op {
            UnaryOp::Neg => map1(input, out, T::neg),
            UnaryOp::Abs => map1(input, out, T::abs),
            UnaryOp::Relu => map1(input, out, T::relu),
            UnaryOp::Sign => map1(input, out, T::sign),
            UnaryOp::Square => map1(input, out, T::square),
            // The rounding ops are the identity on integers.
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => map1(input, out, |x: T| x),
            _ => return Err(no_kernel(op.name(), input.dtype)),
        }
    }
    Ok(())
}
