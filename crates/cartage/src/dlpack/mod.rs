//! DLPack: tensors to and from PyTorch, numpy, JAX, CuPy and other frameworks, without a copy.
//!
//! - [`abi`]: the C structs and constants of `dlpack.h` (version 1.1), `#[repr(C)]`.
//! - Export ([`Tensor::to_dlpack`] → [`DlpackTensor`] → [`DlpackTensor::into_raw`] or
//!   [`DlpackTensor::into_raw_versioned`]): an owned `DLManagedTensor` viewing the tensor's
//!   memory, whose deleter drops the storage. The device is synchronised first (the C-level
//!   exchange carries no stream). wgpu tensors are refused: DLPack has no wgpu device type.
//! - Import ([`Tensor::from_dlpack`], [`Tensor::from_dlpack_versioned`], both `unsafe`): the
//!   producer's memory becomes a cartage storage (zero copy), whose deleter runs when the last
//!   tensor viewing it is dropped (after the device has finished with it). Every field is
//!   checked first, and on any error the deleter has already been called: ownership passes to
//!   cartage either way.
//!
//! Imported memory keeps the identity rules of the rest of cartage (see `cartage_core::raw`):
//! the device's caching allocator names it with a slice of its own (in the cartage block the
//! memory lies in, when it is cartage memory coming back, or else in the allocator's imported
//! segment at its address), so kernels' aliasing and overlap checks apply to it, slices of other
//! allocators are still told apart, and the memory never enters the cache nor its statistics.
//!
//! CUDA: cartage's context is each device's *primary* context (cudarc's `CudaContext::new`
//! retains it), the one the CUDA runtime and so PyTorch use; device pointers pass between them
//! as they are, and the driver is asked whether each imported pointer belongs to the device.
//!
//! From Python, PyTorch's `torch.utils.dlpack.to_dlpack(t)` returns a capsule named
//! `"dltensor"` holding a `DLManagedTensor*`: take the pointer out
//! (`PyCapsule_GetPointer`), rename the capsule `"used_dltensor"`, and pass the pointer to
//! [`Tensor::from_dlpack`]. The other way, wrap [`DlpackTensor::into_raw`]'s pointer in a
//! capsule named `"dltensor"` (whose destructor calls the deleter if the capsule was never
//! consumed) and give it to `torch.from_dlpack`. `examples/dlpack_ffi.rs` and
//! `xtask/python/dlpack_roundtrip.py` do both.
//!
//! [`Tensor::to_dlpack`]: crate::Tensor::to_dlpack
//! [`Tensor::from_dlpack`]: crate::Tensor::from_dlpack
//! [`Tensor::from_dlpack_versioned`]: crate::Tensor::from_dlpack_versioned

pub mod abi;
mod convert;
mod export;
mod import;

pub use abi::{DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
pub use export::DlpackTensor;
pub use import::MAX_DLPACK_NDIM;
