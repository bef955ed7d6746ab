//! Safetensors straight onto a device (LESSONS R18, PyTorch's `map_location`).
//!
//! [`load_safetensors`] reads a `.safetensors` file's header, then streams each tensor from the
//! file through one pinned staging buffer into memory allocated on the target device: the file is
//! never held on the host in full, and no tensor visits another device first. After loading it
//! logs one `tracing` line with the device, the dtypes and the parameter count.
//! [`save_safetensors`] writes tensors from any device the same way in reverse, to a temporary
//! file renamed over the target once complete; [`save_safetensors_with_metadata`] also stores
//! string metadata. [`SafetensorsFile`] opens a file's header alone: its `__metadata__`, its
//! tensors' names, dtypes and shapes, and loading a chosen subset.
//!
//! A header is never trusted: element and byte counts use checked arithmetic, and every byte
//! range must match its shape and dtype, lie inside the file and not overlap another, so a
//! hostile or corrupt file is an [`cartage_core::Error::Format`], never a panic or a huge
//! allocation.
//!
//! Files are compatible with the Python `safetensors` package in both directions. The dtypes are
//! cartage's: f32, f64, f16, bf16, i32, i64, u8 and bool; a file holding another dtype (i8, u16,
//! f8 …) is an [`cartage_core::Error::Format`] naming it.

mod header;
mod load;
mod save;

pub use load::{STAGING_BYTES, SafetensorsFile, load_safetensors};
pub use save::{save_safetensors, save_safetensors_with_metadata};
