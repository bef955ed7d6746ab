//! [`WgpuBackend`]: the [`Backend`] trait on a wgpu device — memory through core's caching
//! allocator, ops recorded into a shared encoder, copies, read-back, synchronisation and timing.
//!
//! A kernel's structure is checked once, by core's [`Kernel::validate`], right after the
//! capability check; the backend itself checks only what the adapter limits (binding sizes,
//! dispatch sizes, f64 and 16-bit support) and that every range it binds or copies lies inside
//! its segment. Pinned host memory is a persistently mapped wgpu buffer (`mapped`), copied in
//! place; large copies from and to ordinary memory go through rings of mapped staging buffers
//! (`ring`).

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cartage_core::raw::{Allocation, BufferSlice, SegmentError};
use cartage_core::{
    Backend, CachingAllocator, Capabilities, CopyHandle, DType, Device, DeviceInfo, Error, Event, HostStaging, Kernel,
    Layout, PageableBuffer, PinnedBuffer, Result, StagingBuffer, TensorArg,
};

use crate::bindings::{BindGroupCache, BindKey, Window};
use crate::capabilities::{capabilities, refusal};
use crate::context::GpuContext;
use crate::encoder::{ParamBlock, Recorder};
use crate::mapped::{Direction, PinnedBuffers};
use crate::memory::{BufferSource, SegmentTable, allocator_config};
use crate::ops;
use crate::ops::index::IndexChecks;
use crate::ops::matmul::MatmulTiling;
use crate::ops::update_many::{self, TableBuffer};
use crate::pipelines::{PARAM_BYTES, PipelineCache};
use crate::profile::{OpTiming, PendingLaunch};
use crate::readback::{StagingPool, map_and_copy};
use crate::ring::{CHUNK, Rings};
use crate::timing::{WgpuEvent, span};

/// A wgpu adapter as a cartage device (`wgpu:N`).
pub struct WgpuBackend {
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) table: Arc<SegmentTable>,
    pub(crate) bind_groups: Arc<BindGroupCache>,
    pub(crate) pipelines: PipelineCache,
    pub(crate) recorder: Mutex<Recorder>,
    pub(crate) index_checks: Mutex<IndexChecks>,
    pub(crate) tiling: Mutex<Option<MatmulTiling>>,
    /// The tables of the multi-tensor optimizer update.
    pub(crate) many_table: Mutex<TableBuffer>,
    update_many_bindings: std::sync::atomic::AtomicUsize,
    vec4_per_invocation: std::sync::atomic::AtomicU32,
    native_f16: std::sync::atomic::AtomicBool,
    coop: std::sync::atomic::AtomicBool,
    staging: StagingPool,
    pinned: PinnedBuffers,
    rings: Rings,
    allocator: CachingAllocator,
    capabilities: Capabilities,
    /// The launches bracketed while an op profile is open (`None`: not profiling).
    profile: Mutex<Option<Vec<PendingLaunch>>>,
}

impl WgpuBackend {
    /// Open the device of `adapter` as `device`.
    pub(crate) fn new(adapter: &wgpu::Adapter, device: Device) -> Result<Self> {
        let ctx = Arc::new(GpuContext::open(adapter, device)?);
        let table = Arc::new(SegmentTable::default());
        let bind_groups = Arc::new(BindGroupCache::default());
        let source = BufferSource::new(Arc::clone(&ctx), Arc::clone(&table), Arc::clone(&bind_groups));
        let allocator = CachingAllocator::new(device, Box::new(source), allocator_config(&ctx));
        let pipelines = PipelineCache::new(&ctx);
        let recorder = Mutex::new(Recorder::new(&ctx));
        let index_checks = Mutex::new(IndexChecks::new(&ctx, &table));
        let capabilities = capabilities(&ctx);
        let native_f16 = std::sync::atomic::AtomicBool::new(native_f16_default(&ctx));
        let coop = std::sync::atomic::AtomicBool::new(ctx.coop_f16_subgroup.is_some());
        let update_many_bindings = std::sync::atomic::AtomicUsize::new(update_many::binding_cap(&ctx.limits));
        Ok(WgpuBackend {
            ctx,
            table,
            bind_groups,
            pipelines,
            recorder,
            index_checks,
            tiling: Mutex::new(None),
            many_table: Mutex::default(),
            update_many_bindings,
            vec4_per_invocation: std::sync::atomic::AtomicU32::new(4),
            native_f16,
            coop,
            staging: StagingPool::default(),
            pinned: PinnedBuffers::default(),
            rings: Rings::default(),
            allocator,
            capabilities,
            profile: Mutex::new(None),
        })
    }

    pub(crate) fn lock_recorder(&self) -> MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The adapter's description.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.ctx.info
    }

    /// The limits the device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.ctx.limits
    }

    /// The wgpu features enabled on the device.
    pub fn features(&self) -> wgpu::Features {
        self.ctx.features
    }

    /// (dispatches recorded, batches submitted) since the device was opened.
    pub fn dispatch_counters(&self) -> (u64, u64) {
        self.lock_recorder().counters()
    }

    /// Submit recorded work now without waiting for it.
    pub fn submit(&self) {
        self.flush();
    }

    /// Submit a batch once it holds `ops` ops (1..=1024; default 256) rather than only at a sync
    /// point: smaller batches let the device start earlier, larger ones cost fewer submits.
    pub fn set_submit_every(&self, ops: usize) {
        self.lock_recorder().set_submit_every(ops);
    }

    /// Storage buffers one dispatch of the multi-tensor optimizer update binds (the sets'
    /// operand buffers and one table), clamped to 2..= what the adapter allows (at most 32);
    /// returns the value in effect. The default is the most allowed: fewer bindings split a
    /// step into more dispatches (same results).
    ///
    /// ```no_run
    /// let backend = cartage_wgpu::open_wgpu(0)?;
    /// assert_eq!(backend.set_update_many_bindings(1), 2);
    /// # Ok::<(), cartage_core::Error>(())
    /// ```
    pub fn set_update_many_bindings(&self, bindings: usize) -> usize {
        let value = bindings.clamp(2, update_many::binding_cap(&self.ctx.limits));
        self.update_many_bindings
            .store(value, std::sync::atomic::Ordering::Relaxed);
        value
    }

    /// Storage buffers one dispatch of the multi-tensor update binds
    /// ([`set_update_many_bindings`](Self::set_update_many_bindings)).
    pub fn update_many_bindings(&self) -> usize {
        self.update_many_bindings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Vec4 elements each invocation of the vectorised element-wise kernels handles (1 or 4).
    pub fn set_vec4_per_invocation(&self, quads: u32) {
        let value = if quads >= 4 { 4 } else { 1 };
        self.vec4_per_invocation
            .store(value, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn vec4_per_invocation(&self) -> u32 {
        self.vec4_per_invocation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Load f16 operands as the adapter's own `f16` type (`true`) or as packed words converted
    /// bit by bit (`false`). Native loads need the adapter feature SHADER_F16: without it the
    /// packed path stays and this returns `false`. Both paths give bit-identical results; the
    /// default is native where the adapter has the feature, unless the environment variable
    /// `CARTAGE_WGPU_F16` is `packed`.
    pub fn set_native_f16(&self, native: bool) -> bool {
        let value = native && self.ctx.has(wgpu::Features::SHADER_F16);
        self.native_f16.store(value, std::sync::atomic::Ordering::Relaxed);
        value
    }

    /// Run f16 matmuls on cooperative matrices (`true`, where the adapter has them: see
    /// [`has_cooperative_matrices`](Self::has_cooperative_matrices)) or on the tiled kernel
    /// (`false`); returns the path now in effect.
    pub fn set_cooperative_matrices(&self, on: bool) -> bool {
        let value = on && self.ctx.coop_f16_subgroup.is_some();
        self.coop.store(value, std::sync::atomic::Ordering::Relaxed);
        value
    }

    /// True when the adapter has the cooperative matrices the f16 matmul uses (16 × 16 × 16,
    /// f16 inputs, f32 accumulators) and they were not turned off with `CARTAGE_WGPU_COOP=0`.
    pub fn has_cooperative_matrices(&self) -> bool {
        self.ctx.coop_f16_subgroup.is_some()
    }

    /// True when f16 matmuls run on cooperative matrices now.
    pub fn cooperative_matrices(&self) -> bool {
        self.coop.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True when f16 kernels load through the adapter's `f16` type (see
    /// [`set_native_f16`](Self::set_native_f16)).
    pub fn native_f16(&self) -> bool {
        self.native_f16.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Start timing every launched kernel on the device (two timestamp queries around each),
    /// dropping any profile already open; [`finish_op_profile`](Self::finish_op_profile) reads
    /// the times back. Fails when the adapter has no timestamp queries.
    ///
    /// ```no_run
    /// let backend = cartage_wgpu::open_wgpu(0)?;
    /// backend.start_op_profile()?;
    /// // ... run tensor ops on wgpu:0 ...
    /// for row in backend.finish_op_profile()?.iter().take(10) {
    ///     println!("{:>10.3} ms {:>5}× {}", row.total.as_secs_f64() * 1e3, row.calls, row.label);
    /// }
    /// # Ok::<(), cartage_core::Error>(())
    /// ```
    pub fn start_op_profile(&self) -> Result<()> {
        if !self.ctx.has(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(Error::invalid(
                "start_op_profile",
                format!(
                    "{} has no timestamp queries (wgpu feature TIMESTAMP_QUERY), so kernels cannot be timed on it",
                    self.ctx.cartage_device
                ),
            ));
        }
        *self.lock_profile() = Some(Vec::new());
        Ok(())
    }

    /// Close the op profile: wait for the device, read every bracketed launch's time and sum
    /// them per label (op, dtype, operand shapes), largest total first. Empty when no profile
    /// was open.
    pub fn finish_op_profile(&self) -> Result<Vec<OpTiming>> {
        let Some(pending) = self.lock_profile().take() else {
            return Ok(Vec::new());
        };
        self.synchronize()?;
        let mut times = Vec::with_capacity(pending.len());
        for launch in pending {
            times.push((launch.label, self.elapsed(&launch.start, &launch.end)?));
        }
        Ok(crate::profile::aggregate(times))
    }

    fn lock_profile(&self) -> MutexGuard<'_, Option<Vec<PendingLaunch>>> {
        self.profile.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of compute pipelines compiled so far.
    pub fn pipelines_compiled(&self) -> usize {
        self.pipelines.len()
    }

    /// Record a dispatch of `pipeline` over `windows` (storage bindings 1..) with `params`.
    pub(crate) fn record(
        &self,
        pipeline: &wgpu::ComputePipeline,
        windows: &[Window],
        params: &ParamBlock,
        groups: [u32; 3],
    ) -> Result<()> {
        let mut recorder = self.lock_recorder();
        let key = BindKey {
            layout: windows.len(),
            windows: windows.to_vec(),
        };
        let group = self
            .bind_groups
            .get_or_create(key, |key| self.create_bind_group(key, recorder.params_buffer()))?;
        recorder.dispatch(&self.ctx, pipeline, &group, params, groups)
    }

    fn create_bind_group(&self, key: &BindKey, params: &wgpu::Buffer) -> Result<wgpu::BindGroup> {
        let buffers: Vec<wgpu::Buffer> = key
            .windows
            .iter()
            .map(|w| {
                self.table.get(w.segment).ok_or_else(|| {
                    Error::invalid(
                        "launch",
                        format!("segment {} is not held by {}", w.segment, self.ctx.cartage_device),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params,
                offset: 0,
                size: wgpu::BufferSize::new(PARAM_BYTES),
            }),
        }];
        for (i, (w, buffer)) in key.windows.iter().zip(&buffers).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: w.offset,
                    size: wgpu::BufferSize::new(w.size),
                }),
            });
        }
        Ok(self.ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: self.pipelines.layout(key.windows.len()),
            entries: &entries,
        }))
    }

    /// Allocate device scratch memory through the caching allocator (freed by the caller once
    /// the work using it is recorded: the single queue keeps later reuse in order).
    pub(crate) fn scratch(&self, bytes: usize) -> Result<Allocation> {
        self.allocator.alloc(bytes)
    }

    /// Submit what is recorded; the submission index, if anything was.
    pub(crate) fn flush(&self) -> Option<wgpu::SubmissionIndex> {
        self.lock_recorder().submit(&self.ctx)
    }

    /// The segment buffer `slice` lies in, checked to hold the slice's bytes (a slice this
    /// device's allocator did not make, or one of a released segment, is an error).
    fn buffer(&self, slice: &BufferSlice, op: &'static str) -> Result<wgpu::Buffer> {
        let id = slice.segment().id;
        if slice.allocator() != self.allocator.id() {
            return Err(Error::invalid(
                op,
                format!(
                    "the slice was made by another allocator (another device or backend), not by {}'s; \
                     pass memory of this device",
                    self.ctx.cartage_device
                ),
            ));
        }
        let Some(buffer) = self.table.get(id) else {
            return Err(Error::invalid(
                op,
                format!(
                    "segment {id} is not held by {} (freed, or memory of another device)",
                    self.ctx.cartage_device
                ),
            ));
        };
        let end = slice.offset() as u64 + slice.len() as u64;
        if end > buffer.size() {
            return Err(Error::invalid(
                op,
                format!(
                    "bytes {}..{end} lie outside a segment of {} bytes",
                    slice.offset(),
                    buffer.size()
                ),
            ));
        }
        Ok(buffer)
    }

    /// The first `len` bytes of `slice` as a contiguous kernel operand of `dtype`.
    fn bytes_arg(slice: BufferSlice, len: usize, dtype: DType) -> Result<TensorArg> {
        Ok(TensorArg {
            buffer: slice.prefix(len)?,
            layout: Layout::contiguous(&[len / dtype.size_in_bytes()])?,
            dtype,
        })
    }

    fn read_timestamps(&self, start: &wgpu::QuerySet, end: &wgpu::QuerySet) -> Result<(u64, u64)> {
        let resolve = self
            .ctx
            .create_buffer(
                "cartage timestamps",
                512,
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            )
            .map_err(|_| Error::Driver {
                device: self.ctx.cartage_device,
                op: "elapsed",
                message: "could not create the query resolve buffer".into(),
            })?;
        let staging = self.staging.take(&self.ctx, 512).map_err(|_| Error::Driver {
            device: self.ctx.cartage_device,
            op: "elapsed",
            message: "could not create a staging buffer".into(),
        })?;
        let submission = {
            let mut recorder = self.lock_recorder();
            recorder.resolve(&self.ctx, start, 1, &resolve, 0);
            recorder.resolve(&self.ctx, end, 1, &resolve, 256);
            recorder.copy(&self.ctx, &resolve, 0, &staging, 0, 512);
            recorder.submit(&self.ctx)
        };
        let mut bytes = [0u8; 512];
        map_and_copy(&self.ctx, &staging, submission, 512, 0, &mut bytes)?;
        self.staging.give_back(staging);
        let read = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        Ok((read(0), read(256)))
    }

    /// Fail with the first index error a gather or index_select found since the last check.
    fn check_indices(&self) -> Result<()> {
        let mut checks = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.check(self)
    }

    /// Copy `dst.len()` bytes of `buffer` from byte `start` into `dst`: record a copy into a
    /// staging buffer, submit, wait and map it.
    pub(crate) fn read_buffer(
        &self,
        buffer: &wgpu::Buffer,
        start: u64,
        dst: &mut [u8],
        op: &'static str,
    ) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let lo = start / 4 * 4;
        let hi = (start + dst.len() as u64).div_ceil(4) * 4;
        if hi > buffer.size() {
            return Err(Error::invalid(
                op,
                format!("bytes {start}..{hi} lie outside a segment of {} bytes", buffer.size()),
            ));
        }
        if hi - lo > CHUNK {
            self.flush();
            return self.rings.download(self, buffer, lo, (start - lo) as usize, dst);
        }
        let staging = self.staging.take(&self.ctx, hi - lo).map_err(|e| match e {
            SegmentError::Failed(e) => e,
            SegmentError::OutOfMemory => Error::Driver {
                device: self.ctx.cartage_device,
                op,
                message: format!("no host-visible memory for a {}-byte read-back staging buffer", hi - lo),
            },
        })?;
        let submission = {
            let mut recorder = self.lock_recorder();
            recorder.copy(&self.ctx, buffer, lo, &staging, 0, hi - lo);
            recorder.submit(&self.ctx)
        };
        let result = map_and_copy(&self.ctx, &staging, submission, hi - lo, (start - lo) as usize, dst);
        self.staging.give_back(staging);
        result
    }
}

/// Native f16 where the adapter has SHADER_F16, unless `CARTAGE_WGPU_F16=packed`.
fn native_f16_default(ctx: &GpuContext) -> bool {
    let packed = std::env::var("CARTAGE_WGPU_F16").is_ok_and(|v| v.trim().eq_ignore_ascii_case("packed"));
    ctx.has(wgpu::Features::SHADER_F16) && !packed
}

/// Host writes larger than this go through the upload ring rather than `Queue::write_buffer`
/// (which creates a staging buffer per write).
const RING_FROM: u64 = 1 << 20;

/// Refuse host memory pinned for another device, or say whether `host` is pinned for this one.
fn pinned_here(op: &'static str, device: Device, host: &dyn HostStaging) -> Result<bool> {
    match host.pinned_for() {
        None => Ok(false),
        Some(pinned) if pinned == device => Ok(true),
        Some(pinned) => Err(Error::invalid(
            op,
            format!(
                "host memory pinned for {pinned}, used with {device}; allocate it with alloc_pinned on this device"
            ),
        )),
    }
}

/// The error of a copy that moves more bytes than its device range holds.
#[cold]
fn length_error(op: &'static str, needed: usize, available: usize) -> Error {
    Error::invalid(
        op,
        format!("the copy moves {needed} bytes but its device range holds only {available}; pass a range long enough"),
    )
}

impl Backend for WgpuBackend {
    fn device(&self) -> Device {
        self.ctx.cartage_device
    }

    fn info(&self) -> DeviceInfo {
        let info = &self.ctx.info;
        let limits = &self.ctx.limits;
        DeviceInfo {
            device: self.ctx.cartage_device,
            name: info.name.clone(),
            total_memory: None,
            details: vec![
                ("adapter type".into(), format!("{:?}", info.device_type)),
                ("backend".into(), format!("{:?}", info.backend)),
                ("driver".into(), format!("{} {}", info.driver, info.driver_info)),
                ("vendor id".into(), format!("{:#06x}", info.vendor)),
                ("device id".into(), format!("{:#06x}", info.device)),
                (
                    "max storage binding".into(),
                    cartage_core::format_bytes(limits.max_storage_buffer_binding_size),
                ),
                ("max buffer".into(), cartage_core::format_bytes(limits.max_buffer_size)),
                ("features".into(), format!("{:?}", self.ctx.features)),
                ("f16 matmul".into(), self.f16_matmul_path()),
                (
                    "timing".into(),
                    if self.ctx.has(wgpu::Features::TIMESTAMP_QUERY) {
                        "timestamp queries".into()
                    } else {
                        "host clock after synchronisation".into()
                    },
                ),
            ],
        }
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    unsafe fn write(&self, dst: BufferSlice, src: &[u8]) -> Result<()> {
        if src.len() > dst.len() {
            return Err(length_error("write", src.len(), dst.len()));
        }
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        let dst = dst.prefix(n)?;
        let buffer = self.buffer(&dst, "write")?;
        // Work recorded before this write runs before it.
        self.flush();
        let start = dst.offset() as u64;
        let end = start + n as u64;
        let (lo4, hi4) = (start.div_ceil(4) * 4, end / 4 * 4);
        if lo4 < hi4 {
            let from = (lo4 - start) as usize;
            let words = &src[from..from + (hi4 - lo4) as usize];
            if words.len() as u64 > RING_FROM {
                self.rings.upload(self, &buffer, lo4, words)?;
            } else {
                self.ctx.queue.write_buffer(&buffer, lo4, words);
            }
        }
        // Bytes outside whole words are patched by a small kernel (never racing neighbours).
        let mut edges: Vec<(u64, u32, u32)> = Vec::new();
        let mut add_byte = |pos: u64, byte: u8| {
            let word = pos / 4;
            let shift = (pos % 4) * 8;
            match edges.iter_mut().find(|e| e.0 == word) {
                Some(e) => {
                    e.1 |= 0xff << shift;
                    e.2 |= u32::from(byte) << shift;
                }
                None => edges.push((word, 0xff << shift, u32::from(byte) << shift)),
            }
        };
        for pos in start..end.min(lo4.max(start)) {
            add_byte(pos, src[(pos - start) as usize]);
        }
        for pos in hi4.max(lo4).max(start)..end {
            add_byte(pos, src[(pos - start) as usize]);
        }
        if !edges.is_empty() {
            ops::patch::patch_words(self, dst.segment().id, &buffer, &edges)?;
        }
        Ok(())
    }

    unsafe fn read(&self, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len() {
            return Err(length_error("read", dst.len(), src.len()));
        }
        if !dst.is_empty() {
            let buffer = self.buffer(&src.prefix(dst.len())?, "read")?;
            self.read_buffer(&buffer, src.offset() as u64, dst, "read")?;
        }
        self.check_indices()?;
        self.ctx.take_errors("read")
    }

    /// A persistently mapped wgpu buffer (see the crate's `mapped` module); `Unsupported` on
    /// backends other than Vulkan and Metal, or without `MAPPABLE_PRIMARY_BUFFERS`.
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        self.pinned.alloc(&self.ctx, bytes)
    }

    fn alloc_staging(&self, bytes: usize) -> Result<StagingBuffer> {
        if crate::mapped::unavailable(&self.ctx).is_none() {
            self.alloc_pinned(bytes).map(StagingBuffer::Pinned)
        } else {
            PageableBuffer::new(bytes).map(StagingBuffer::Pageable)
        }
    }

    /// Pinned memory of this device is copied by the device straight from its mapped buffer
    /// (tracked by the buffer); ordinary memory is written at once; memory pinned for another
    /// device is refused.
    ///
    /// # Safety
    /// `dst` lies in a live allocation of this backend (the trait's contract).
    unsafe fn write_async<'a>(&self, dst: BufferSlice, src: &'a dyn HostStaging) -> Result<CopyHandle<'a>> {
        let len = dst.len().min(src.len());
        let dst = dst.prefix(len)?;
        let aligned = dst.offset().is_multiple_of(4) && len.is_multiple_of(4);
        if !pinned_here("write_async", self.ctx.cartage_device, src)? || !aligned {
            // SAFETY: the caller guarantees `dst` is live; `as_slice` waits for a copy in flight.
            unsafe { self.write(dst, &src.as_slice()[..len]) }?;
            return Ok(CopyHandle::completed());
        }
        if len == 0 {
            return Ok(CopyHandle::completed());
        }
        let buffer = self.buffer(&dst, "write_async")?;
        let copy = self
            .pinned
            .start(self, src.as_ptr(), Direction::Upload, &buffer, dst.offset() as u64, len)?;
        src.track(copy.clone());
        Ok(CopyHandle::new(copy))
    }

    /// As [`Backend::write_async`], device to host.
    ///
    /// # Safety
    /// `src` lies in a live allocation of this backend (the trait's contract).
    unsafe fn read_async<'a>(&self, src: BufferSlice, dst: &'a mut dyn HostStaging) -> Result<CopyHandle<'a>> {
        let len = src.len().min(dst.len());
        let src = src.prefix(len)?;
        let aligned = src.offset().is_multiple_of(4) && len.is_multiple_of(4);
        if !pinned_here("read_async", self.ctx.cartage_device, dst)? || !aligned {
            // SAFETY: the caller guarantees `src` is live; `as_mut_slice` waits for a copy in
            // flight.
            unsafe { self.read(src, &mut dst.as_mut_slice()[..len]) }?;
            return Ok(CopyHandle::completed());
        }
        if len == 0 {
            return Ok(CopyHandle::completed());
        }
        let buffer = self.buffer(&src, "read_async")?;
        let copy = self.pinned.start(
            self,
            dst.as_ptr(),
            Direction::Download,
            &buffer,
            src.offset() as u64,
            len,
        )?;
        dst.track(copy.clone());
        Ok(CopyHandle::new(copy))
    }

    unsafe fn copy_within(&self, src: BufferSlice, dst: BufferSlice) -> Result<()> {
        if src.len() > dst.len() {
            return Err(length_error("copy_within", src.len(), dst.len()));
        }
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        let dst = dst.prefix(n)?;
        let from = self.buffer(&src, "copy_within")?;
        let to = self.buffer(&dst, "copy_within")?;
        let aligned = src.offset().is_multiple_of(4) && dst.offset().is_multiple_of(4) && n.is_multiple_of(4);
        if aligned && src.segment().id != dst.segment().id {
            self.lock_recorder().copy(
                &self.ctx,
                &from,
                src.offset() as u64,
                &to,
                dst.offset() as u64,
                n as u64,
            );
            return Ok(());
        }
        // Within one segment (or off word boundaries) a copy kernel moves the bytes; `validate`
        // refuses overlapping ranges, which the kernel could not copy without a race.
        let dtype = if aligned { DType::I32 } else { DType::U8 };
        let copy = Kernel::Copy {
            input: Self::bytes_arg(src, n, dtype)?,
            out: Self::bytes_arg(dst, n, dtype)?,
        };
        copy.validate()?;
        ops::launch(self, &copy)
    }

    unsafe fn launch(&self, kernel: &Kernel) -> Result<()> {
        self.check_supported(kernel)?;
        kernel.validate()?;
        if self.lock_profile().is_none() {
            return ops::launch(self, kernel);
        }
        let start = self.record_event()?;
        ops::launch(self, kernel)?;
        let end = self.record_event()?;
        if let Some(pending) = self.lock_profile().as_mut() {
            pending.push(PendingLaunch {
                label: crate::profile::label(kernel),
                start,
                end,
            });
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        let submission = self.flush();
        self.ctx.wait_for(submission, "synchronize")?;
        self.check_indices()
    }

    fn empty_cache(&self) -> Result<usize> {
        self.synchronize()?;
        self.staging.clear();
        self.rings.clear();
        Ok(self.allocator.empty_cache())
    }

    fn record_event(&self) -> Result<Event> {
        if self.ctx.has(wgpu::Features::TIMESTAMP_QUERY) {
            let query_set = self.ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("cartage event"),
                ty: wgpu::QueryType::Timestamp,
                count: 1,
            });
            self.lock_recorder().timestamp(&self.ctx, &query_set, 0);
            Ok(Event::new(WgpuEvent::Timestamp {
                query_set,
                device: self.ctx.cartage_device,
            }))
        } else {
            self.synchronize()?;
            Ok(Event::new(WgpuEvent::Host(Instant::now())))
        }
    }

    fn elapsed(&self, start: &Event, end: &Event) -> Result<Duration> {
        let (Some(a), Some(b)) = (start.downcast_ref::<WgpuEvent>(), end.downcast_ref::<WgpuEvent>()) else {
            return Err(Error::invalid(
                "elapsed",
                "the events were not recorded by a wgpu device",
            ));
        };
        match (a, b) {
            (WgpuEvent::Host(a), WgpuEvent::Host(b)) => Ok(b.saturating_duration_since(*a)),
            (
                WgpuEvent::Timestamp {
                    query_set: qa,
                    device: da,
                },
                WgpuEvent::Timestamp {
                    query_set: qb,
                    device: db,
                },
            ) if *da == self.ctx.cartage_device && *db == self.ctx.cartage_device => {
                let (t0, t1) = self.read_timestamps(qa, qb)?;
                Ok(span(t0, t1, self.ctx.queue.get_timestamp_period()))
            }
            _ => Err(Error::invalid(
                "elapsed",
                format!("both events must come from {}", self.ctx.cartage_device),
            )),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn check_supported(&self, kernel: &Kernel) -> Result<()> {
        let (op, dtype) = (kernel.op(), kernel.dtype());
        if self.capabilities.supports(op, dtype) {
            return Ok(());
        }
        let reason = if !op.defined_for(dtype) {
            "the op is not defined for this dtype on any device"
        } else {
            refusal(op, dtype, self.ctx.has(wgpu::Features::SHADER_F64)).unwrap_or("this backend has no kernel for it")
        };
        Err(Error::unsupported(op.name(), dtype, self.ctx.cartage_device, reason))
    }
}
