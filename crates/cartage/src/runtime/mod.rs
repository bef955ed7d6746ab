//! The runtime: which devices exist, one backend per device, and what the program has cost.
//!
//! - [`backend`] opens a device's backend on first use and caches it; [`devices`] lists every
//!   device the compiled-in backends can open.
//! - [`DevicePick`] (`Device::pick()`) is the one place that reads `CARTAGE_DEVICE`.
//! - [`memory_stats`], [`empty_cache`], [`reset_peak_memory_stats`] and [`synchronize`] act on
//!   one device; [`stats`] reports host syncs (with call sites) and implicit copies.
//! - [`device_info`], [`device_capabilities`] and the [`DeviceExt`] trait describe a device.
//!
//! There is no "current device": every function here takes the device it acts on.

mod device_info;
mod pick;
mod registry;
mod stats;

pub use device_info::{DeviceExt, device_capabilities, device_info};

pub use pick::{DEVICE_ENV, DevicePick, pick_from, pick_named};
pub use registry::{BackendStatus, backend, backend_statuses, devices, is_software_adapter};
pub use stats::{RuntimeStats, reset_stats, stats};
pub(crate) use stats::{record_host_sync, record_implicit_copy};

use cartage_core::{Device, MatmulPrecision, MemoryStats, PinnedBuffer, Result, StagingBuffer};

/// Wait until all work queued on `device` has finished.
pub fn synchronize(device: &Device) -> Result<()> {
    backend(device)?.synchronize()
}

/// The caching allocator's counters for `device` (allocated, reserved, peaks, counts).
pub fn memory_stats(device: &Device) -> Result<MemoryStats> {
    Ok(backend(device)?.memory_stats())
}

/// Return `device`'s cached free segments to the device; the bytes released.
///
/// It only frees what is cached *and* free: live tensors keep their memory. Call it between
/// phases of a program (after loading, before a large allocation of another kind), not every
/// step: the cache exists so that steady-state allocation costs nothing (R21).
pub fn empty_cache(device: &Device) -> Result<usize> {
    backend(device)?.empty_cache()
}

/// Reset the peak counters of `device` to the current values.
pub fn reset_peak_memory_stats(device: &Device) -> Result<()> {
    backend(device)?.allocator().reset_peaks();
    Ok(())
}

/// Choose the f32 matmul precision of `device`; `Ok(false)` when the device has no faster mode
/// and keeps full f32. The choice is logged.
pub fn set_matmul_precision(device: &Device, precision: MatmulPrecision) -> Result<bool> {
    let applied = backend(device)?.set_matmul_precision(precision)?;
    tracing::info!(%device, precision = precision.name(), applied, "matmul precision");
    Ok(applied)
}

/// Turn `device`'s matmul algorithm search on or off (R32's "algorithm search" switch): while on,
/// the first product of each shape, layout, dtype and precision times the library's best few
/// algorithms on the device (a one-off cost of a few products) and every later product of that
/// kind runs the fastest. `Ok(false)` when the device has no choice of algorithms (the CPU,
/// wgpu) and keeps the search off. The choice is logged. On CUDA, `CARTAGE_MATMUL_SEARCH=1` in
/// the environment turns it on from the start.
///
/// ```
/// let cpu = cartage::Device::cpu();
/// assert!(!cartage::set_matmul_algo_search(&cpu, true)?);
/// assert!(cartage::set_matmul_algo_search(&cpu, false)?);
/// # Ok::<(), cartage::Error>(())
/// ```
pub fn set_matmul_algo_search(device: &Device, on: bool) -> Result<bool> {
    let applied = backend(device)?.set_matmul_algo_search(on)?;
    tracing::info!(%device, on, applied, "matmul algorithm search");
    Ok(applied)
}

/// Allocate `bytes` of pinned (page-locked) host memory for asynchronous copies with `device`.
/// Pinned memory cannot be swapped out: it is counted by [`crate::pinned_bytes_in_use`].
/// On wgpu it is a buffer the driver keeps mapped (Vulkan and Metal). A device with no such
/// memory (the CPU) refuses with [`crate::Error::Unsupported`]; [`alloc_staging`] gives the best
/// memory any device offers.
pub fn alloc_pinned(device: &Device, bytes: usize) -> Result<PinnedBuffer> {
    backend(device)?.alloc_pinned(bytes)
}

/// Host memory to stage copies with `device`: pinned where its driver can lock memory,
/// ordinary (pageable) memory elsewhere; [`StagingBuffer::is_pinned`] tells which.
pub fn alloc_staging(device: &Device, bytes: usize) -> Result<StagingBuffer> {
    backend(device)?.alloc_staging(bytes)
}
