//! `ReduceOp::ArgMax` / `ArgMin` over one dimension: the first index of the extreme value, as
//! i64. NaN counts as the extreme (the first NaN wins), matching max/min's NaN propagation.

use cartage_core::{ReduceOp, Result, TensorArg};

use crate::dispatch::with_storage;
use crate::elem::Pod;
use crate::reduce::{Reduction, Walks, for_each_output};

/// NaN test for the element types (false for integers and bool).
pub trait MaybeNan: Pod {
    /// True for a float NaN.
    fn is_nan_value(self) -> bool;
}

macro_rules! never_nan {
    ($($t:ty),*) => {$(
        impl MaybeNan for $t {
            #[inline(always)]
            fn is_nan_value(self) -> bool {
                false
            }
        }
    )*};
}
never_nan!(i32, i64, u8, crate::elem::Bool8);

macro_rules! float_nan {
    ($($t:ty),*) => {$(
        impl MaybeNan for $t {
            #[inline(always)]
            fn is_nan_value(self) -> bool {
                self.is_nan()
            }
        }
    )*};
}
float_nan!(f32, f64, half::f16, half::bf16);

#[inline(always)]
fn replaces<T: MaybeNan, const MAX: bool>(x: T, best: T) -> bool {
    if best.is_nan_value() {
        false
    } else if x.is_nan_value() {
        true
    } else if MAX {
        x > best
    } else {
        x < best
    }
}

fn arg_of<T: MaybeNan, const MAX: bool>(r: &Reduction<T>, offset: usize) -> i64 {
    let mut best: Option<T> = None;
    let (mut index, mut best_index) = (0i64, 0i64);
    r.for_each(offset, |x| {
        if best.is_none_or(|b| replaces::<T, MAX>(x, b)) {
            best = Some(x);
            best_index = index;
        }
        index += 1;
    });
    best_index
}

/// `Kernel::Reduce` with ArgMax or ArgMin over `dim`.
pub fn arg_reduce(op: ReduceOp, input: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let walks = Walks::new(input, &[dim], out);
    with_storage!(input.dtype, T => {
        // SAFETY: launch checked the kernel; the input is `T`, the output i64.
        unsafe {
            if op == ReduceOp::ArgMax {
                for_each_output(input, &walks, out, |r: &Reduction<T>, at, _| arg_of::<T, true>(r, at))
            } else {
                for_each_output(input, &walks, out, |r: &Reduction<T>, at, _| arg_of::<T, false>(r, at))
            }
        }
    });
    Ok(())
}
