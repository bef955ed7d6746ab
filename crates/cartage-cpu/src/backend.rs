//! [`CpuBackend`]: the host processor as a cartage device.
//!
//! Memory is 64-byte aligned host memory under core's caching allocator; `SegmentHandle.addr` is
//! the host pointer. Copies are `memmove`s checked against the buffer slices. Kernels run
//! synchronously on the calling thread (a private rayon pool for large work), so `synchronize`
//! has nothing to wait for and an event is an `Instant`.
//!
//! # One in-order stream
//! Like a CUDA stream, the device runs one thing at a time: every kernel, write, read and copy
//! holds the device's `stream` lock while it touches memory. A tensor written in place by one
//! thread is therefore never read half-written by another, and a kernel's operands cannot change
//! under it. Large kernels run their parallel loops on the backend's own rayon pool, never on
//! the global one: a thread of the global pool that waits for the lock can then never be needed
//! by the kernel holding it (no deadlock when user code calls cartage from `par_iter`).

use std::any::Any;
use std::time::{Duration, Instant};

use std::sync::{Mutex, MutexGuard, OnceLock};

use cartage_core::raw::BufferSlice;
use cartage_core::{
    AllocatorConfig, Backend, CachingAllocator, Capabilities, DType, Device, DeviceInfo, Error, Event, Kernel,
    NormKind, Op, PoolKind, Result, UpdateKind,
};

use crate::memory::{HostSegments, read_meminfo};
use crate::strided::CHUNK_MIN_ELEMENTS;
use crate::{
    backward_rows, cross_entropy, cross_entropy_backward, elementwise, gelu_backward, host_copy, index, linear, matmul,
    norm, norm_backward, pool, reduce, scan, scatter, softmax, sort, unary, update, update_many,
};

/// The cpu backend. Obtain the shared instance with [`crate::open`].
pub struct CpuBackend {
    allocator: CachingAllocator,
    capabilities: Capabilities,
    name: String,
    /// The device's in-order stream: held while anything touches device memory.
    stream: Mutex<()>,
    /// The pool large kernels run on (built on first use).
    pool: OnceLock<Option<rayon::ThreadPool>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend").field("name", &self.name).finish()
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A backend with its own allocator. Prefer [`crate::open`], which shares one per process.
    pub fn new() -> Self {
        let mut capabilities = Capabilities::all_defined(|_, _| false);
        for op in [Op::SoftmaxBackward, Op::LogSoftmaxBackward, Op::CrossEntropyBackward]
            .into_iter()
            .chain([NormKind::Layer, NormKind::Rms].map(Op::NormBackward))
            .chain(PoolKind::ALL.map(Op::Pool2d))
            .chain(PoolKind::ALL.map(Op::Pool2dBackward))
            .chain(UpdateKind::ALL.map(Op::Update))
            .chain(UpdateKind::ALL.map(Op::UpdateMany))
            .chain([Op::Linear, Op::GeluBackward])
        {
            for dtype in DType::ALL.into_iter().filter(|d| d.is_float()) {
                capabilities.add(op, dtype);
            }
        }
        capabilities.max_buffer_bytes = isize::MAX as u64;
        capabilities.native_f16 = false;
        capabilities.device_timing = true;
        capabilities.async_copies = false;
        CpuBackend {
            allocator: CachingAllocator::new(Device::cpu(), Box::new(HostSegments::new()), AllocatorConfig::default()),
            capabilities,
            name: cpu_model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            stream: Mutex::new(()),
            pool: OnceLock::new(),
        }
    }

    /// Take the device's stream (a panic inside a kernel leaves no broken state behind: the
    /// memory is plain bytes, so a poisoned lock is simply taken over).
    #[inline]
    fn stream(&self) -> MutexGuard<'_, ()> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The backend's rayon pool, with as many threads as the global pool would have; `None` if
    /// the system refused to start threads (kernels then run on the calling thread's pool).
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .thread_name(|i| format!("cartage-cpu-{i}"))
                    .build()
                    .map_err(|e| tracing::warn!(error = %e, "cpu backend: no private thread pool"))
                    .ok()
            })
            .as_ref()
    }

    /// The host pointer of the first byte of `slice`.
    fn host_ptr(slice: BufferSlice) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(slice.addr() as usize)
    }

    /// Run `kernel` (validated, stream held).
    #[inline]
    fn dispatch(kernel: &Kernel) -> Result<()> {
        match kernel {
            Kernel::Binary { op, lhs, rhs, out } => elementwise::binary(*op, lhs, rhs, out),
            Kernel::Unary { op, input, out } => unary::unary(*op, input, out),
            Kernel::Fill { out, value } => elementwise::fill(out, *value),
            Kernel::Arange { out, start, step } => elementwise::arange(out, *start, *step),
            Kernel::Random {
                out,
                distribution,
                seed,
                offset,
            } => elementwise::random(out, *distribution, *seed, *offset),
            Kernel::Cast { input, out } => elementwise::cast(input, out),
            Kernel::Copy { input, out } => elementwise::copy_kernel(input, out),
            Kernel::Compare { op, lhs, rhs, out } => elementwise::compare(*op, lhs, rhs, out),
            Kernel::Where {
                cond,
                on_true,
                on_false,
                out,
            } => elementwise::where_kernel(cond, on_true, on_false, out),
            Kernel::Reduce { op, input, dims, out } => reduce::reduce(*op, input, dims, out),
            Kernel::Softmax {
                input,
                dim,
                log,
                causal,
                out,
            } => softmax::softmax(input, *dim, *log, *causal, out),
            Kernel::Matmul { lhs, rhs, out } => matmul::matmul(lhs, rhs, out),
            Kernel::Gather { input, index, dim, out } => index::gather(input, index, *dim, out),
            Kernel::IndexSelect { input, index, dim, out } => index::index_select(input, index, *dim, out),
            Kernel::Scan { op, input, dim, out } => scan::scan(*op, input, *dim, out),
            Kernel::Sort {
                input,
                dim,
                descending,
                values,
                indices,
            } => sort::sort(input, *dim, *descending, values, indices),
            Kernel::Scatter {
                mode,
                src,
                index,
                dim,
                out,
            } => scatter::scatter(*mode, src, index, *dim, out),
            Kernel::Norm {
                kind,
                input,
                weight,
                bias,
                eps,
                out,
            } => norm::norm(*kind, input, weight.as_ref(), bias.as_ref(), *eps, out),
            Kernel::CrossEntropy {
                logits,
                target,
                ignore_index,
                label_smoothing,
                out,
            } => cross_entropy::cross_entropy(logits, target, *ignore_index, *label_smoothing, out),
            Kernel::SoftmaxBackward {
                output,
                grad,
                dim,
                log,
                out,
            } => backward_rows::softmax_backward(output, grad, *dim, *log, out),
            Kernel::NormBackward(args) => norm_backward::norm_backward(args),
            Kernel::GeluBackward { input, grad, out } => gelu_backward::gelu_backward(input, grad, out),
            Kernel::CrossEntropyBackward {
                logits,
                target,
                grad,
                ignore_index,
                label_smoothing,
                out,
            } => cross_entropy_backward::cross_entropy_backward(
                logits,
                target,
                grad,
                *ignore_index,
                *label_smoothing,
                out,
            ),
            Kernel::Update {
                rule,
                grad,
                state,
                param,
            } => update::update(rule, grad, state, param),
            Kernel::UpdateMany { rule, sets } => update_many::update_many(rule, sets),
            Kernel::Pool2d {
                mode,
                window,
                input,
                out,
                indices,
            } => pool::pool2d(*mode, *window, input, out, indices.as_ref()),
            Kernel::Pool2dBackward {
                mode,
                window,
                grad,
                indices,
                out,
            } => pool::pool2d_backward(*mode, *window, grad, indices.as_ref(), out),
            Kernel::Linear {
                input,
                weight,
                bias,
                activation,
                out,
            } => linear::linear(input, weight, bias.as_ref(), *activation, out),
            Kernel::Conv2d { .. }
            | Kernel::Conv2dBackwardInput { .. }
            | Kernel::Conv2dBackwardWeight { .. }
            | Kernel::Attention { .. }
            | Kernel::AttentionBackward(_) => Err(cartage_core::Error::unsupported(
                kernel.op().name(),
                kernel.dtype(),
                cartage_core::Device::cpu(),
                "no fused kernel here; the frontend composes it from other kernels",
            )),
        }
    }
}

/// True when `kernel` may use more than one thread: anything with an operand of at least
/// `CHUNK_MIN_ELEMENTS` elements, and every matmul large enough to split across threads. Scatter
/// always runs on the calling thread.
#[inline]
fn may_go_parallel(kernel: &Kernel) -> bool {
    match kernel {
        // Only products that will split across threads enter the pool (entering costs µs).
        Kernel::Matmul { lhs, rhs, .. } => matmul::may_use_threads(lhs, rhs),
        // A linear layer is its product and one element-wise pass over the output.
        Kernel::Linear { input, out, .. } => {
            let (m, k) = (input.layout.shape()[0], input.layout.shape()[1]);
            let n = out.layout.shape()[1];
            m * n * k > matmul::SMALL_MATMUL || m * n >= CHUNK_MIN_ELEMENTS
        }
        // Element-wise kernels: the output is as large as any operand.
        Kernel::Fill { out, .. }
        | Kernel::Arange { out, .. }
        | Kernel::Random { out, .. }
        | Kernel::Cast { out, .. }
        | Kernel::Copy { out, .. }
        | Kernel::Unary { out, .. }
        | Kernel::Binary { out, .. }
        | Kernel::Compare { out, .. }
        | Kernel::Where { out, .. }
        | Kernel::GeluBackward { out, .. } => out.layout.numel() >= CHUNK_MIN_ELEMENTS,
        Kernel::Scatter { .. } => false,
        // Many small sets add up: the total decides.
        Kernel::UpdateMany { sets, .. } => {
            sets.iter().map(|s| s.param.layout.numel()).sum::<usize>() >= CHUNK_MIN_ELEMENTS
        }
        // Row kernels (reduce, softmax, scan, sort, norm, cross-entropy) and index kernels: the
        // largest operand decides.
        _ => kernel
            .operand_slots()
            .into_iter()
            .flatten()
            .any(|a| a.layout.numel() >= CHUNK_MIN_ELEMENTS),
    }
}

/// The `model name` line of `/proc/cpuinfo`, where there is one.
fn cpu_model_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

fn length_error(op: &'static str, from: usize, to: usize) -> Error {
    Error::invalid(
        op,
        format!("{from} bytes do not fit in a destination of {to} bytes; check the byte ranges of the copy"),
    )
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::cpu()
    }

    fn info(&self) -> DeviceInfo {
        let mut details = vec![
            ("threads".to_string(), rayon::current_num_threads().to_string()),
            (
                "matmul".to_string(),
                "gemm 0.19 (x86-v4 kernels where available)".to_string(),
            ),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            let features = [
                ("avx2", std::arch::is_x86_feature_detected!("avx2")),
                ("fma", std::arch::is_x86_feature_detected!("fma")),
                ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
                ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ];
            let present: Vec<&str> = features.iter().filter(|f| f.1).map(|f| f.0).collect();
            details.push(("simd".to_string(), present.join(",")));
        }
        DeviceInfo {
            device: Device::cpu(),
            name: self.name.clone(),
            total_memory: read_meminfo().map(|m| m.total),
            details,
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
        let _stream = self.stream();
        // SAFETY: `dst` is a live range of this backend's host memory at least `src.len()` bytes
        // long (the caller's contract); `src` is a host slice that cannot overlap device blocks
        // handed out by the allocator; the stream lock keeps kernels off the range meanwhile.
        unsafe { std::ptr::copy(src.as_ptr(), Self::host_ptr(dst), src.len()) };
        Ok(())
    }

    unsafe fn read(&self, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len() {
            return Err(length_error("read", src.len(), dst.len()));
        }
        let _stream = self.stream();
        // SAFETY: `src` is a live range of this backend's host memory at least `dst.len()` bytes
        // long (the caller's contract; zero-initialised at allocation, so every byte is
        // initialised); the stream lock means no kernel writes it meanwhile, and `dst`, a host
        // slice borrowed mutably, cannot overlap a block the allocator handed out.
        let device = unsafe { std::slice::from_raw_parts(Self::host_ptr(src).cast_const(), dst.len()) };
        host_copy::copy_out(self.pool(), device, dst);
        Ok(())
    }

    unsafe fn copy_within(&self, src: BufferSlice, dst: BufferSlice) -> Result<()> {
        if src.len() > dst.len() {
            return Err(length_error("copy_within", src.len(), dst.len()));
        }
        let _stream = self.stream();
        // SAFETY: both are live ranges of this backend's host memory (the caller's contract);
        // `copy` allows overlap; the stream lock keeps kernels off both ranges meanwhile.
        unsafe { std::ptr::copy(Self::host_ptr(src), Self::host_ptr(dst), src.len()) };
        Ok(())
    }

    #[inline]
    unsafe fn launch(&self, kernel: &Kernel) -> Result<()> {
        self.check_supported(kernel)?;
        kernel.validate()?;
        let _stream = self.stream();
        if may_go_parallel(kernel)
            && let Some(pool) = self.pool()
        {
            pool.install(|| Self::dispatch(kernel))
        } else {
            Self::dispatch(kernel)
        }
    }

    /// Host memory is imported as it is: the CPU reads any address of the process (the caller of
    /// [`cartage_core::DeviceBuffer::import_external`] promises the range is valid). Kernels run
    /// in order while the stream lock is held, so nothing remains to wait for on release.
    fn check_external(&self, addr: u64, len: usize) -> Result<()> {
        if addr == 0 && len > 0 {
            return Err(Error::invalid("import_external", "a null pointer for nonempty memory"));
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn record_event(&self) -> Result<Event> {
        Ok(Event::new(Instant::now()))
    }

    fn elapsed(&self, start: &Event, end: &Event) -> Result<Duration> {
        match (start.downcast_ref::<Instant>(), end.downcast_ref::<Instant>()) {
            (Some(s), Some(e)) => Ok(e.saturating_duration_since(*s)),
            _ => Err(Error::invalid(
                "elapsed",
                "an event recorded by another backend was given to the cpu backend",
            )),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    /// Every op defined for a dtype runs here: the check is the definition itself (no table
    /// lookup on the launch path), equal to `capabilities().supports`.
    #[inline]
    fn check_supported(&self, kernel: &Kernel) -> Result<()> {
        let (op, dtype) = (kernel.op(), kernel.dtype());
        if op.defined_for(dtype) {
            Ok(())
        } else {
            Err(Error::unsupported(
                op.name(),
                dtype,
                Device::cpu(),
                "the op is not defined for this dtype on any device",
            ))
        }
    }
}
