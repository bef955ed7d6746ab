//! Export: [`Tensor::to_dlpack`] and the owned [`DlpackTensor`] it returns, which becomes a
//! `DLManagedTensor` (or the versioned struct) whose deleter drops the tensor's storage.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use cartage_core::{Error, Result};

use super::abi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
    DLPackVersion, DLTensor,
};
use super::convert;
use crate::tensor::{Storage, Tensor};

/// A tensor on its way out through DLPack: it holds the tensor's storage, so the memory stays
/// alive until the consumer calls the deleter of the struct made by [`DlpackTensor::into_raw`]
/// or [`DlpackTensor::into_raw_versioned`] (or until this value is dropped, if it never is).
pub struct DlpackTensor {
    storage: Arc<Storage>,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    /// The address of the first element (the storage's address plus the view's offset).
    data: u64,
    device: DLDevice,
    dtype: DLDataType,
}

impl fmt::Debug for DlpackTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DlpackTensor")
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .finish()
    }
}

impl Tensor {
    /// This tensor for another framework through DLPack, without a copy: the same memory,
    /// shape and strides (in elements; the view's offset is folded into `data`, with
    /// `byte_offset` 0, as PyTorch does). The result keeps the storage alive until the
    /// consumer calls the deleter.
    ///
    /// - CPU tensors are `kDLCPU` device 0; CUDA tensors are `kDLCUDA` with their ordinal.
    ///   wgpu tensors are refused ([`Error::Unsupported`]): DLPack has no wgpu device type, so
    ///   move them to the cpu or a CUDA device first.
    /// - The device is synchronised first: the C-level exchange carries no stream, so the
    ///   consumer may read the memory on any stream as soon as it has the tensor. Work that
    ///   cartage queues *after* the export is not ordered against the consumer's.
    /// - A tensor a variable leads to is refused, as PyTorch refuses one that requires grad:
    ///   another framework's writes would bypass autograd's version checks. Export
    ///   [`Tensor::detach`]ed tensors.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::cpu())?;
    /// let out = x.t()?.to_dlpack()?;
    /// let dl = out.dl_tensor();
    /// assert_eq!((dl.ndim, dl.byte_offset), (2, 0));
    /// let raw = out.into_raw(); // hand this to the consumer, which calls the deleter when done
    /// // SAFETY: `raw` came from `into_raw` and is imported once.
    /// let back = unsafe { Tensor::from_dlpack(raw) }?;
    /// assert_eq!(back.to_vec2::<f32>()?, vec![vec![1.0, 3.0], vec![2.0, 4.0]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn to_dlpack(&self) -> Result<DlpackTensor> {
        let device = convert::dl_device(self.device())?;
        if self.link().is_some() {
            return Err(Error::invalid(
                "to_dlpack",
                "the tensor takes part in autograd (a variable leads to it); another framework's writes would bypass \
                 the version checks: export `x.detach()`",
            ));
        }
        self.backend().synchronize()?;
        let to_i64 = |v: &[usize]| v.iter().map(|&d| d as i64).collect::<Box<[i64]>>();
        let layout = self.layout();
        let data = self.storage().buffer().addr() + (layout.offset() * self.dtype().size_in_bytes()) as u64;
        Ok(DlpackTensor {
            storage: Arc::clone(self.storage()),
            shape: to_i64(layout.shape()),
            strides: to_i64(layout.strides()),
            data,
            device,
            dtype: convert::dl_dtype(self.dtype()),
        })
    }

    /// As [`Tensor::to_dlpack`], then [`DlpackTensor::into_raw`]: the unversioned struct
    /// PyTorch's `torch.from_dlpack` takes in a capsule named `"dltensor"`.
    pub fn to_dlpack_raw(&self) -> Result<NonNull<DLManagedTensor>> {
        Ok(self.to_dlpack()?.into_raw())
    }
}

impl DlpackTensor {
    /// The `DLTensor` describing the memory. Its `shape` and `strides` point into this value:
    /// valid while it lives.
    pub fn dl_tensor(&self) -> DLTensor {
        DLTensor {
            data: std::ptr::with_exposed_provenance_mut(self.data as usize),
            device: self.device,
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: self.shape.as_ptr().cast_mut(),
            strides: self.strides.as_ptr().cast_mut(),
            byte_offset: 0,
        }
    }

    /// The storage the export keeps alive.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// An owned `DLManagedTensor` (DLPack before 1.0, what `torch.utils.dlpack.to_dlpack`
    /// makes). The consumer must call its deleter exactly once; until then the memory stays
    /// alive.
    pub fn into_raw(self) -> NonNull<DLManagedTensor> {
        let dl_tensor = self.dl_tensor();
        let boxed = Box::new(Exported {
            managed: DLManagedTensor {
                dl_tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_exported),
            },
            owner: self,
        });
        let raw = Box::into_raw(boxed);
        // SAFETY: `raw` comes from `Box::into_raw`: non-null and live until the deleter.
        unsafe { (*raw).managed.manager_ctx = raw.cast::<c_void>() };
        // `managed` is the first field of a `#[repr(C)]` struct: its address is the box's.
        // SAFETY: `raw` is non-null (from `Box::into_raw`).
        unsafe { NonNull::new_unchecked(raw) }.cast::<DLManagedTensor>()
    }

    /// An owned `DLManagedTensorVersioned` (DLPack 1.1, flags 0: writable, not a copy). The
    /// consumer must call its deleter exactly once.
    pub fn into_raw_versioned(self) -> NonNull<DLManagedTensorVersioned> {
        let dl_tensor = self.dl_tensor();
        let raw = Box::into_raw(Box::new(Exported {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: DLPACK_MAJOR_VERSION,
                    minor: DLPACK_MINOR_VERSION,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_exported_versioned),
                flags: 0,
                dl_tensor,
            },
            owner: self,
        }));
        // SAFETY: `raw` comes from `Box::into_raw`: non-null and live until the deleter.
        unsafe { (*raw).managed.manager_ctx = raw.cast::<c_void>() };
        // `managed` is the first field of a `#[repr(C)]` struct: its address is the box's.
        // SAFETY: `raw` is non-null (from `Box::into_raw`).
        unsafe { NonNull::new_unchecked(raw) }.cast::<DLManagedTensorVersioned>()
    }
}

/// The box behind an exported struct: the managed struct first (so a pointer to it is a pointer
/// to the box), then what keeps the memory, shape and strides alive.
#[repr(C)]
struct Exported<M> {
    managed: M,
    owner: DlpackTensor,
}

/// The deleter of [`DlpackTensor::into_raw`]'s struct: frees it and drops the storage.
///
/// # Safety
/// `managed` is NULL or a pointer from [`DlpackTensor::into_raw`] not yet deleted.
unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: the pointer is the start of a leaked `Box<Exported<DLManagedTensor>>` (the
        // contract above), deleted once.
        drop(unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensor>>()) });
    }
}

/// The deleter of [`DlpackTensor::into_raw_versioned`]'s struct.
///
/// # Safety
/// `managed` is NULL or a pointer from [`DlpackTensor::into_raw_versioned`] not yet deleted.
unsafe extern "C" fn delete_exported_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: as in `delete_exported`, for the versioned box.
        drop(unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensorVersioned>>()) });
    }
}
