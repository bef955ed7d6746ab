//! Mixed precision: `let _ac = cartage::autocast(&device, DType::BF16)?;` runs the ops that
//! gain from half precision in it and keeps the ones that lose accuracy in f32 (LESSONS R25).
//!
//! While the guard lives, on its thread:
//! - **in the autocast dtype** (f16 or bf16): `matmul`, `linear` (its bias too, as in
//!   PyTorch), `conv2d`, `scaled_dot_product_attention` and
//!   `scaled_dot_product_attention_packed`. Their f32 operands are cast on entry.
//! - **in f32**: `softmax`, `log_softmax`, `logsumexp`, `sum`, `mean`, `prod`, `cumsum`,
//!   `cumprod` (and what is built from them: `var`, `std`, `norm`), `layer_norm`, `rms_norm`,
//!   `cross_entropy` and `nll_loss`. Their half-precision operands are cast on entry.
//! - **binary element-wise ops** whose operands are two different float dtypes compute in the
//!   wider one (outside autocast, that is a dtype-mismatch error: nothing is promoted silently).
//!
//! Everything else runs in its operands' dtype. Casts are recorded like any op, so gradients flow
//! back to the f32 master weights in f32. The guard is per thread and nests.

use std::cell::Cell;
use std::marker::PhantomData;

use cartage_core::{DType, Device, Error, Op, Result};

use crate::Tensor;

thread_local! {
    static ACTIVE: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Run matmuls, convolutions and attention in `dtype` (f16 or bf16) and reductions, softmax,
/// norms and losses in f32, on this thread until the guard is dropped. Fails when `device`
/// cannot multiply matrices in `dtype`.
///
/// ```
/// use cartage::{DType, Device, Tensor};
/// # fn main() -> cartage::Result<()> {
/// let cpu = Device::cpu();
/// let a = Tensor::ones(&[2, 3], DType::F32, &cpu)?;
/// let b = Tensor::ones(&[3, 2], DType::F32, &cpu)?;
/// let _ac = cartage::autocast(&cpu, DType::BF16)?;
/// let y = a.matmul(&b)?;
/// assert_eq!(y.dtype(), DType::BF16);                  // the product in bf16
/// assert_eq!(y.softmax(-1)?.dtype(), DType::F32);      // the softmax in f32
/// assert_eq!(y.add(&a.narrow(1, 0, 2)?)?.dtype(), DType::F32); // mixed operands: the wider
/// # Ok(())
/// # }
/// ```
pub fn autocast(device: &Device, dtype: DType) -> Result<AutocastGuard> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::WrongDType {
            op: "autocast",
            dtype,
            expected: "f16 or bf16 (autocast lowers f32 matmuls, convolutions and attention to it)",
        });
    }
    let backend = crate::runtime::backend(device)?;
    if !backend.capabilities().supports(Op::Matmul, dtype) {
        return Err(Error::Unsupported {
            op: "autocast".into(),
            dtype: Some(dtype),
            device: *device,
            reason: "this device has no matmul in that dtype; autocast to the other half type, or run in f32".into(),
        });
    }
    let previous = ACTIVE.with(|a| a.replace(Some(dtype)));
    Ok(AutocastGuard {
        previous,
        _same_thread: PhantomData,
    })
}

/// PyTorch's `autocast(device, dtype, enabled=...)`: [`autocast`] when `enabled`; otherwise
/// autocast is switched **off** on this thread until the guard drops (also inside an enclosing
/// autocast region, as PyTorch's `enabled=False` does), so one code path serves both settings.
///
/// ```
/// use cartage::{DType, Device, Tensor, autocast_dtype, autocast_with};
/// # fn main() -> cartage::Result<()> {
/// let cpu = Device::cpu();
/// let _outer = autocast_with(&cpu, DType::BF16, true)?;
/// assert_eq!(autocast_dtype(), Some(DType::BF16));
/// {
///     let _off = autocast_with(&cpu, DType::BF16, false)?;
///     assert_eq!(autocast_dtype(), None); // f32 inside
/// }
/// assert_eq!(autocast_dtype(), Some(DType::BF16)); // restored
/// # Ok(())
/// # }
/// ```
pub fn autocast_with(device: &Device, dtype: DType, enabled: bool) -> Result<AutocastGuard> {
    if enabled {
        return autocast(device, dtype);
    }
    let previous = ACTIVE.with(|a| a.replace(None));
    Ok(AutocastGuard {
        previous,
        _same_thread: PhantomData,
    })
}

/// The autocast dtype on this thread, if a guard is alive.
pub fn autocast_dtype() -> Option<DType> {
    ACTIVE.with(Cell::get)
}

/// Keeps autocast on (see [`autocast`]); restores the previous setting when dropped.
#[must_use = "autocast ends as soon as the guard is dropped; bind it: `let _ac = autocast(..)?;`"]
pub struct AutocastGuard {
    previous: Option<DType>,
    _same_thread: PhantomData<*const ()>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.previous));
    }
}

/// `t` in f32 when autocast is on and `t` is half precision (an op of the f32 list).
pub(crate) fn widened(t: &Tensor) -> Result<Option<Tensor>> {
    match autocast_dtype() {
        Some(_) if matches!(t.dtype(), DType::F16 | DType::BF16) => t.to_dtype(DType::F32).map(Some),
        _ => Ok(None),
    }
}

/// `t` in the autocast dtype when autocast is on and `t` is f32 (an op of the half list),
/// else itself.
pub(crate) fn lower(t: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(dtype) if t.dtype() == DType::F32 => t.to_dtype(dtype),
        _ => Ok(t.clone()),
    }
}

/// `t` widened when it needs to be, else itself.
pub(crate) fn widen(t: &Tensor) -> Result<Tensor> {
    Ok(widened(t)?.unwrap_or_else(|| t.clone()))
}

/// For a binary op under autocast with two different float dtypes: both in the wider one.
pub(crate) fn promoted(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    if a.dtype() == b.dtype() || !a.dtype().is_float() || !b.dtype().is_float() || autocast_dtype().is_none() {
        return Ok(None);
    }
    let wider = if a.dtype().size_in_bytes() >= b.dtype().size_in_bytes() {
        a.dtype()
    } else {
        b.dtype()
    };
    Ok(Some((a.to_dtype(wider)?, b.to_dtype(wider)?)))
}
