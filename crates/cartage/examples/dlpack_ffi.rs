//! A C ABI over cartage's DLPack import and export, built as a shared library
//! (`cargo build --release --example dlpack_ffi -p cartage --all-features` makes
//! `target/release/examples/libdlpack_ffi.so`) for `xtask/python/dlpack_roundtrip.py`, which
//! passes PyTorch tensors through it with ctypes.
//!
//! Every function takes ownership of the `DLManagedTensor*` it is given (a capsule's pointer,
//! the capsule then renamed `"used_dltensor"`) and returns either a new owned struct (the caller
//! wraps it in a `"dltensor"` capsule for `torch.from_dlpack`), or NULL after an error, whose
//! message `cartage_dlpack_last_error` returns. On error the given struct's deleter has run.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::ptr::{self, NonNull};

use cartage::dlpack::{DLManagedTensor, DLManagedTensorVersioned};
use cartage::{DType, Result, Tensor};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(e: &cartage::Error) {
    let message = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = message);
}

/// The message of this thread's last error (empty when none); valid until the next call.
#[unsafe(no_mangle)]
pub extern "C" fn cartage_dlpack_last_error() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// The sum of `t`'s elements, computed by cartage on `t`'s device in f64.
fn sum(t: &Tensor) -> Result<f64> {
    t.to_dtype(DType::F64)?.sum_all()?.item::<f64>()
}

/// Import `managed` (zero copy), store the sum of its elements in `*sum_out` (when not NULL),
/// and export the same memory back: the result views the same address with the same shape and
/// strides. NULL on error.
///
/// # Safety
/// `managed` is NULL or a valid, owned `DLManagedTensor*` handed over to this call; `sum_out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_roundtrip(
    managed: *mut DLManagedTensor,
    sum_out: *mut f64,
) -> *mut DLManagedTensor {
    let Some(managed) = NonNull::new(managed) else {
        return ptr::null_mut();
    };
    let run = || -> Result<NonNull<DLManagedTensor>> {
        // SAFETY: the caller hands over a valid struct.
        let t = unsafe { Tensor::from_dlpack(managed) }?;
        if !sum_out.is_null() {
            // SAFETY: the caller's contract: writable when not NULL.
            unsafe { sum_out.write(sum(&t)?) };
        }
        t.to_dlpack_raw()
    };
    match run() {
        Ok(out) => out.as_ptr(),
        Err(e) => {
            remember(&e);
            ptr::null_mut()
        }
    }
}

/// As [`cartage_dlpack_roundtrip`] for `DLManagedTensorVersioned*` (capsules named
/// `"dltensor_versioned"`).
///
/// # Safety
/// As for [`cartage_dlpack_roundtrip`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_roundtrip_versioned(
    managed: *mut DLManagedTensorVersioned,
    sum_out: *mut f64,
) -> *mut DLManagedTensorVersioned {
    let Some(managed) = NonNull::new(managed) else {
        return ptr::null_mut();
    };
    let run = || -> Result<NonNull<DLManagedTensorVersioned>> {
        // SAFETY: the caller hands over a valid struct.
        let t = unsafe { Tensor::from_dlpack_versioned(managed) }?;
        if !sum_out.is_null() {
            // SAFETY: the caller's contract: writable when not NULL.
            unsafe { sum_out.write(sum(&t)?) };
        }
        Ok(t.to_dlpack()?.into_raw_versioned())
    };
    match run() {
        Ok(out) => out.as_ptr(),
        Err(e) => {
            remember(&e);
            ptr::null_mut()
        }
    }
}

/// Import `managed` and return a new tensor that cartage allocates and computes on the same
/// device: the input times `factor`, in f32 (so every dtype can be checked the same way). NULL
/// on error.
///
/// # Safety
/// As for [`cartage_dlpack_roundtrip`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_scaled(managed: *mut DLManagedTensor, factor: f64) -> *mut DLManagedTensor {
    let Some(managed) = NonNull::new(managed) else {
        return ptr::null_mut();
    };
    let run = || -> Result<NonNull<DLManagedTensor>> {
        // SAFETY: the caller hands over a valid struct.
        let t = unsafe { Tensor::from_dlpack(managed) }?;
        t.to_dtype(DType::F32)?.mul_scalar(factor)?.to_dlpack_raw()
    };
    match run() {
        Ok(out) => out.as_ptr(),
        Err(e) => {
            remember(&e);
            ptr::null_mut()
        }
    }
}

/// Import `managed` and keep it: the returned handle holds the tensor (and so the producer's
/// memory) until [`cartage_dlpack_release`]. NULL on error.
///
/// # Safety
/// As for [`cartage_dlpack_roundtrip`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_hold(managed: *mut DLManagedTensor) -> *mut Tensor {
    let Some(managed) = NonNull::new(managed) else {
        return ptr::null_mut();
    };
    // SAFETY: the caller hands over a valid struct.
    match unsafe { Tensor::from_dlpack(managed) } {
        Ok(t) => Box::into_raw(Box::new(t)),
        Err(e) => {
            remember(&e);
            ptr::null_mut()
        }
    }
}

/// The sum of a held tensor's elements (NaN on error).
///
/// # Safety
/// `held` is a live handle from [`cartage_dlpack_hold`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_held_sum(held: *const Tensor) -> f64 {
    // SAFETY: the caller's contract.
    let Some(t) = (unsafe { held.as_ref() }) else {
        return f64::NAN;
    };
    sum(t).unwrap_or_else(|e| {
        remember(&e);
        f64::NAN
    })
}

/// Drop a held tensor: the producer's deleter runs (after the device has finished with it).
///
/// # Safety
/// `held` is NULL or a live handle from [`cartage_dlpack_hold`], released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cartage_dlpack_release(held: *mut Tensor) {
    if !held.is_null() {
        // SAFETY: made by `Box::into_raw` in `cartage_dlpack_hold`, released once.
        drop(unsafe { Box::from_raw(held) });
    }
}
