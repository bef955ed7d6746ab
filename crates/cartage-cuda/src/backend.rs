//! [`CudaBackend`]: one CUDA device — its context, a compute stream and a copy stream, the caching
//! allocator over its memory, its kernel modules and its cuBLAS handle — behind core's `Backend`.
//!
//! Streams are ordered by cartage itself (per-segment events, [`crate::ordering`]); cudarc's own
//! per-argument event tracking is switched off, since cartage never hands cudarc a `CudaSlice`.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cartage_core::raw::BufferSlice;
use cartage_core::{
    AllocatorConfig, Backend, CachingAllocator, Capabilities, CopyHandle, DType, Device, DeviceInfo, Error, Event,
    HostStaging, Kernel, MatmulPrecision, NormKind, Op, PinnedBuffer, PoolKind, Result, StagingBuffer, UpdateKind,
};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};

use crate::blas::Blas;
use crate::copies;
use crate::lt_route::{MatmulCounters, MatmulLibrary, MatmulRouting};
use crate::memory::DeviceMemory;
use crate::modules::KernelModules;
use crate::ordering::StreamOrder;
use crate::staging::{StagingPool, TransferStats};
use crate::{driver, events, launch};

/// A CUDA device; obtain it with [`crate::open`].
pub struct CudaBackend {
    pub(crate) device: Device,
    pub(crate) ctx: Arc<CudaContext>,
    /// Kernels, cuBLAS and synchronous copies, in order.
    pub(crate) compute: Arc<CudaStream>,
    /// Asynchronous copies, ordered against `compute` per segment.
    pub(crate) copy: Arc<CudaStream>,
    pub(crate) allocator: CachingAllocator,
    pub(crate) order: Arc<StreamOrder>,
    pub(crate) modules: KernelModules,
    pub(crate) blas: Mutex<Option<Blas>>,
    /// cuBLASLt, its cached plans, the search switch and the counters.
    pub(crate) routing: MatmulRouting,
    pub(crate) staging: StagingPool,
    pub(crate) sm_count: u32,
    pub(crate) compute_capability: (i32, i32),
    precision: Mutex<MatmulPrecision>,
    /// The graph capture running on the compute stream, if any (the `graph` module).
    pub(crate) capture: crate::graph::CaptureSlot,
    /// The cuDNN algorithm search switch (`CudaBackend::set_conv_benchmark`).
    pub(crate) conv_benchmark: AtomicBool,
    /// Index checks read back on the host ([`Backend::launch_waits`]).
    pub(crate) launch_waits: AtomicU64,
    /// Which cuDNN API convolutions may use (`CudaBackend::set_conv_engine_api`).
    pub(crate) conv_api: crate::conv::ApiSwitch,
    /// Which implementation fused attention may use (`CudaBackend::set_attention_api`).
    pub(crate) attention_api: crate::attention_cudnn::AttentionSwitch,
    capabilities: Capabilities,
    info: DeviceInfo,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("device", &self.device).finish()
    }
}

/// The ops and dtypes that run on a device of compute capability `cc`: every defined op, with
/// bf16 matmul from Ampere (8.0) on, and the optional fused kernels built here (attention from
/// Ampere on; the backward kernels, pooling and the optimizer steps for every float dtype). The
/// device-specific fields (memory, timing) are left at their defaults. This is what the ops
/// table in the docs is generated from, without a GPU.
///
/// ```
/// use cartage_core::{DType, Op};
/// assert!(cartage_cuda::capabilities_for((9, 0)).supports(Op::Matmul, DType::BF16));
/// assert!(!cartage_cuda::capabilities_for((7, 5)).supports(Op::Matmul, DType::BF16));
/// assert!(cartage_cuda::capabilities_for((9, 0)).supports(Op::AttentionBackward, DType::F32));
/// assert!(cartage_cuda::capabilities_for((7, 5)).supports(Op::Pool2d(cartage_core::PoolKind::Max), DType::BF16));
/// ```
pub fn capabilities_for(cc: (i32, i32)) -> Capabilities {
    let ampere = cc.0 >= 8;
    let mut caps = Capabilities::all_defined(|op, dtype| op == Op::Matmul && dtype == DType::BF16 && !ampere);
    add_backward_and_update(&mut caps);
    if ampere {
        // The fused flash-attention kernel (mma.sync and cp.async: sm_80 and later).
        for dtype in crate::launch::attention::DTYPES {
            caps.add(Op::Attention, dtype);
            // An additive mask: the kernels' masked variants.
            caps.add(Op::AttentionMask, dtype);
        }
    }
    // The fused linear layer (`crate::linear`, cuBLASLt's bias and activation epilogues), for
    // every dtype with a matmul.
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        if caps.supports(Op::Matmul, dtype) {
            caps.add(Op::Linear, dtype);
        }
    }
    caps
}

/// List the fused backward kernels, pooling and its backward, and the optimizer step
/// (`backward.cu`, `attention_backward.cu`, `pool.cu`, `update.cu`) for the dtypes they are built
/// for.
fn add_backward_and_update(caps: &mut Capabilities) {
    let backward = [Op::SoftmaxBackward, Op::LogSoftmaxBackward, Op::CrossEntropyBackward]
        .into_iter()
        .chain([NormKind::Layer, NormKind::Rms].map(Op::NormBackward));
    for op in backward {
        for dtype in crate::launch::backward::DTYPES {
            caps.add(op, dtype);
        }
    }
    for dtype in crate::launch::attention_backward::DTYPES {
        caps.add(Op::AttentionBackward, dtype);
    }
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        caps.add(Op::GeluBackward, dtype);
    }
    for kind in PoolKind::ALL {
        for dtype in crate::launch::pool::DTYPES {
            caps.add(Op::Pool2d(kind), dtype);
            caps.add(Op::Pool2dBackward(kind), dtype);
        }
    }
    for op in UpdateKind::ALL
        .map(Op::Update)
        .into_iter()
        .chain(UpdateKind::ALL.map(Op::UpdateMany))
    {
        for dtype in crate::launch::update::DTYPES {
            caps.add(op, dtype);
        }
    }
}

impl CudaBackend {
    pub(crate) fn new(ordinal: usize) -> Result<Self> {
        let device = Device::cuda(ordinal);
        let err = |op| driver::error(device, op);
        let ctx = CudaContext::new(ordinal).map_err(err("create context"))?;
        // SAFETY: cartage allocates through cuMemAlloc and never creates cudarc `CudaSlice`s, so
        // no cudarc-tracked buffer exists; cross-stream order is kept by `StreamOrder`.
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx.new_stream().map_err(err("create compute stream"))?;
        let copy = ctx.new_stream().map_err(err("create copy stream"))?;
        let compute_capability = ctx.compute_capability().map_err(err("compute capability"))?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(err("multiprocessor count"))?
            .max(1) as u32;
        let order = Arc::new(StreamOrder::new(device));
        let memory = DeviceMemory::new(device, ctx.clone(), order.clone());
        let allocator = CachingAllocator::new(device, Box::new(memory), AllocatorConfig::default());
        let modules = KernelModules::new(device, ctx.clone(), compute_capability)?;
        let name = ctx.name().unwrap_or_else(|_| "unknown CUDA device".to_string());
        let total = ctx.total_mem().ok().map(|t| t as u64);
        let mut capabilities = Self::capabilities(compute_capability, total);
        crate::conv::add_capabilities(&mut capabilities, compute_capability);
        let driver_version = driver::driver_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "unknown".into());
        let (nv_major, nv_minor) = modules.nvrtc_version();
        let info = DeviceInfo {
            device,
            name,
            total_memory: total,
            details: vec![
                (
                    "compute capability".into(),
                    format!("{}.{}", compute_capability.0, compute_capability.1),
                ),
                ("multiprocessors".into(), sm_count.to_string()),
                ("driver CUDA version".into(), driver_version),
                ("NVRTC".into(), format!("{nv_major}.{nv_minor}")),
                ("kernel architecture".into(), modules.arch().to_string()),
                (
                    "precompiled PTX".into(),
                    if crate::precompiled::covers(compute_capability) {
                        format!(
                            "{} (the driver builds it for this device)",
                            crate::precompiled::PTX_ARCH
                        )
                    } else {
                        format!(
                            "{} does not cover this device: NVRTC builds every module",
                            crate::precompiled::PTX_ARCH
                        )
                    },
                ),
            ],
        };
        let precision = MatmulPrecision::Highest;
        tracing::info!(
            %device,
            name = %info.name,
            matmul_precision = precision.name(),
            "opened {device}: f32 matmul precision is `highest` (true f32); `set_matmul_precision(High)` enables TF32"
        );
        Ok(CudaBackend {
            device,
            ctx,
            compute,
            copy,
            allocator,
            order,
            modules,
            blas: Mutex::new(None),
            routing: MatmulRouting::default(),
            staging: StagingPool::default(),
            sm_count,
            compute_capability,
            precision: Mutex::new(precision),
            capture: Default::default(),
            conv_benchmark: AtomicBool::new(crate::conv::benchmark_from_env()),
            launch_waits: AtomicU64::new(0),
            conv_api: Default::default(),
            attention_api: Default::default(),
            capabilities,
            info,
        })
    }

    fn capabilities(cc: (i32, i32), total: Option<u64>) -> Capabilities {
        let mut caps = capabilities_for(cc);
        caps.max_buffer_bytes = total.unwrap_or(0);
        caps.native_f16 = cc >= (5, 3);
        caps.device_timing = true;
        caps.async_copies = true;
        caps
    }

    /// The kernel modules of this device (compile statistics, cache paths).
    pub fn modules(&self) -> &KernelModules {
        &self.modules
    }

    /// How bytes moved between the host and this device so far: staged, copied by the host,
    /// or copied directly by DMA.
    pub fn transfer_stats(&self) -> TransferStats {
        self.staging.stats()
    }

    /// The stream kernels run on (for CUDA-specific extensions and benchmarks that must order
    /// their own work with cartage's).
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The device's CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Which library plain products run on (CUDA-specific, for A/B measurements; the default
    /// [`MatmulLibrary::Auto`] picks per shape).
    pub fn set_matmul_library(&self, library: MatmulLibrary) {
        tracing::info!(device = %self.device, ?library, "matmul library set");
        self.routing.set_library(library);
    }

    /// The library setting of [`CudaBackend::set_matmul_library`].
    pub fn matmul_library(&self) -> MatmulLibrary {
        self.routing.library()
    }

    /// How many products ran on cuBLASLt and on GemmEx, and how many algorithm searches ran.
    pub fn matmul_counters(&self) -> MatmulCounters {
        self.routing.counters()
    }

    /// Problems (shape, layouts, dtype, precision, epilogue) with a cached cuBLASLt plan or
    /// decision.
    pub fn matmul_cached_problems(&self) -> usize {
        self.routing.cached_problems()
    }

    /// Bind this device's context to the calling thread (cheap when already bound).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver::error(self.device, "bind context"))
    }

    /// The cuBLAS handle, created on first use.
    pub(crate) fn with_blas<T>(&self, f: impl FnOnce(&Blas) -> Result<T>) -> Result<T> {
        let mut slot = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            let blas = Blas::new(self.compute.clone()).map_err(|e| Error::Driver {
                device: self.device,
                op: "create cuBLAS handle",
                message: e.to_string(),
            })?;
            *slot = Some(blas);
        }
        match slot.as_ref() {
            Some(blas) => f(blas),
            None => Err(Error::invalid("matmul", "no cuBLAS handle")),
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            tracing::error!(device = %self.device, error = %e, "synchronize at drop failed");
        }
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        self.device
    }

    /// The device's fixed details, plus where each kernel module came from (or, before its
    /// first use, where it will come from).
    fn info(&self) -> DeviceInfo {
        let mut info = self.info.clone();
        info.details
            .push(("kernel modules".into(), self.modules.origin_summary()));
        info
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// # Safety
    /// `dst` lies in a live allocation of this backend (the trait's contract).
    unsafe fn write(&self, dst: BufferSlice, src: &[u8]) -> Result<()> {
        self.refuse_in_capture("write", "an upload from host memory waits on the host")?;
        // SAFETY: the caller guarantees `dst` is a live block of this device.
        unsafe { copies::write(self, dst, src) }
    }

    /// # Safety
    /// `src` lies in a live allocation of this backend (the trait's contract).
    unsafe fn read(&self, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
        self.refuse_in_capture("read", "a read-back waits for the device on the host")?;
        // SAFETY: the caller guarantees `src` is a live block of this device.
        unsafe { copies::read(self, src, dst) }
    }

    /// # Safety
    /// `src` and `dst` lie in live allocations of this backend (the trait's contract).
    unsafe fn copy_within(&self, src: BufferSlice, dst: BufferSlice) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are live blocks of this device.
        unsafe { copies::copy_within(self, src, dst) }
    }

    /// Capability check, then [`Kernel::validate`] (every structural rule), then the kernel;
    /// the launch code checks only CUDA's own limits (rank, grid, 32-bit cuBLAS sizes).
    ///
    /// # Safety
    /// Every operand lies in a live allocation of this backend, freed only in stream order
    /// afterwards (the trait's contract).
    #[inline]
    unsafe fn launch(&self, kernel: &Kernel) -> Result<()> {
        if self.capture.active() {
            self.check_capturing_thread("launch")?;
            if matches!(kernel, Kernel::Random { .. }) {
                self.refuse_in_capture(
                    "random draw",
                    "its seed would be frozen into the graph and every replay would draw the same numbers",
                )?;
            }
        }
        self.check_supported(kernel)?;
        kernel.validate()?;
        // Kernel launches bind the context themselves (cudarc); the paths that call the driver
        // directly (memset, memcpy, cuBLAS) bind first.
        // SAFETY: the caller guarantees every operand is a live block of this device; the
        // kernel's structure (bounds, alignment, aliasing) was validated above.
        unsafe { launch::launch(self, kernel) }
    }

    /// As [`Backend::launch`], without the read-back of the fault record of index kernels (the
    /// host does not wait): the caller has shown every index to be in range.
    ///
    /// # Safety
    /// As [`Backend::launch`].
    unsafe fn launch_with_indices_in_range(&self, kernel: &Kernel) -> Result<()> {
        // SAFETY: the caller upholds `launch`'s contract.
        launch::index::indices_in_range(|| unsafe { self.launch(kernel) })
    }

    fn launch_waits(&self) -> u64 {
        self.launch_waits.load(Ordering::Relaxed)
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("synchronize", "a synchronisation waits for the device on the host")?;
        self.bind()?;
        self.compute
            .synchronize()
            .map_err(driver::error(self.device, "synchronize"))?;
        self.copy
            .synchronize()
            .map_err(driver::error(self.device, "synchronize"))?;
        self.order.clear_pending();
        Ok(())
    }

    /// Imported memory (DLPack) must be device memory the driver knows, of this device, with
    /// the whole range inside one allocation. The backend's context is the device's *primary*
    /// context (`CudaContext::new` retains it), the one the CUDA runtime and so PyTorch, CuPy and
    /// JAX use, so their device pointers are valid here as they are.
    fn check_external(&self, addr: u64, len: usize) -> Result<()> {
        self.bind()?;
        let (ordinal, start, size) = driver::pointer_range(addr).map_err(|e| {
            Error::invalid(
                "import_external",
                format!(
                    "the CUDA driver does not know address {addr:#x} ({e}): it is not device memory of this process \
                     (host memory? another process's?) or it was freed"
                ),
            )
        })?;
        if usize::try_from(ordinal).ok() != Some(self.device.ordinal()) {
            return Err(Error::invalid(
                "import_external",
                format!(
                    "address {addr:#x} is memory of cuda:{ordinal}, not {}; import it as that device",
                    self.device
                ),
            ));
        }
        let end = addr.checked_add(len as u64);
        if addr < start || end.is_none_or(|end| end > start + size as u64) {
            return Err(Error::invalid(
                "import_external",
                format!(
                    "{len} bytes at {addr:#x} run past the end of the allocation holding them ({size} bytes at \
                     {start:#x}); the shape, strides or byte offset describe more memory than the producer has"
                ),
            ));
        }
        Ok(())
    }

    /// Imported memory goes back to its framework, which may reuse it on its own stream at once:
    /// both of this device's streams are synchronised first (inside a capture, which may not
    /// wait, the graph holds what it uses and nothing is waited for).
    fn release_external(&self, _slice: BufferSlice) {
        if self.capture.active() {
            tracing::warn!(device = %self.device, "imported memory released during a graph capture: not synchronising");
            return;
        }
        if let Err(e) = self.synchronize() {
            tracing::error!(device = %self.device, error = %e, "synchronize before releasing imported memory failed");
        }
    }

    #[cfg(feature = "nccl")]
    fn collective_engine(&self) -> Option<Arc<dyn cartage_core::CollectiveEngine>> {
        Some(Arc::new(crate::nccl::NcclEngine::new()))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        copies::alloc_pinned(self, bytes)
    }

    fn alloc_staging(&self, bytes: usize) -> Result<StagingBuffer> {
        Ok(StagingBuffer::Pinned(self.alloc_pinned(bytes)?))
    }

    /// Memory pinned for this device is copied on the copy stream and tracked by the buffer;
    /// pageable memory is copied synchronously; memory pinned for another device is refused.
    ///
    /// # Safety
    /// `dst` lies in a live allocation of this backend, freed only in stream order (the trait's
    /// contract).
    unsafe fn write_async<'a>(&self, dst: BufferSlice, src: &'a dyn HostStaging) -> Result<CopyHandle<'a>> {
        self.refuse_in_capture(
            "write_async",
            "copies run on the copy stream, which the graph does not record",
        )?;
        // SAFETY: the caller guarantees `dst` is a live block of this device.
        unsafe { copies::write_async(self, dst, src) }
    }

    /// As [`Backend::write_async`], device to host.
    ///
    /// # Safety
    /// `src` lies in a live allocation of this backend (the trait's contract).
    unsafe fn read_async<'a>(&self, src: BufferSlice, dst: &'a mut dyn HostStaging) -> Result<CopyHandle<'a>> {
        self.refuse_in_capture(
            "read_async",
            "copies run on the copy stream, which the graph does not record",
        )?;
        // SAFETY: the caller guarantees `src` is a live block of this device.
        unsafe { copies::read_async(self, src, dst) }
    }

    /// # Safety
    /// `src` lies in a live allocation of this backend and `dst` in one of `dst_backend` (the
    /// trait's contract).
    unsafe fn copy_to_peer(&self, src: BufferSlice, dst_backend: &dyn Backend, dst: BufferSlice) -> Result<bool> {
        self.refuse_in_capture(
            "copy_to_peer",
            "a copy between devices is ordered with events on the host",
        )?;
        // SAFETY: the caller guarantees both ranges are live blocks of their backends.
        unsafe { copies::copy_to_peer(self, src, dst_backend, dst) }
    }

    fn matmul_precision(&self) -> MatmulPrecision {
        *self.precision.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_matmul_precision(&self, precision: MatmulPrecision) -> Result<bool> {
        let has_tf32 = self.compute_capability.0 >= 8;
        let effective = if has_tf32 { precision } else { MatmulPrecision::Highest };
        *self.precision.lock().unwrap_or_else(|p| p.into_inner()) = effective;
        tracing::info!(device = %self.device, requested = precision.name(), effective = effective.name(), "f32 matmul precision set");
        Ok(effective == precision)
    }

    fn matmul_algo_search(&self) -> bool {
        self.routing.search()
    }

    /// cuBLASLt times its candidates once per problem while this is on (the `lt_route` module).
    fn set_matmul_algo_search(&self, on: bool) -> Result<bool> {
        self.routing.set_search(on);
        tracing::info!(device = %self.device, on, "matmul algorithm search set");
        Ok(true)
    }

    fn record_event(&self) -> Result<Event> {
        self.refuse_in_capture("record_event", "timing events are read on the host")?;
        events::record(self)
    }

    fn elapsed(&self, start: &Event, end: &Event) -> Result<Duration> {
        self.refuse_in_capture("elapsed", "reading an event's time waits for the device on the host")?;
        events::elapsed(self, start, end)
    }

    /// A CUDA graph capture of the compute stream (the `graph` module).
    fn begin_capture(&self) -> Result<u64> {
        self.begin_graph_capture()
    }

    /// A CUDA graph capture of the compute stream (the `graph` module).
    fn end_capture(&self) -> Result<Box<dyn cartage_core::CapturedGraph>> {
        self.end_graph_capture()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use cartage_core::{ReduceOp, ScanOp, ScatterMode, UnaryOp};

    use super::*;

    /// The model ops are listed for every dtype they are defined for (and only those).
    #[test]
    fn capabilities_list_the_model_ops() {
        let caps = CudaBackend::capabilities((9, 0), None);
        for dtype in DType::ALL {
            let ops = [
                Op::Unary(UnaryOp::Silu),
                Op::Unary(UnaryOp::Sign),
                Op::Reduce(ReduceOp::Prod),
                Op::Scan(ScanOp::Sum),
                Op::Scan(ScanOp::Prod),
                Op::Sort,
                Op::Scatter(ScatterMode::Assign),
                Op::Scatter(ScatterMode::Add),
                Op::Norm(NormKind::Layer),
                Op::Norm(NormKind::Rms),
                Op::CrossEntropy,
            ];
            for op in ops {
                assert_eq!(caps.supports(op, dtype), op.defined_for(dtype), "{op:?} {dtype}");
            }
        }
        assert!(caps.supports(Op::Sort, DType::Bool) && caps.supports(Op::Scatter(ScatterMode::Add), DType::U8));
        assert!(!caps.supports(Op::CrossEntropy, DType::I32));
    }

    /// The fused backward kernels, pooling and the optimizer step are listed for the four float
    /// dtypes on every device (they need nothing newer than the other kernels), and for nothing
    /// else.
    #[test]
    fn capabilities_list_the_fused_backward_and_update_kernels() {
        let fused = [
            Op::SoftmaxBackward,
            Op::LogSoftmaxBackward,
            Op::CrossEntropyBackward,
            Op::NormBackward(NormKind::Layer),
            Op::NormBackward(NormKind::Rms),
            Op::Update(UpdateKind::Sgd),
            Op::Update(UpdateKind::Adam),
            Op::UpdateMany(UpdateKind::Sgd),
            Op::UpdateMany(UpdateKind::Adam),
            Op::Pool2d(PoolKind::Max),
            Op::Pool2d(PoolKind::Avg),
            Op::Pool2dBackward(PoolKind::Max),
            Op::Pool2dBackward(PoolKind::Avg),
        ];
        for cc in [(7, 5), (9, 0)] {
            let caps = capabilities_for(cc);
            for op in fused {
                assert!(op.optional(), "{op:?}");
                for dtype in DType::ALL {
                    assert_eq!(caps.supports(op, dtype), dtype.is_float(), "{op:?} {dtype} on {cc:?}");
                }
            }
        }
    }
}
