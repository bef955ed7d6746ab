//! The derivative of `matmul`, with numpy's rules (1-D operands, broadcast batches).

use super::{sum_to, when};
use crate::Tensor;
use crate::autograd::graph::{BackwardFn, Saved, keep, saving};

/// The backward of `out = a.matmul(b)`: `ga = g·bᵀ`, `gb = aᵀ·g`, each summed over broadcast
/// batch dimensions; 1-D operands gain the unit dimension they had in the product.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> (BackwardFn, Saved) {
    let (a, b) = (a.detach(), b.detach());
    saving(keep(&[&a, &b]), move |g, need| {
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
            if let Some(gb) = shared_rhs_gradient(&a2, &b2, &g2)? {
                return gb.reshape(b.shape());
            }
            let full = a2.transpose(-2, -1)?.matmul(&g2)?;
            let gb2 = sum_to(&full, b2.shape())?;
            gb2.reshape(b.shape())
        })?;
        Ok(vec![ga, gb])
    })
}

/// `gb` for a 2-D `b` shared by every batch of `a` (`x [.., m, k] · w [k, n]`, as in a linear
/// layer): one product of the batch-folded rows, `aᵀ·g` `[k, n]`, rather than a batched product
/// of `[.., k, n]` summed over the batch, which would hold `batch` copies of the weight's
/// gradient and reduce them in a separate pass. When `b` is a transposed view (`wᵀ` of a
/// row-major weight), the product runs as `(gᵀ·a)ᵀ`, so the gradient is itself a transposed view
/// of a row-major `[n, k]` matrix and reaches the weight without a copy. `None` when `b` is not
/// shared that way.
fn shared_rhs_gradient(a: &Tensor, b: &Tensor, g: &Tensor) -> crate::Result<Option<Tensor>> {
    if b.rank() != 2 || a.rank() < 3 {
        return Ok(None);
    }
    let (k, n) = (b.shape()[0], b.shape()[1]);
    let rows = a.numel() / k.max(1);
    if k == 0 || n == 0 || rows == 0 {
        return Ok(None);
    }
    let a_rows = a.reshape(&[rows, k])?;
    let g_rows = g.reshape(&[rows, n])?;
    let column_major = b.layout().strides() == [1, k] && k > 1 && n > 1;
    let gb = if column_major {
        g_rows.t()?.matmul(&a_rows)?.t()?
    } else {
        a_rows.t()?.matmul(&g_rows)?
    };
    Ok(Some(gb))
}

/// The backward of `out = x·Wᵀ + b` (the fused linear layer without an activation), for `x`
/// `[.., k]`, `W` `[n, k]` and `b` `[n]`: `gx = g·W`, `gW = gᵀ·x` over the batch-folded rows
/// (one `[n, k]` product, in the weight's own row-major layout) and `gb` the rows' sum of `g`.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> (BackwardFn, Saved) {
    let (x, w) = (x.detach(), w.detach());
    let has_bias = b.is_some();
    saving(keep(&[&x, &w]), move |g, need| {
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let rows: usize = x.shape()[..x.rank() - 1].iter().product();
        let gx = when(need[0], || g.matmul(&w))?;
        let g_rows = || g.reshape(&[rows, n]);
        let gw = when(need[1], || g_rows()?.t()?.matmul(&x.reshape(&[rows, k])?))?;
        let mut grads = vec![gx, gw];
        if has_bias {
            // In g's dtype even where a live autocast scope would sum in f32.
            grads.push(when(need[2], || g_rows()?.sum(&[0], false)?.to_dtype(g.dtype()))?);
        }
        Ok(grads)
    })
}

/// The backward of `out = act(x)·Wᵀ + b` ([`Tensor::activation_linear`]), saving only `x` and
/// `W`: `gW = gᵀ·act(x)` with `act(x)` recomputed (and dropped before the input's gradient is
/// formed), `gx = (g·W) ∘ act'(x)`, `gb` the rows' sum of `g`.
pub(crate) fn activation_linear(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    activation: cartage_core::Epilogue,
) -> (BackwardFn, Saved) {
    let (x, w) = (x.detach(), w.detach());
    let has_bias = b.is_some();
    saving(keep(&[&x, &w]), move |g, need| {
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let rows: usize = x.shape()[..x.rank() - 1].iter().product();
        let g_rows = || g.reshape(&[rows, n]);
        let gw = when(need[1], || {
            g_rows()?.t()?.matmul(&x.activate(activation)?.reshape(&[rows, k])?)
        })?;
        let gx = when(need[0], || x.activate_backward(&g.matmul(&w)?, activation))?;
        let mut grads = vec![gx, gw];
        if has_bias {
            // In g's dtype even where a live autocast scope would sum in f32.
            grads.push(when(need[2], || g_rows()?.sum(&[0], false)?.to_dtype(g.dtype()))?);
        }
        Ok(grads)
    })
}
