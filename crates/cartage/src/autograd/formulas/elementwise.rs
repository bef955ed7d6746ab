//! Derivatives of element-wise ops: unary functions, binary arithmetic with broadcasting,
//! `where` and casts.

use cartage_core::{BinaryOp, DType, Device, UnaryOp};

use super::{Meta, sum_to, when, zero_like};
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The backward of `out = op(x)`. Saves `x` or `out`, whichever the derivative reads.
pub(crate) fn unary(op: UnaryOp, x: &Tensor, out: &Tensor) -> (BackwardFn, Saved) {
    use UnaryOp as U;
    let (x, y) = (x.detach(), out.detach());
    match op {
        U::Neg => saving(keep(&[]), |g, _| Ok(vec![Some(g.neg()?)])),
        U::Floor | U::Ceil | U::Round | U::Trunc | U::Sign => saving(keep(&[]), |g, _| Ok(vec![Some(g.zeros_like()?)])),
        U::Exp => saving(keep(&[&y]), move |g, _| Ok(vec![Some(g.mul(&y)?)])),
        U::Expm1 => saving(keep(&[&y]), move |g, _| Ok(vec![Some(g.mul(&y.add_scalar(1.0)?)?)])),
        U::Sqrt => saving(keep(&[&y]), move |g, _| Ok(vec![Some(g.div(&y.mul_scalar(2.0)?)?)])),
        U::Rsqrt => saving(keep(&[&y]), move |g, _| {
            // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y³
            Ok(vec![Some(g.mul(&y.mul(&y)?.mul(&y)?)?.mul_scalar(-0.5)?)])
        }),
        U::Recip => saving(keep(&[&y]), move |g, _| Ok(vec![Some(g.mul(&y.mul(&y)?)?.neg()?)])),
        U::Tanh => saving(keep(&[&y]), move |g, _| {
            let one_minus = y.mul(&y)?.neg()?.add_scalar(1.0)?;
            Ok(vec![Some(g.mul(&one_minus)?)])
        }),
        U::Sigmoid => saving(keep(&[&y]), move |g, _| {
            let slope = y.mul(&y.neg()?.add_scalar(1.0)?)?;
            Ok(vec![Some(g.mul(&slope)?)])
        }),
        // sign(relu(x)) is 1 where x > 0 and 0 elsewhere: two launches, no constant to fill.
        U::Relu => saving(keep(&[&y]), move |g, _| Ok(vec![Some(g.mul(&y.sign()?)?)])),
        U::Abs => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.mul(&x.sign()?)?)])),
        U::Log => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.div(&x)?)])),
        U::Log1p => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.div(&x.add_scalar(1.0)?)?)])),
        // x + x is 2x exactly, without filling a constant.
        U::Square => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.mul(&x.add(&x)?)?)])),
        U::Sin => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.mul(&x.cos()?)?)])),
        U::Cos => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.mul(&x.sin()?)?.neg()?)])),
        U::Erf => saving(keep(&[&x]), move |g, _| {
            // 2/√π · exp(-x²)
            let slope = x.square()?.neg()?.exp()?.mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?;
            Ok(vec![Some(g.mul(&slope)?)])
        }),
        U::Gelu => saving(keep(&[&x]), move |g, _| {
            // Φ(x) + x·φ(x), with Φ the normal CDF and φ its density: one kernel where the
            // backend has it, else composed.
            if let Some(gx) = x.gelu_backward_fused(g)? {
                return Ok(vec![Some(gx)]);
            }
            let cdf = x
                .mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?
                .erf()?
                .add_scalar(1.0)?
                .mul_scalar(0.5)?;
            let pdf = x
                .square()?
                .mul_scalar(-0.5)?
                .exp()?
                .mul_scalar(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)?;
            Ok(vec![Some(g.mul(&cdf.add(&x.mul(&pdf)?)?)?)])
        }),
        U::Silu => saving(keep(&[&x]), move |g, _| {
            // s·(1 + x·(1 - s)), s = sigmoid(x)
            let s = x.sigmoid()?;
            let slope = s.mul(&x.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)?;
            Ok(vec![Some(g.mul(&slope)?)])
        }),
        U::Softplus => saving(keep(&[&x]), move |g, _| Ok(vec![Some(g.mul(&x.sigmoid()?)?)])),
    }
}

/// The backward of `out = lhs op rhs` with broadcasting.
pub(crate) fn binary(op: BinaryOp, lhs: &Tensor, rhs: &Tensor, out: &Tensor) -> (BackwardFn, Saved) {
    let (lm, rm) = (Meta::of(lhs), Meta::of(rhs));
    match op {
        BinaryOp::Add => saving(keep(&[]), move |g, need| {
            Ok(vec![
                when(need[0], || sum_to(g, &lm.shape))?,
                when(need[1], || sum_to(g, &rm.shape))?,
            ])
        }),
        BinaryOp::Sub => saving(keep(&[]), move |g, need| {
            Ok(vec![
                when(need[0], || sum_to(g, &lm.shape))?,
                when(need[1], || sum_to(&g.neg()?, &rm.shape))?,
            ])
        }),
        BinaryOp::Mul => {
            let (a, b) = (lhs.detach(), rhs.detach());
            saving(keep(&[&a, &b]), move |g, need| {
                Ok(vec![
                    when(need[0], || sum_to(&g.mul(&b)?, &lm.shape))?,
                    when(need[1], || sum_to(&g.mul(&a)?, &rm.shape))?,
                ])
            })
        }
        BinaryOp::Div => {
            let (b, y) = (rhs.detach(), out.detach());
            saving(keep(&[&b, &y]), move |g, need| {
                let ga = g.div(&b)?;
                Ok(vec![
                    when(need[0], || sum_to(&ga, &lm.shape))?,
                    // d(a/b)/db = -a/b² = -y/b
                    when(need[1], || sum_to(&ga.mul(&y)?.neg()?, &rm.shape))?,
                ])
            })
        }
        BinaryOp::Pow => {
            let (a, b, y) = (lhs.detach(), rhs.detach(), out.detach());
            saving(keep(&[&a, &b, &y]), move |g, need| {
                let zero = zero_like(g)?;
                let ga = when(need[0], || {
                    // b·a^(b-1), and 0 where b == 0 (as PyTorch: no 0·inf at a == 0)
                    let slope = b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?;
                    let slope = Tensor::where_cond(&b.eq(&zero)?, &zero, &slope)?;
                    sum_to(&g.mul(&slope)?, &lm.shape)
                })?;
                let gb = when(need[1], || {
                    // a^b·ln a, and 0 where a == 0 and b ≥ 0
                    let slope = y.mul(&a.log()?)?;
                    let at_zero = a.eq(&zero)?.logical_and(&b.ge(&zero)?)?;
                    let slope = Tensor::where_cond(&at_zero, &zero, &slope)?;
                    sum_to(&g.mul(&slope)?, &rm.shape)
                })?;
                Ok(vec![ga, gb])
            })
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let (a, b) = (lhs.detach(), rhs.detach());
            let max = op == BinaryOp::Maximum;
            saving(keep(&[&a, &b]), move |g, need| {
                // The larger (smaller) operand takes the gradient; a tie splits it in two.
                let a_wins = if max { a.gt(&b)? } else { a.lt(&b)? };
                let tie = a.eq(&b)?;
                let zero = zero_like(g)?;
                let half = g.mul_scalar(0.5)?;
                let to_a = Tensor::where_cond(&a_wins, g, &Tensor::where_cond(&tie, &half, &zero)?)?;
                let ga = when(need[0], || sum_to(&to_a, &lm.shape))?;
                let gb = when(need[1], || sum_to(&g.sub(&to_a)?, &rm.shape))?;
                Ok(vec![ga, gb])
            })
        }
    }
}

/// The backward of `where(cond, on_true, on_false)`; `cond` is not an input of the node.
pub(crate) fn where_cond(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> (BackwardFn, Saved) {
    let (tm, fm) = (Meta::of(on_true), Meta::of(on_false));
    let cond = cond.detach();
    saving(keep(&[&cond]), move |g, need| {
        let zero = zero_like(g)?;
        Ok(vec![
            when(need[0], || sum_to(&Tensor::where_cond(&cond, g, &zero)?, &tm.shape))?,
            when(need[1], || sum_to(&Tensor::where_cond(&cond, &zero, g)?, &fm.shape))?,
        ])
    })
}

/// The backward of a move or cast: the gradient goes back to the input's device and dtype.
pub(crate) fn convert(device: Device, dtype: DType) -> (BackwardFn, Saved) {
    saving(keep(&[]), move |g, _| {
        Ok(vec![Some(g.to_device_dtype(&device, dtype)?)])
    })
}

/// The backward of an op that passes values through unchanged (`contiguous`, copies).
pub(crate) fn identity() -> (BackwardFn, Saved) {
    saving(keep(&[]), |g, _| Ok(vec![Some(g.clone())]))
}
