//! Element-wise ops: unary functions, binary arithmetic with numpy broadcasting, arithmetic
//! with a scalar (filled on the device, broadcast with stride 0), comparisons to bool and
//! `where`. Operands must share device and dtype; nothing is promoted silently.

use cartage_core::{BinaryOp, CompareOp, DType, Kernel, Op, Result, Scalar, Site, UnaryOp, broadcast_shapes};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};

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
        /// `self + rhs`, broadcasting (numpy rules). Both operands must have the same dtype and
        /// device: nothing is promoted or moved implicitly.
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu)?;
        /// let row = Tensor::new([10.0f32, 20.0], &cpu)?;
        /// assert_eq!(x.add(&row)?.to_vec::<f32>()?, vec![11.0, 22.0, 13.0, 24.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        add => BinaryOp::Add;
        /// `self - rhs`, broadcasting.
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([5i64, 7], &cpu)?;
        /// assert_eq!(x.sub(&Tensor::new([1i64, 2], &cpu)?)?.to_vec::<i64>()?, vec![4, 5]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        sub => BinaryOp::Sub;
        /// `self * rhs`, broadcasting.
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.5f32, -2.0], &cpu)?;
        /// let two = Tensor::full(&[], 2.0, DType::F32, &cpu)?; // shape [] broadcasts to any shape
        /// assert_eq!(x.mul(&two)?.to_vec::<f32>()?, vec![3.0, -4.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        mul => BinaryOp::Mul;
        /// `self / rhs`, broadcasting (integers truncate toward zero; `x / 0` is 0 for integers).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([7i32, -7, 1], &cpu)?;
        /// let y = x.div(&Tensor::new([2i32, 2, 0], &cpu)?)?;
        /// assert_eq!(y.to_vec::<i32>()?, vec![3, -3, 0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        div => BinaryOp::Div;
        /// `self ^ rhs`, broadcasting.
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([2.0f32, 3.0], &cpu)?;
        /// assert_eq!(x.pow(&Tensor::new([3.0f32, 2.0], &cpu)?)?.to_vec::<f32>()?, vec![8.0, 9.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        pow => BinaryOp::Pow;
        /// Element-wise maximum, broadcasting (logical or for bool).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 5.0], &cpu)?;
        /// assert_eq!(x.maximum(&Tensor::new([3.0f32, 2.0], &cpu)?)?.to_vec::<f32>()?, vec![3.0, 5.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        maximum => BinaryOp::Maximum;
        /// Element-wise minimum, broadcasting (logical and for bool).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 5.0], &cpu)?;
        /// assert_eq!(x.minimum(&Tensor::new([3.0f32, 2.0], &cpu)?)?.to_vec::<f32>()?, vec![1.0, 2.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        minimum => BinaryOp::Minimum;
    }

    scalar_methods! {
        /// `self + value`. The value is converted to this tensor's dtype (`as` semantics), filled
        /// on the device and broadcast.
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0], &cpu)?;
        /// assert_eq!(x.add_scalar(0.5)?.to_vec::<f32>()?, vec![1.5, 2.5]);
        /// let n = Tensor::new([1i32, 2], &cpu)?;
        /// assert_eq!(n.add_scalar(1.7)?.to_vec::<i32>()?, vec![2, 3]); // 1.7 as i32 is 1
        /// # Ok::<(), cartage::Error>(())
        /// ```
        add_scalar => BinaryOp::Add;
        /// `self - value` (converted to this tensor's dtype).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0], &cpu)?;
        /// assert_eq!(x.sub_scalar(1.0)?.to_vec::<f32>()?, vec![0.0, 1.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        sub_scalar => BinaryOp::Sub;
        /// `self * value` (converted to this tensor's dtype).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1i64, -2], &cpu)?;
        /// assert_eq!(x.mul_scalar(3)?.to_vec::<i64>()?, vec![3, -6]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        mul_scalar => BinaryOp::Mul;
        /// `self / value` (converted to this tensor's dtype; integers truncate).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 3.0], &cpu)?;
        /// assert_eq!(x.div_scalar(2.0)?.to_vec::<f32>()?, vec![0.5, 1.5]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        div_scalar => BinaryOp::Div;
        /// `self ^ value` (converted to this tensor's dtype).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([3.0f32, -2.0], &cpu)?;
        /// assert_eq!(x.pow_scalar(2.0)?.to_vec::<f32>()?, vec![9.0, 4.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        pow_scalar => BinaryOp::Pow;
    }

    compare_methods! {
        /// `self == rhs` as bool, broadcasting (operands of one dtype).
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1i32, 2, 3], &cpu)?;
        /// let y = x.eq(&Tensor::new([1i32, 0, 3], &cpu)?)?;
        /// assert_eq!((y.dtype(), y.to_vec::<bool>()?), (DType::Bool, vec![true, false, true]));
        /// # Ok::<(), cartage::Error>(())
        /// ```
        eq => CompareOp::Eq;
        /// `self != rhs` as bool, broadcasting.
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1i32, 2, 3], &cpu)?;
        /// assert_eq!(x.ne(&Tensor::new([1i32, 0, 3], &cpu)?)?.to_vec::<bool>()?, vec![false, true, false]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        ne => CompareOp::Ne;
        /// `self < rhs` as bool, broadcasting.
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0, 3.0], &cpu)?;
        /// let two = Tensor::full(&[], 2.0, DType::F32, &cpu)?;
        /// assert_eq!(x.lt(&two)?.to_vec::<bool>()?, vec![true, false, false]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        lt => CompareOp::Lt;
        /// `self <= rhs` as bool, broadcasting.
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0, 3.0], &cpu)?;
        /// let two = Tensor::full(&[], 2.0, DType::F32, &cpu)?;
        /// assert_eq!(x.le(&two)?.to_vec::<bool>()?, vec![true, true, false]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        le => CompareOp::Le;
        /// `self > rhs` as bool, broadcasting.
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0, 3.0], &cpu)?;
        /// let two = Tensor::full(&[], 2.0, DType::F32, &cpu)?;
        /// assert_eq!(x.gt(&two)?.to_vec::<bool>()?, vec![false, false, true]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        gt => CompareOp::Gt;
        /// `self >= rhs` as bool, broadcasting.
        ///
        /// ```
        /// use cartage::{DType, Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1.0f32, 2.0, 3.0], &cpu)?;
        /// let two = Tensor::full(&[], 2.0, DType::F32, &cpu)?;
        /// assert_eq!(x.ge(&two)?.to_vec::<bool>()?, vec![false, true, true]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        ge => CompareOp::Ge;
    }

    unary_methods! {
        /// `-self` (integers too).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([1i32, -2], &cpu)?;
        /// assert_eq!(x.neg()?.to_vec::<i32>()?, vec![-1, 2]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        neg => UnaryOp::Neg;
        /// `|self|` (integers too).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([-1.5f32, 2.0], &cpu)?;
        /// assert_eq!(x.abs()?.to_vec::<f32>()?, vec![1.5, 2.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        abs => UnaryOp::Abs;
        /// `e^self` (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let y = Tensor::new([0.0f32, 1.0], &cpu)?.exp()?.to_vec::<f32>()?;
        /// assert_eq!(y[0], 1.0);
        /// assert!((y[1] - std::f32::consts::E).abs() < 1e-6);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        exp => UnaryOp::Exp;
        /// Natural logarithm (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let y = Tensor::new([1.0f32, std::f32::consts::E], &cpu)?.log()?.to_vec::<f32>()?;
        /// assert_eq!(y[0], 0.0);
        /// assert!((y[1] - 1.0).abs() < 1e-6);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        log => UnaryOp::Log;
        /// Square root (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([4.0f32, 9.0], &cpu)?;
        /// assert_eq!(x.sqrt()?.to_vec::<f32>()?, vec![2.0, 3.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        sqrt => UnaryOp::Sqrt;
        /// `max(self, 0)` (integers too).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let x = Tensor::new([-1.0f32, 0.0, 2.0], &cpu)?;
        /// assert_eq!(x.relu()?.to_vec::<f32>()?, vec![0.0, 0.0, 2.0]);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        relu => UnaryOp::Relu;
        /// Hyperbolic tangent (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let y = Tensor::new([0.0f32, 1.0], &cpu)?.tanh()?.to_vec::<f32>()?;
        /// assert_eq!(y[0], 0.0);
        /// assert!((y[1] - 0.7615942).abs() < 1e-6);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        tanh => UnaryOp::Tanh;
        /// `1 / (1 + e^-self)` (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let y = Tensor::new([0.0f32, 2.0], &cpu)?.sigmoid()?.to_vec::<f32>()?;
        /// assert_eq!(y[0], 0.5);
        /// assert!((y[1] - 0.8807971).abs() < 1e-6);
        /// # Ok::<(), cartage::Error>(())
        /// ```
        sigmoid => UnaryOp::Sigmoid;
        /// GELU, exact (erf) form: `x * Φ(x)` (float dtypes).
        ///
        /// ```
        /// use cartage::{Device, Tensor};
        /// let cpu = Device::cpu();
        /// let y = Tensor::new([0.0f32, 1.0], &cpu)?.gelu()?.to_vec::<f32>()?;
        /// assert_eq!(y[0], 0.0);
        /// assert!((y[1] - 0.8413447).abs() < 1e-6);
        /// # Ok::<(), cartage::Error>(())
        /// ```
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
        if self.dtype != rhs.dtype
            && let Some((a, b)) = crate::autocast::promoted(self, rhs)?
        {
            return a.binary(op, &b, site);
        }
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
        Ok(graph::record(out, name, &[self, rhs], |out| {
            formulas::elementwise::binary(op, self, rhs, out)
        }))
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
        Ok(graph::record_constant(out, name, &[self, rhs]))
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
        Ok(graph::record(out, op.name(), &[self], |out| {
            formulas::elementwise::unary(op, self, out)
        }))
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
        Ok(graph::record(out, "where", &[on_true, on_false], |_| {
            formulas::elementwise::where_cond(cond, on_true, on_false)
        }))
    }
}
