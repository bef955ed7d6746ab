//! The [`Backend`] trait: what every device implements — alloc, copy, launch, sync — plus what a
//! user must be able to ask a device (capabilities, memory statistics, device timing).
//!
//! Small on purpose: an op is a [`Kernel`] value given to [`Backend::launch`], not a method.
//! Memory comes from the backend's [`CachingAllocator`], so statistics and `empty_cache` mean the
//! same on every device.

use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use crate::allocator::{Allocation, BufferSlice, CachingAllocator, MemoryStats};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result, Site};
use crate::kernel::{Kernel, Op};
use crate::pinned::{CopyHandle, HostStaging, PageableBuffer, PinnedBuffer, StagingBuffer};

/// Device work recorded once by [`Backend::begin_capture`]/[`Backend::end_capture`] and launched
/// again as one unit: the same kernels on the same memory, so inputs are refreshed by writing
/// into the tensors the capture read, and outputs are read from the tensors it wrote.
pub trait CapturedGraph: Send + Sync {
    /// Queue the captured work again on the device's stream (in stream order, asynchronous).
    fn replay(&self) -> Result<()>;
    /// How many nodes (kernels, copies, memsets) the graph holds.
    fn nodes(&self) -> usize;
}

/// What a device can run, asked up front instead of failing later (R26).
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    supported: HashSet<(Op, DType)>,
    /// Largest single buffer the device can bind, in bytes.
    pub max_buffer_bytes: u64,
    /// True when the device runs f16 arithmetic natively.
    pub native_f16: bool,
    /// True when the device can time work on its own clock (events, timestamp queries).
    pub device_timing: bool,
    /// True when asynchronous copies really overlap with compute.
    pub async_copies: bool,
}

impl Capabilities {
    /// Every op for every dtype it is defined for (see [`Op::defined_for`]), minus `except` and
    /// minus the optional fused kernels ([`Op::optional`]), which a backend adds with
    /// [`Capabilities::add`] where it implements them.
    pub fn all_defined(except: impl Fn(Op, DType) -> bool) -> Self {
        let mut supported = HashSet::new();
        for op in Op::all().into_iter().filter(|op| !op.optional()) {
            for dtype in DType::ALL {
                if op.defined_for(dtype) && !except(op, dtype) {
                    supported.insert((op, dtype));
                }
            }
        }
        Capabilities {
            supported,
            ..Default::default()
        }
    }

    /// List `op` for `dtype` too (an optional fused kernel the backend implements).
    pub fn add(&mut self, op: Op, dtype: DType) {
        self.supported.insert((op, dtype));
    }

    /// True when `op` runs for `dtype` here.
    pub fn supports(&self, op: Op, dtype: DType) -> bool {
        self.supported.contains(&(op, dtype))
    }

    /// The dtypes `op` runs for here.
    pub fn dtypes_for(&self, op: Op) -> Vec<DType> {
        DType::ALL.into_iter().filter(|&d| self.supports(op, d)).collect()
    }

    /// The number of (op, dtype) pairs supported.
    pub fn len(&self) -> usize {
        self.supported.len()
    }

    /// True when nothing is supported.
    pub fn is_empty(&self) -> bool {
        self.supported.is_empty()
    }
}

/// How f32 matrix products may trade precision for speed (LESSONS R32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// True f32 arithmetic (the default everywhere).
    #[default]
    Highest,
    /// TF32 tensor cores for f32 inputs where the device has them (10-bit mantissa products).
    High,
}

impl MatmulPrecision {
    /// `highest` or `high`.
    pub const fn name(self) -> &'static str {
        match self {
            MatmulPrecision::Highest => "highest",
            MatmulPrecision::High => "high",
        }
    }
}

/// A description of a device for reports and `cargo xtask devices`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Its name (`NVIDIA H200`, `llvmpipe (LLVM 15.0.6, 256 bits)`, the CPU model…).
    pub name: String,
    /// Total memory in bytes, where known.
    pub total_memory: Option<u64>,
    /// Backend-specific details (driver version, compute capability, adapter type…).
    pub details: Vec<(String, String)>,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.device, self.name)
    }
}

/// A point on a device's timeline, from [`Backend::record_event`].
pub struct Event {
    inner: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Event")
    }
}

impl Event {
    /// Wrap a backend's event.
    pub fn new(inner: impl Any + Send + Sync) -> Self {
        Event { inner: Box::new(inner) }
    }

    /// The backend's event, if it is of type `T`.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.inner.downcast_ref()
    }
}

/// A device: memory, copies, kernels, synchronisation. Object-safe; the frontend holds
/// `Arc<dyn Backend>` and never looks at the concrete type (invariant 1).
pub trait Backend: Send + Sync + 'static {
    /// This device.
    fn device(&self) -> Device;

    /// Name and details.
    fn info(&self) -> DeviceInfo;

    /// What runs here.
    fn capabilities(&self) -> &Capabilities;

    /// The caching allocator holding this device's memory.
    fn allocator(&self) -> &CachingAllocator;

    /// Allocate `bytes` of device memory; `site` is the creation site reported on OOM.
    fn alloc(&self, bytes: usize, site: Site) -> Result<Allocation> {
        self.allocator().alloc_at(bytes, site)
    }

    /// Give memory back to the cache. Backends that run asynchronously make sure work already
    /// queued on the block finishes before the block is reused (stream order).
    fn free(&self, allocation: Allocation) {
        self.allocator().free(allocation)
    }

    /// Copy host bytes into device memory; returns when `src` may be reused.
    ///
    /// # Safety
    /// `dst` lies in a live allocation of this backend's allocator (not freed, or freed only in
    /// stream order after this call), as [`crate::DeviceBuffer`] guarantees for its own slice.
    unsafe fn write(&self, dst: BufferSlice, src: &[u8]) -> Result<()>;

    /// Copy device memory into host bytes; returns when `dst` holds the data (a host sync).
    ///
    /// # Safety
    /// `src` lies in a live allocation of this backend's allocator.
    unsafe fn read(&self, src: BufferSlice, dst: &mut [u8]) -> Result<()>;

    /// Copy between two ranges of this device's memory (in stream order).
    ///
    /// # Safety
    /// `src` and `dst` lie in live allocations of this backend's allocator.
    unsafe fn copy_within(&self, src: BufferSlice, dst: BufferSlice) -> Result<()>;

    /// Run a kernel (asynchronously where the device is asynchronous). The backend validates
    /// the kernel's structure with [`Kernel::validate`] before touching memory, so a malformed
    /// kernel is an error.
    ///
    /// # Safety
    /// Every operand's buffer lies in a live allocation of this backend's allocator for the
    /// whole call (and, on asynchronous devices, is freed only in stream order afterwards).
    /// The sound way to launch is [`Kernel::run`], which checks exactly that against borrowed
    /// [`crate::DeviceBuffer`]s.
    unsafe fn launch(&self, kernel: &Kernel) -> Result<()>;

    /// [`Backend::launch`] for an index kernel whose indices are all known to lie inside its
    /// [`Kernel::index_bound`] ([`crate::IndexRange`]): an asynchronous backend may launch it
    /// without waiting to read back its fault record. The kernel must still skip an index out
    /// of range. The default launches as usual.
    ///
    /// # Safety
    /// As [`Backend::launch`]; the sound way in is [`Kernel::run_with_index_range`].
    unsafe fn launch_with_indices_in_range(&self, kernel: &Kernel) -> Result<()> {
        // SAFETY: the caller upholds `launch`'s contract.
        unsafe { self.launch(kernel) }
    }

    /// Wait until all queued work on this device has finished.
    fn synchronize(&self) -> Result<()>;

    /// How many launches waited on the host for the device since the backend opened (an index
    /// check read back after its kernel; see [`Kernel::run_with_index_range`] for how to avoid
    /// it). 0 where launches never wait.
    fn launch_waits(&self) -> u64 {
        0
    }

    /// Memory counters (the allocator's).
    fn memory_stats(&self) -> MemoryStats {
        self.allocator().stats()
    }

    /// Return cached free segments to the device; the bytes released.
    fn empty_cache(&self) -> Result<usize> {
        self.synchronize()?;
        Ok(self.allocator().empty_cache())
    }

    /// Allocate page-locked host memory for asynchronous copies with this device (on wgpu, a
    /// buffer the driver keeps mapped, where the API allows it). Devices that have none (the
    /// CPU) refuse with [`Error::Unsupported`]; use [`Backend::alloc_staging`] for the best
    /// memory the device offers.
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        let _ = bytes;
        Err(Error::unsupported_feature(
            "alloc_pinned",
            self.device(),
            "this device's driver cannot page-lock host memory; use alloc_staging() (ordinary memory here)",
        ))
    }

    /// The engine that runs collectives across processes on this device (NCCL on CUDA when built
    /// with the `nccl` feature), or `None` where there is none (the CPU: its in-process engine
    /// is for tests only).
    fn collective_engine(&self) -> Option<std::sync::Arc<dyn crate::collective::CollectiveEngine>> {
        None
    }

    /// Start recording the device work this thread queues into a graph ([`CapturedGraph`]),
    /// until [`Backend::end_capture`]. The device first finishes its queued work; while the
    /// capture runs, allocations come from a private pool of the allocator (returned: its id),
    /// and operations that wait on the host fail with [`Error::GraphCapture`]. Devices without
    /// graphs refuse with [`Error::Unsupported`].
    fn begin_capture(&self) -> Result<u64> {
        Err(Error::unsupported_feature(
            "begin_capture",
            self.device(),
            "this device has no graph capture (CUDA graphs need a CUDA device)",
        ))
    }

    /// End the capture begun by [`Backend::begin_capture`] and build its graph. It always ends
    /// the capture, also when it fails (a capture that an operation invalidated); the private
    /// pool stays reserved until the caller releases it ([`CachingAllocator::release_private_pool`])
    /// once the graph is dropped.
    fn end_capture(&self) -> Result<Box<dyn CapturedGraph>> {
        Err(Error::unsupported_feature(
            "end_capture",
            self.device(),
            "this device has no graph capture",
        ))
    }

    /// Host memory to stage copies with this device: pinned where the driver can lock memory,
    /// ordinary memory elsewhere.
    fn alloc_staging(&self, bytes: usize) -> Result<StagingBuffer> {
        PageableBuffer::new(bytes).map(StagingBuffer::Pageable)
    }

    /// Start copying `src` into device memory; `src` stays borrowed until the handle completes,
    /// and the buffer itself waits for the copy before it can be written or freed, so forgetting
    /// the handle is harmless. Memory pinned for another device is refused.
    ///
    /// # Safety
    /// `dst` lies in a live allocation of this backend's allocator (freed only in stream order).
    unsafe fn write_async<'a>(&self, dst: BufferSlice, src: &'a dyn HostStaging) -> Result<CopyHandle<'a>> {
        let len = dst.len().min(src.len());
        let dst = dst.prefix(len)?;
        // SAFETY: the caller guarantees `dst` is live; `src` is borrowed for the call.
        unsafe { self.write(dst, &src.as_slice()[..len]) }?;
        Ok(CopyHandle::completed())
    }

    /// Start copying device memory into `dst`; `dst` stays borrowed until the handle completes,
    /// and the buffer waits for the copy before it can be read, written or freed.
    ///
    /// # Safety
    /// `src` lies in a live allocation of this backend's allocator.
    unsafe fn read_async<'a>(&self, src: BufferSlice, dst: &'a mut dyn HostStaging) -> Result<CopyHandle<'a>> {
        let len = src.len().min(dst.len());
        let src = src.prefix(len)?;
        // SAFETY: the caller guarantees `src` is live; `dst` is borrowed mutably for the call.
        unsafe { self.read(src, &mut dst.as_mut_slice()[..len]) }?;
        Ok(CopyHandle::completed())
    }

    /// Copy from this device straight into another device's memory (peer copy), when the two
    /// can; `Ok(false)` when they cannot and the caller should stage through the host.
    ///
    /// # Safety
    /// `src` lies in a live allocation of this backend, `dst` in a live allocation of
    /// `dst_backend`.
    unsafe fn copy_to_peer(&self, _src: BufferSlice, _dst_backend: &dyn Backend, _dst: BufferSlice) -> Result<bool> {
        Ok(false)
    }

    /// The f32 matmul precision in effect on this device.
    fn matmul_precision(&self) -> MatmulPrecision {
        MatmulPrecision::Highest
    }

    /// Choose the f32 matmul precision; devices without a faster mode keep `Highest` and
    /// return `Ok(false)`.
    fn set_matmul_precision(&self, precision: MatmulPrecision) -> Result<bool> {
        Ok(precision == MatmulPrecision::Highest)
    }

    /// Whether matmul times its library's candidate algorithms before choosing one.
    fn matmul_algo_search(&self) -> bool {
        false
    }

    /// Turn the matmul algorithm search on or off (R32's "algorithm search" switch). When on, the
    /// first product of each shape, layout, dtype and precision times the library's best few
    /// candidates on the device and keeps the fastest for every later product of that kind;
    /// when off, the library's heuristic picks without timing. Devices without a choice of
    /// algorithms keep it off and return `Ok(false)`.
    fn set_matmul_algo_search(&self, on: bool) -> Result<bool> {
        Ok(!on)
    }

    /// Check that `len` bytes at `addr` (a host pointer on the CPU, a device pointer on CUDA) can
    /// be imported as memory of this device ([`crate::DeviceBuffer::import_external`], DLPack):
    /// CUDA asks the driver whether the pointer belongs to this device. Devices that cannot take
    /// foreign memory (wgpu: buffers are objects, not addresses) refuse with
    /// [`Error::Unsupported`], the default.
    fn check_external(&self, addr: u64, len: usize) -> Result<()> {
        let _ = (addr, len);
        Err(Error::unsupported_feature(
            "import_external",
            self.device(),
            "this device cannot use memory it did not allocate; import on the cpu or a CUDA device",
        ))
    }

    /// Called when the last owner of imported memory (`slice`) lets go, before the memory goes
    /// back to the framework that lent it: the device finishes every queued use of it (CUDA
    /// synchronises its streams; the CPU runs in order and has nothing to wait for).
    fn release_external(&self, slice: BufferSlice) {
        let _ = slice;
    }

    /// Record an event on the device's timeline.
    fn record_event(&self) -> Result<Event>;

    /// Time between two recorded events, on the device's clock (waits for `end`).
    fn elapsed(&self, start: &Event, end: &Event) -> Result<Duration>;

    /// The concrete backend, for backend-specific extensions (never used by the frontend).
    fn as_any(&self) -> &dyn Any;

    /// Fail with [`Error::Unsupported`] unless `kernel` runs here.
    fn check_supported(&self, kernel: &Kernel) -> Result<()> {
        let (op, dtype) = (kernel.op(), kernel.dtype());
        if self.capabilities().supports(op, dtype) {
            Ok(())
        } else {
            let reason = if op.defined_for(dtype) {
                "this backend has no kernel for it"
            } else {
                "the op is not defined for this dtype on any device"
            };
            Err(Error::unsupported(op.name(), dtype, self.device(), reason))
        }
    }
}
