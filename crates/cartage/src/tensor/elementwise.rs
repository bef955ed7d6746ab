//! Element-wise ops: unary functions, binary arithmetic with numpy broadcasting, arithmetic
//! with a scalar (filled on the device, broadcast with stride 0), comparisons to bool and
//! `where`. Operands must share device and dtype; nothing is promoted silently.

use cartage_core::{BinaryOp, CompareOp, DType, Kernel, Op, Result, Scalar, Site, UnaryOp, broadcast_shapes};

use super::{Tensor, caller, check};

const ARITHMETIC_DTYPES: &str = "a numeric dtype; bool takes part only in maximum/minimum (or/and) and comparisons";
const UNARY_DTYPES: &str =
    "a float dtype (neg, abs, relu, sign, square, floor, ceil, round and trunc also take integers)";

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
            self.binary($op, rhs, caller())
        }
    )*};
}

macro_rules! scalar_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self, value: impl Into<Scalar>) -> Result<Tensor> {
            let site = caller();
            let scalar = self.scalar_like(value.into(), site)?;
            self.binary($op, &scalar, site)
        }
    )*};
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
            self.compare($op, rhs, caller())
        }
    )*};
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self) -> Result<Tensor> {
            self.unary($op, caller())
        }
    )*};
}

impl Tensor {
    binary_methods! {
        /// `self + rhs`, broadcasting.
        add => BinaryOp::Add;
        /// `self - rhs`, broadcasting.
        sub => BinaryOp::Sub;
        /// `self * rhs`, broadcasting.
        mul => BinaryOp::Mul;
        /// `self / rhs`, broadcasting (integers truncate; `x / 0` is 0 for integers).
        div => BinaryOp::Div;
        /// `self ^ rhs`, broadcasting.
        pow => BinaryOp::Pow;
        /// Element-wise maximum, broadcasting (logical or for bool).
        maximum => BinaryOp::Maximum;
        /// Element-wise minimum, broadcasting (logical and for bool).
        minimum => BinaryOp::Minimum;
    }

    scalar_methods! {
        /// `self + value` (the value is converted to this tensor's dtype).
        add_scalar => BinaryOp::Add;
        /// `self - value`.
        sub_scalar => BinaryOp::Sub;
        /// `self * value`.
        mul_scalar => BinaryOp::Mul;
        /// `self / value`.
        div_scalar => BinaryOp::Div;
        /// `self ^ value`.
        pow_scalar => BinaryOp::Pow;
    }

    compare_methods! {
        /// `self == rhs` as bool, broadcasting.
        eq => CompareOp::Eq;
        /// `self != rhs` as bool, broadcasting.
        ne => CompareOp::Ne;
        /// `self < rhs` as bool, broadcasting.
        lt => CompareOp::Lt;
        /// `self <= rhs` as bool, broadcasting.
        le => CompareOp::Le;
        /// `self > rhs` as bool, broadcasting.
        gt => CompareOp::Gt;
        /// `self >= rhs` as bool, broadcasting.
        ge => CompareOp::Ge;
    }

    unary_methods! {
        /// `-self`.
        neg => UnaryOp::Neg;
        /// `|self|`.
        abs => UnaryOp::Abs;
        /// `e^self`.
        exp => UnaryOp::Exp;
        /// Natural logarithm.
        log => UnaryOp::Log;
        /// Square root.
        sqrt => UnaryOp::Sqrt;
        /// `max(self, 0)`.
        relu => UnaryOp::Relu;
        /// Hyperbolic tangent.
        tanh => UnaryOp::Tanh;
        /// `1 / (1 + e^-self)`.
        sigmoid => UnaryOp::Sigmoid;
        /// GELU, exact (erf) form.
        gelu => UnaryOp::Gelu;
    }

    /// `cond ? on_true : on_false` element-wise (PyTorch's `torch.where(cond, a, b)`, which
    /// returns a new tensor); `cond` is bool, all three broadcast together.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let cpu = Device::cpu();
    /// let x = Tensor::from_slice(&[-1.0f32, 2.0, -3.0], &[3], &cpu)?;
    /// let zero = Tensor::zeros(&[], DType::F32, &cpu)?;
    /// let positive = Tensor::where_cond(&x.gt(&zero)?, &x, &zero)?;
    /// assert_eq!(positive.to_vec::<f32>()?, vec![0.0, 2.0, 0.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn where_cond(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        Tensor::where_at(cond, on_true, on_false, caller())
    }

    pub(super) fn binary(&self, op: BinaryOp, rhs: &Tensor, site: Site) -> Result<Tensor> {
        let name = op.name();
        check::same_device_and_dtype(name, self, rhs)?;
        check::defined_for(name, Op::Binary(op), self.dtype, ARITHMETIC_DTYPES)?;
        // Built in place (no intermediate tuple of operands): this is the tiny-op path.
        let out;
        let kernel = if self.shape() == rhs.shape() {
            out = self.alloc_like(self.shape(), self.dtype, site)?;
            Kernel::Binary {
                op,
                lhs: self.as_arg(),
                rhs: rhs.as_arg(),
                out: out.as_arg(),
            }
        } else {
            let (lhs_layout, rhs_layout, shape) = check::broadcast_pair(name, self, rhs)?;
            out = self.alloc_like(&shape, self.dtype, site)?;
            Kernel::Binary {
                op,
                lhs: self.arg_with(lhs_layout),
                rhs: rhs.arg_with(rhs_layout),
                out: out.as_arg(),
            }
        };
        out.launch(&kernel, &[self, rhs], out.numel())?;
        Ok(out)
    }

    pub(super) fn compare(&self, op: CompareOp, rhs: &Tensor, site: Site) -> Result<Tensor> {
        let name = op.name();
        check::same_device_and_dtype(name, self, rhs)?;
        let (lhs_layout, rhs_layout, shape) = check::broadcast_pair(name, self, rhs)?;
        let out = self.alloc_like(&shape, DType::Bool, site)?;
        let kernel = Kernel::Compare {
            op,
            lhs: self.arg_with(lhs_layout),
            rhs: rhs.arg_with(rhs_layout),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self, rhs], out.numel())?;
        Ok(out)
    }

    pub(super) fn unary(&self, op: UnaryOp, site: Site) -> Result<Tensor> {
        check::defined_for(op.name(), Op::Unary(op), self.dtype, UNARY_DTYPES)?;
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Unary {
            op,
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        Ok(out)
    }

    pub(super) fn where_at(cond: &Tensor, on_true: &Tensor, on_false: &Tensor, site: Site) -> Result<Tensor> {
        check::same_device("where", cond, on_true)?;
        check::same_device("where", on_true, on_false)?;
        if cond.dtype != DType::Bool {
            return Err(cartage_core::Error::WrongDType {
                op: "where",
                dtype: cond.dtype,
                expected: "a bool condition; build it with a comparison such as `x.gt(&y)`",
            });
        }
        check::same_dtype("where", on_true, on_false)?;
        let rename = |e| check::rename(e, "where");
        let shape = broadcast_shapes(cond.shape(), on_true.shape()).map_err(rename)?;
        let shape = broadcast_shapes(&shape, on_false.shape()).map_err(rename)?;
        let cond_layout = cond.layout.broadcast_to(&shape).map_err(rename)?;
        let true_layout = on_true.layout.broadcast_to(&shape).map_err(rename)?;
        let false_layout = on_false.layout.broadcast_to(&shape).map_err(rename)?;
        let out = on_true.alloc_like(&shape, on_true.dtype, site)?;
        let kernel = Kernel::Where {
            cond: cond.arg_with(cond_layout),
            on_true: on_true.arg_with(true_layout),
            on_false: on_false.arg_with(false_layout),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[cond, on_true, on_false], out.numel())?;
        Ok(out)
    }
}
