//! Import: [`Tensor::from_dlpack`] and [`Tensor::from_dlpack_versioned`] wrap another
//! framework's memory as a cartage storage without a copy; the producer's deleter runs when the
//! last tensor viewing it is dropped.

use std::ptr::NonNull;
use std::sync::Arc;

use cartage_core::{DeviceBuffer, Error, Layout, Result, Site};

use super::abi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLTensor,
};
use super::convert;
use crate::tensor::{Storage, Tensor};

/// The most dimensions an imported tensor may have (a hostile `ndim` is refused before the
/// shape is read).
pub const MAX_DLPACK_NDIM: i32 = 64;

/// A producer's struct, whose deleter runs exactly once: when this value is dropped (on an
/// import error at once, otherwise with the storage).
enum Managed {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

/// Calls the producer's deleter when dropped.
struct ForeignOwner(Managed);

// SAFETY: after the import nothing reads the struct; the only use left is calling its deleter,
// which DLPack allows from any thread (producers that need a lock, such as Python's GIL, take it
// in the deleter).
unsafe impl Send for ForeignOwner {}
// SAFETY: as above; a shared `&ForeignOwner` gives no access at all.
unsafe impl Sync for ForeignOwner {}

impl Drop for ForeignOwner {
    fn drop(&mut self) {
        match self.0 {
            Managed::Legacy(ptr) => {
                // SAFETY: the importer's caller handed over a valid struct it no longer uses; its
                // `deleter` field is read once, here, and called once.
                if let Some(deleter) = unsafe { ptr.as_ref() }.deleter {
                    // SAFETY: the producer's deleter, called once with its own struct.
                    unsafe { deleter(ptr.as_ptr()) };
                }
            }
            Managed::Versioned(ptr) => {
                // SAFETY: as above; `deleter` comes before `flags`, readable whatever the version.
                if let Some(deleter) = unsafe { ptr.as_ref() }.deleter {
                    // SAFETY: the producer's deleter, called once with its own struct.
                    unsafe { deleter(ptr.as_ptr()) };
                }
            }
        }
    }
}

impl Tensor {
    /// Take another framework's tensor through DLPack (`DLManagedTensor`, what PyTorch's
    /// `to_dlpack` capsules hold) without a copy: the tensor views the producer's memory with
    /// its shape and strides, and the producer's deleter runs once the last cartage tensor
    /// viewing it is dropped (on CUDA after cartage's streams are synchronised).
    ///
    /// Everything is checked: `ndim` (0 to [`MAX_DLPACK_NDIM`]), null shape, negative sizes or
    /// strides, the element count, the dtype (code, bits, lanes 1), the device type (host or
    /// CUDA), a null or misaligned pointer, and on CUDA that the driver knows the pointer as
    /// memory of that device holding every byte viewed. Non-contiguous strides become a view
    /// (no copy); negative strides are refused (a cartage view cannot express them: make the
    /// tensor contiguous on the producer's side). An empty tensor becomes a fresh empty
    /// tensor. Bool bytes are taken as they are (0 or 1 in PyTorch and numpy).
    ///
    /// Ownership: on success the tensor owns the struct; **on error the deleter has been
    /// called** (exactly once), so the caller never frees it either way.
    ///
    /// # Safety
    /// `managed` points to a valid `DLManagedTensor` whose fields describe memory of the
    /// device it names that stays valid until its deleter is called, and the caller gives up
    /// the struct (it must not use it or call its deleter afterwards). While cartage holds the
    /// memory, the producer must not write it concurrently with cartage's work.
    #[track_caller]
    pub unsafe fn from_dlpack(managed: NonNull<DLManagedTensor>) -> Result<Tensor> {
        let site = crate::tensor::caller();
        let owner = ForeignOwner(Managed::Legacy(managed));
        // SAFETY: the caller's contract: a valid struct, read before its deleter runs.
        let dl = unsafe { managed.as_ref() }.dl_tensor;
        // SAFETY: `dl` describes memory kept alive by `owner`.
        unsafe { import(dl, owner, site) }
    }

    /// As [`Tensor::from_dlpack`] for a `DLManagedTensorVersioned` (capsules named
    /// `"dltensor_versioned"`). A major version other than 1 is refused without reading the
    /// tensor (the layout may differ). A tensor flagged read-only is **refused**: cartage
    /// tensors are writable, so it would break the producer's contract; copy it on the
    /// producer's side (e.g. `np.array(a, copy=True)`) to import it. The deleter has been
    /// called on every error.
    ///
    /// # Safety
    /// As for [`Tensor::from_dlpack`], for a `DLManagedTensorVersioned`.
    #[track_caller]
    pub unsafe fn from_dlpack_versioned(managed: NonNull<DLManagedTensorVersioned>) -> Result<Tensor> {
        let site = crate::tensor::caller();
        let owner = ForeignOwner(Managed::Versioned(managed));
        // SAFETY: the caller's contract: a valid struct; the version is readable in any version.
        let version = unsafe { managed.as_ref() }.version;
        if version.major != DLPACK_MAJOR_VERSION {
            return Err(Error::invalid(
                "from_dlpack",
                format!(
                    "DLPack version {}.{}: cartage reads major version {DLPACK_MAJOR_VERSION}; the layout differs, so \
                     the tensor was given back to its producer unread",
                    version.major, version.minor
                ),
            ));
        }
        // SAFETY: major version 1: the struct has this layout.
        let (flags, dl) = unsafe { (managed.as_ref().flags, managed.as_ref().dl_tensor) };
        if flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0 {
            return Err(Error::invalid(
                "from_dlpack",
                "the producer marked the tensor read-only (a numpy array with writeable=False, a broadcast view...); \
                 cartage tensors are writable, so it is not imported: copy it on the producer's side first",
            ));
        }
        // SAFETY: `dl` describes memory kept alive by `owner`.
        unsafe { import(dl, owner, site) }
    }
}

/// Check `dl` and wrap its memory; `owner` is dropped (its deleter called) on any error.
///
/// # Safety
/// `dl` is the tensor of the struct `owner` holds, valid until `owner` is dropped.
unsafe fn import(dl: DLTensor, owner: ForeignOwner, site: Site) -> Result<Tensor> {
    let dtype = convert::dtype_from_dl(dl.dtype)?;
    let device = convert::device_from_dl(dl.device)?;
    // SAFETY: the shape and strides arrays belong to `dl`, alive while `owner` is.
    let (shape, strides) = unsafe { dims(&dl) }?;
    let layout = Layout::from_parts(&shape, &strides, 0).map_err(|e| e.with_dtype(dtype))?;
    if layout.numel() == 0 {
        drop(owner);
        return Tensor::zeros(&shape, dtype, &device);
    }
    if dl.data.is_null() {
        return Err(Error::invalid(
            "from_dlpack",
            format!("a null data pointer for a tensor of shape {shape:?}; the producer's tensor is corrupt"),
        ));
    }
    let size = dtype.size_in_bytes();
    let addr = (dl.data.expose_provenance() as u64)
        .checked_add(dl.byte_offset)
        .filter(|a| usize::try_from(*a).is_ok());
    let Some(addr) = addr else {
        return Err(Error::invalid(
            "from_dlpack",
            format!(
                "byte_offset {} past the end of the address space from {:p}",
                dl.byte_offset, dl.data
            ),
        ));
    };
    if addr % size as u64 != 0 {
        return Err(Error::invalid(
            "from_dlpack",
            format!(
                "the first element at {addr:#x} is not aligned to its {size}-byte {dtype}; cartage's kernels need \
                 aligned elements: make the tensor contiguous (a fresh copy) on the producer's side"
            ),
        ));
    }
    // The extent is at most `MAX_ELEMENTS` (checked by the layout), so the bytes fit `isize`.
    let bytes = layout.extent() * size;
    let backend = crate::backend(&device)?;
    // SAFETY: `addr..addr + bytes` is exactly the memory the producer's tensor views (its
    // shape, strides and offset, all checked above), valid until `owner` runs the deleter,
    // which the buffer does only after the device has finished with it.
    let buffer = unsafe { DeviceBuffer::import_external(&backend, addr, bytes, Box::new(owner)) }?;
    tracing::debug!(%device, %dtype, ?shape, bytes, "imported a DLPack tensor");
    Ok(Tensor::from_storage(
        Arc::new(Storage::from_buffer(buffer)),
        layout,
        dtype,
        device,
        site,
    ))
}

/// The sizes and strides of `dl`, checked: `ndim` in range, no null arrays, nothing negative.
/// NULL strides mean compact row-major (DLPack before 1.0).
///
/// # Safety
/// `dl.shape` and `dl.strides`, when non-null, point to `dl.ndim` readable `i64`s.
unsafe fn dims(dl: &DLTensor) -> Result<(Vec<usize>, Vec<usize>)> {
    let bad = |reason: String| Err(Error::invalid("from_dlpack", reason));
    if !(0..=MAX_DLPACK_NDIM).contains(&dl.ndim) {
        return bad(format!(
            "ndim {} is outside 0..={MAX_DLPACK_NDIM}; the producer's tensor is corrupt",
            dl.ndim
        ));
    }
    let ndim = dl.ndim as usize;
    if ndim == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let read = |ptr: *mut i64, what: &str| -> Result<&[i64]> {
        if ptr.is_null() {
            return Err(Error::invalid(
                "from_dlpack",
                format!("a null {what} array for {ndim} dimensions; the producer's tensor is corrupt"),
            ));
        }
        if !ptr.is_aligned() {
            return Err(Error::invalid(
                "from_dlpack",
                format!("the {what} array at {ptr:p} is not aligned to 8 bytes; the producer's tensor is corrupt"),
            ));
        }
        // SAFETY: non-null, aligned, and `ndim` readable values (the caller's contract).
        Ok(unsafe { std::slice::from_raw_parts(ptr, ndim) })
    };
    let shape_raw = read(dl.shape, "shape")?;
    let mut shape = Vec::with_capacity(ndim);
    for &d in shape_raw {
        match usize::try_from(d) {
            Ok(d) => shape.push(d),
            Err(_) => return bad(format!("negative size {d} in shape {shape_raw:?}")),
        }
    }
    if dl.strides.is_null() {
        let strides = cartage_core::contiguous_strides(&shape).to_vec();
        return Ok((shape, strides));
    }
    let strides_raw = read(dl.strides, "strides")?;
    let mut strides = Vec::with_capacity(ndim);
    for &s in strides_raw {
        match usize::try_from(s) {
            Ok(s) => strides.push(s),
            Err(_) => {
                return bad(format!(
                    "negative stride {s} in strides {strides_raw:?} (a flipped view); cartage views have \
                     non-negative strides: make the tensor contiguous on the producer's side first"
                ));
            }
        }
    }
    Ok((shape, strides))
}
