//! The per-thread switch that turns recording off: `let _guard = cartage::no_grad();`.
//!
//! While a [`NoGradGuard`] lives on a thread, ops on that thread record nothing, even on
//! variables: evaluation loops, optimizer updates and the backward pass itself run this way.
//! Guards nest; recording comes back when the last one is dropped. Other threads are unaffected.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static DISABLED_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Turns gradient recording off on this thread until the guard is dropped.
///
/// ```
/// use cartage::{DType, Device, Tensor, Var};
/// let w = Var::new(Tensor::ones(&[3], DType::F32, &Device::cpu())?)?;
/// let y = {
///     let _guard = cartage::no_grad();
///     w.tensor().mul_scalar(2.0)?
/// };
/// assert!(!y.requires_grad());
/// assert!(w.tensor().mul_scalar(2.0)?.requires_grad());
/// # Ok::<(), cartage::Error>(())
/// ```
pub fn no_grad() -> NoGradGuard {
    DISABLED_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard {
        _same_thread: PhantomData,
    }
}

/// True unless a [`no_grad`] guard is alive on this thread.
///
/// ```
/// assert!(cartage::is_grad_enabled());
/// let guard = cartage::no_grad();
/// assert!(!cartage::is_grad_enabled());
/// drop(guard);
/// assert!(cartage::is_grad_enabled());
/// ```
pub fn is_grad_enabled() -> bool {
    DISABLED_DEPTH.with(|d| d.get() == 0)
}

/// Keeps recording off on the thread that made it (see [`no_grad`]). Not `Send`: the switch is
/// per thread, so the guard must be dropped where it was made.
#[must_use = "recording comes back as soon as the guard is dropped; bind it: `let _guard = no_grad();`"]
pub struct NoGradGuard {
    _same_thread: PhantomData<*const ()>,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        DISABLED_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}
