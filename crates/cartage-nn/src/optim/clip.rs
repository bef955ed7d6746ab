//! [`clip_grad_norm`]: scale gradients so their global L2 norm is at most a bound, on the device.

use cartage::{DType, Result, Tensor};

use crate::ParamStore;

/// Scale every gradient of `store` by `min(1, max_norm / (‖g‖ + 1e-6))`, where `‖g‖` is the L2
/// norm of all gradients together, computed in f32 on the device: nothing is read back to the
/// host. Returns the norm before clipping, as a one-element f32 tensor on the store's device.
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::{ParamStore, optim::clip_grad_norm};
/// # fn main() -> cartage::Result<()> {
/// let store = ParamStore::new(&Device::cpu());
/// let w = store.root().var("w", Tensor::from_slice(&[3.0f32, 4.0], &[2], &Device::cpu())?)?;
/// w.tensor().square()?.sum_all()?.mul_scalar(0.5)?.backward()?; // gradient [3, 4], norm 5
/// let norm = clip_grad_norm(&store, 1.0)?;
/// assert_eq!(norm.item::<f32>()?, 5.0);
/// let g = w.grad().unwrap().to_vec::<f32>()?;
/// assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
/// # Ok(())
/// # }
/// ```
pub fn clip_grad_norm(store: &ParamStore, max_norm: f64) -> Result<Tensor> {
    let _plain = cartage::no_grad();
    let device = store.device();
    let mut total = Tensor::zeros(&[], DType::F32, &device)?;
    let vars = store.vars();
    for var in &vars {
        if let Some(g) = var.grad() {
            total = total.add(&g.to_dtype(DType::F32)?.square()?.sum_all()?)?;
        }
    }
    let norm = total.sqrt()?;
    let coef = norm.add_scalar(1e-6)?.recip()?.mul_scalar(max_norm)?.clamp_max(1.0)?;
    for var in &vars {
        if let Some(g) = var.grad() {
            var.set_grad(Some(g.mul(&coef.to_dtype(g.dtype())?)?))?;
        }
    }
    Ok(norm)
}
