//! The derivative of `matmul`, with numpy's rules (1-D operands, broadcast batches).

use super::{sum_to, when};
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, bytes, saving};

/// The backward of `out = a.matmul(b)`: `ga = g·bᵀ`, `gb = aᵀ·g`, each summed over broadcast
/// batch dimensions; 1-D operands gain the unit dimension they had in the product.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> (BackwardFn, usize) {
    let (a, b) = (a.detach(), b.detach());
    saving(bytes(&[&a, &b]), move |g, need| {
        let a2 = if a.rank() == 1 { a.unsqueeze(0)? } else { a.clone() };
        let b2 = if b.rank() == 1 { b.unsqueeze(1)? } else { b.clone() };
        // The output with both unit dimensions back: [..., m, n].
        let mut g2 = g.clone();
        if a.rank() == 1 {
            g2 = g2.unsqueeze(if b.rank() == 1 { 0 } else { -2 })?;
        }
        if b.rank() == 1 {
            g2 = g2.unsqueeze(-1)?;
        }
        let ga = when(need[0], || {
            let full = g2.matmul(&b2.transpose(-2, -1)?)?;
            let ga2 = sum_to(&full, a2.shape())?;
            ga2.reshape(a.shape())
        })?;
        let gb = when(need[1], || {
            let full = a2.transpose(-2, -1)?.matmul(&g2)?;
            let gb2 = sum_to(&full, b2.shape())?;
            gb2.reshape(b.shape())
        })?;
        Ok(vec![ga, gb])
    })
}
