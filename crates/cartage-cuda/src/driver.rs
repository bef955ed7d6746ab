//! The raw CUDA driver calls cartage makes below cudarc's safe layer, in one place: segment
//! allocation, pinned host memory, copies between raw addresses, peer access, and driver errors
//! turned into cartage's [`Error::Driver`].
//!
//! Device addresses here are `CUdeviceptr`s taken from the caching allocator; with unified
//! addressing a device address can alias host memory, so every call that writes through an
//! address is an `unsafe fn` whose caller proves the range is one it owns.

use std::ffi::c_void;
use std::ptr::NonNull;

use cartage_core::{Device, Error};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdeviceptr, CUstream};

/// A driver error as cartage's [`Error::Driver`], naming the device and what cartage was doing.
pub(crate) fn error(device: Device, op: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Driver {
        device,
        op,
        message: e.to_string(),
    }
}

/// True when `e` is the driver's out-of-memory error.
pub(crate) fn is_out_of_memory(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// The number of devices the driver sees (0 when it cannot initialise, e.g. no GPU).
pub(crate) fn device_count() -> usize {
    if let Err(e) = result::init() {
        tracing::debug!(error = %e, "cuInit failed: 0 CUDA devices");
        return 0;
    }
    result::device::get_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub(crate) fn driver_version() -> Option<(i32, i32)> {
    let mut version = 0i32;
    // SAFETY: writes one integer through a valid pointer; no other precondition.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    status.result().ok().map(|()| (version / 1000, (version % 1000) / 10))
}

/// `cuMemAlloc` of `bytes` in the current context.
pub(crate) fn mem_alloc(bytes: usize) -> Result<CUdeviceptr, DriverError> {
    // SAFETY: allocates fresh device memory; the caller binds the context first.
    unsafe { result::malloc_sync(bytes) }
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] in the current context, is freed once, and no queued work uses it.
pub(crate) unsafe fn mem_free(ptr: CUdeviceptr) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::free_sync(ptr) }
}

/// Free and total memory of the current context's device.
pub(crate) fn mem_info() -> Result<(usize, usize), DriverError> {
    result::mem_get_info()
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context), zeroed; `None` when
/// the driver reported success but returned no memory.
pub(crate) fn host_alloc(bytes: usize) -> Result<Option<NonNull<u8>>, DriverError> {
    let bytes = bytes.max(1);
    // SAFETY: allocates fresh host memory; the caller binds a context first.
    let ptr = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }? as *mut u8;
    let Some(ptr) = NonNull::new(ptr) else {
        return Ok(None);
    };
    // SAFETY: `ptr` is non-null and valid for `bytes` bytes just allocated and not yet shared.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
    Ok(Some(ptr))
}

/// True when `e` from `cuMemHostAlloc` means the size cannot be pinned (no memory, or a size the
/// driver refuses outright), as opposed to a broken driver or context.
pub(crate) fn is_host_alloc_refusal(e: &DriverError) -> bool {
    matches!(
        e.0,
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY | sys::CUresult::CUDA_ERROR_INVALID_VALUE
    )
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`host_alloc`], is freed once, and no copy in flight uses it.
pub(crate) unsafe fn host_free(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::free_host(ptr as *mut c_void) }
}

/// Asynchronous host→device copy of `len` bytes on `stream`.
///
/// # Safety
/// `dst..dst+len` is device memory the caller owns; `src..src+len` stays valid and unmodified
/// until the copy completes on `stream` (for pageable memory, until this call returns).
pub(crate) unsafe fn htod_async(
    dst: CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream) }.result()
}

/// Asynchronous device→host copy of `len` bytes on `stream`.
///
/// # Safety
/// `src..src+len` is device memory the caller owns; `dst..dst+len` is host memory nobody else
/// reads or writes until the copy completes on `stream`.
pub(crate) unsafe fn dtoh_async(
    dst: *mut u8,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream) }.result()
}

/// Asynchronous device→device copy on `stream`.
///
/// # Safety
/// Both ranges are device memory the caller owns, queued in stream order.
pub(crate) unsafe fn dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtod_async(dst, src, len, stream) }
}

/// Asynchronous byte fill on `stream`.
///
/// # Safety
/// `dst..dst+len` is device memory the caller owns.
pub(crate) unsafe fn memset_async(
    dst: CUdeviceptr,
    value: u8,
    len: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memset_d8_async(dst, value, len, stream) }
}

/// Asynchronous copy between two devices' memory on `stream` (a stream of the source context).
///
/// # Safety
/// `src` is memory of `src_ctx`, `dst` of `dst_ctx`, both owned by the caller for `len` bytes,
/// and the destination is not used by other work until the copy completes.
pub(crate) unsafe fn peer_async(
    dst_ctx: sys::CUcontext,
    dst: CUdeviceptr,
    src_ctx: sys::CUcontext,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_peer_async(dst_ctx, dst, src_ctx, src, len, stream) }
}

/// True when `device` can address `peer`'s memory directly.
pub(crate) fn can_access_peer(device: sys::CUdevice, peer: sys::CUdevice) -> bool {
    let mut can = 0i32;
    // SAFETY: writes one integer through a valid pointer; both handles come from the driver.
    let status = unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) };
    status.result().is_ok() && can != 0
}

/// Let the current context address `peer_ctx`'s memory (idempotent).
pub(crate) fn enable_peer_access(peer_ctx: sys::CUcontext) -> Result<(), DriverError> {
    // SAFETY: `peer_ctx` is a live primary context retained by its backend.
    let status = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
    match status {
        sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        other => other.result(),
    }
}

/// True when `ptr` is page-locked host memory known to the driver (a copy from it is truly
/// asynchronous); false for ordinary pageable memory. Uses `cuPointerGetAttributes`, which answers
/// "unknown" for pageable memory instead of returning an error (so memory checkers stay quiet).
pub(crate) fn is_pinned_host(ptr: *const u8) -> bool {
    let mut memory_type: u32 = 0;
    let mut attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut data = [&mut memory_type as *mut u32 as *mut c_void];
    // SAFETY: asks for one attribute of an address; the driver writes one `CUmemorytype` (a u32)
    // through `data[0]`, which points to `memory_type`; the address is only inspected.
    let status = unsafe { sys::cuPointerGetAttributes(1, &mut attribute, data.as_mut_ptr(), ptr as CUdeviceptr) };
    status == sys::CUresult::CUDA_SUCCESS && memory_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// Bytes of the driver's JIT error log kept for a failed [`jit_ptx`].
const JIT_LOG_BYTES: usize = 8 << 10;

/// Compile NUL-terminated `ptx` for the current context's device with the driver's JIT
/// (`cuLinkCreate` … `cuLinkComplete`) and return the CUBIN; `Err` carries the driver's error and
/// its log (e.g. a PTX ISA version newer than this driver knows). The context must be bound.
pub(crate) fn jit_ptx(name: &str, ptx: &[u8]) -> Result<Vec<u8>, String> {
    if ptx.last() != Some(&0) {
        return Err(format!("{name}: the PTX is not NUL-terminated"));
    }
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The driver reads option values as pointer-sized words: a pointer, then a size.
    let mut values = [log.as_mut_ptr().cast::<c_void>(), JIT_LOG_BYTES as *mut c_void];
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: `options` and `values` hold two entries each and outlive the link state (destroyed
    // below, before they drop); the log buffer holds the `JIT_LOG_BYTES` it is declared with.
    unsafe { sys::cuLinkCreate_v2(2, options.as_mut_ptr(), values.as_mut_ptr(), &mut state) }
        .result()
        .map_err(|e| format!("{name}: cuLinkCreate: {e}"))?;
    let log_text = |log: &[u8]| String::from_utf8_lossy(log.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
    let cname = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: `state` is live; `ptx` is NUL-terminated and `ptx.len()` bytes long, read during
    // the call only; `cname` is a C string; no per-input options.
    let added = unsafe {
        sys::cuLinkAddData_v2(
            state,
            sys::CUjitInputType::CU_JIT_INPUT_PTX,
            ptx.as_ptr().cast_mut().cast(),
            ptx.len(),
            cname.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result();
    let linked = added.and_then(|()| {
        let mut cubin: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: `state` is live; the driver writes a pointer to the CUBIN it owns (valid until
        // `cuLinkDestroy`) and its size.
        unsafe { sys::cuLinkComplete(state, &mut cubin, &mut size) }.result()?;
        // SAFETY: `cubin` points to `size` bytes owned by `state`, which is still live; they are
        // copied out before it is destroyed.
        Ok(unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec())
    });
    // SAFETY: `state` came from `cuLinkCreate_v2` and is destroyed once, here.
    if let Err(e) = unsafe { sys::cuLinkDestroy(state) }.result() {
        tracing::warn!(error = %e, "cuLinkDestroy failed");
    }
    linked.map_err(|e| format!("{name}: the driver's JIT refused the PTX: {e}\n{}", log_text(&log)))
}

/// The device ordinal of the memory at `addr` and the allocation holding it (start address and
/// size), from the driver's pointer attributes; an error for an address the driver does not know
/// (not device memory of this process, or freed).
pub(crate) fn pointer_range(addr: CUdeviceptr) -> Result<(i32, CUdeviceptr, usize), DriverError> {
    use sys::CUpointer_attribute as Attr;
    let mut ordinal: i32 = -1;
    let mut start: CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: each call writes one value of the attribute's documented type (int, CUdeviceptr,
    // size_t) through a valid pointer; the driver checks `addr` itself and never dereferences it.
    unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut ordinal).cast(),
            Attr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
        .result()?;
        sys::cuPointerGetAttribute(
            (&raw mut start).cast(),
            Attr::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            addr,
        )
        .result()?;
        sys::cuPointerGetAttribute((&raw mut size).cast(), Attr::CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr).result()?;
    }
    Ok((ordinal, start, size))
}
