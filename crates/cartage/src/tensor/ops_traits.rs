//! `std::ops` operators on tensors and scalars, each returning `Result<Tensor>`.
//!
//! `+ - * /` take `&Tensor` or `Tensor` on either side; a scalar on the right (anything
//! `Into<Scalar>`: `f64`, `f32`, `i64`, `i32`, converted to the tensor's dtype; an unsuffixed
//! literal needs no annotation) or on the left (`f64` or `i64`, so that `1.0 - &x` and `2 * &x`
//! infer; write `f64::from(v)` for an `f32` value); and a
//! `Result<Tensor>` on the left of a tensor, so that chains read with one `?`:
//! `((&a + &b) * &c)?`. A `Result` on the right needs its own `?`: `(&a * (&b + &c)?)?`.
//! Unary `-` works on `&Tensor` and `Tensor`. Every operator is the method of the same name
//! (`add`, `mul_scalar`, …): same checks, same errors, same call-site tracking.
//!
//! ```
//! use cartage::prelude::*;
//! # fn main() -> cartage::Result<()> {
//! let cpu = Device::cpu();
//! let a = Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?;
//! let b = Tensor::from_slice(&[10.0f32, 20.0], &[2], &cpu)?;
//! assert_eq!((&a + &b)?.to_vec::<f32>()?, vec![11.0, 22.0]);
//! assert_eq!((&a * 2.0)?.to_vec::<f32>()?, vec![2.0, 4.0]);
//! assert_eq!((1.0 - &a)?.to_vec::<f32>()?, vec![0.0, -1.0]);
//! assert_eq!(((&a + &b) / &a)?.to_vec::<f32>()?, vec![11.0, 11.0]);
//! assert_eq!((-&a)?.to_vec::<f32>()?, vec![-1.0, -2.0]);
//! # Ok(())
//! # }
//! ```

use std::ops::{Add, Div, Mul, Neg, Sub};

use cartage_core::{BinaryOp, Result, Scalar};

use super::{Tensor, caller};

/// `tensor op tensor` for every pairing of `&Tensor` and `Tensor`, and `Result<Tensor>` on the
/// left (a `Result` on the right would overlap with the generic scalar operand).
macro_rules! tensor_tensor {
    ($($trait:ident $method:ident => $op:expr;)*) => {$(
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self.binary($op, rhs, caller())
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.binary($op, &rhs, caller())
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self.binary($op, rhs, caller())
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.binary($op, &rhs, caller())
            }
        }
        impl $trait<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self?.binary($op, rhs, caller())
            }
        }
        impl $trait<Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self?.binary($op, &rhs, caller())
            }
        }
    )*};
}

/// `tensor op scalar`, generic over the scalar (so an unsuffixed literal such as `2.0` or `3`
/// needs no annotation: it falls back to `f64` or `i32`, then converts to the tensor's dtype).
macro_rules! tensor_scalar {
    ($($trait:ident $method:ident => $op:expr;)*) => {$(
        impl<S: Into<Scalar>> $trait<S> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: S) -> Result<Tensor> {
                self.with_scalar($op, rhs.into(), caller())
            }
        }
        impl<S: Into<Scalar>> $trait<S> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: S) -> Result<Tensor> {
                self.with_scalar($op, rhs.into(), caller())
            }
        }
    )*};
}

/// `scalar op tensor` for `f64` and `i64` only: one float and one integer type, so that an
/// unsuffixed literal on the left (`1.0 - &x`, `2 * &x`) has exactly one impl to pick.
macro_rules! scalar_tensor {
    ($($scalar:ty),*) => {$(
        scalar_tensor!(@one $scalar, Add add => BinaryOp::Add);
        scalar_tensor!(@one $scalar, Sub sub => BinaryOp::Sub);
        scalar_tensor!(@one $scalar, Mul mul => BinaryOp::Mul);
        scalar_tensor!(@one $scalar, Div div => BinaryOp::Div);
    )*};
    (@one $scalar:ty, $trait:ident $method:ident => $op:expr) => {
        impl $trait<&Tensor> for $scalar {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                scalar_first($op, Scalar::from(self), rhs)
            }
        }
        impl $trait<Tensor> for $scalar {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                scalar_first($op, Scalar::from(self), &rhs)
            }
        }
    };
}

tensor_tensor! {
    Add add => BinaryOp::Add;
    Sub sub => BinaryOp::Sub;
    Mul mul => BinaryOp::Mul;
    Div div => BinaryOp::Div;
}

tensor_scalar! {
    Add add => BinaryOp::Add;
    Sub sub => BinaryOp::Sub;
    Mul mul => BinaryOp::Mul;
    Div div => BinaryOp::Div;
}

scalar_tensor!(f64, i64);

/// `value op tensor`: the value is filled on the device as a 0-d tensor of the tensor's dtype
/// and broadcast.
#[track_caller]
fn scalar_first(op: BinaryOp, value: Scalar, rhs: &Tensor) -> Result<Tensor> {
    let site = caller();
    let lhs = rhs.scalar_like(value, site)?;
    lhs.binary(op, rhs, site)
}

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
