//! [`CpuBackend`]: the host processor as a cartage device.
//!
//! Memory is 64-byte aligned host memory under core's caching allocator; `SegmentHandle.addr` is
//! the host pointer. Copies are `memmove`s checked against the buffer slices. Kernels run
//! synchronously on the calling thread (rayon for large work), so `synchronize` has nothing to
//! wait for and an event is an `Instant`.

use std::any::Any;
use std::time::{Duration, Instant};

use cartage_core::{
    AllocatorConfig, Backend, BufferSlice, CachingAllocator, Capabilities, Device, DeviceInfo, Error, Event, Kernel,
    Result,
};

use crate::memory::{HostSegments, read_meminfo};
use crate::{elementwise, index, matmul, reduce, softmax, validate};

/// The cpu backend. Obtain the shared instance with [`crate::open`].
pub struct CpuBackend {
    allocator: CachingAllocator,
    capabilities: Capabilities,
    name: String,
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
        capabilities.max_buffer_bytes = isize::MAX as u64;
        capabilities.native_f16 = false;
        capabilities.device_timing = true;
        capabilities.async_copies = false;
        CpuBackend {
            allocator: CachingAllocator::new(Device::cpu(), Box::new(HostSegments::new()), AllocatorConfig::default()),
            capabilities,
            name: cpu_model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        }
    }

    /// The host pointer of the first byte of `slice`.
    fn host_ptr(slice: BufferSlice) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(slice.addr() as usize)
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

    fn write(&self, dst: BufferSlice, src: &[u8]) -> Result<()> {
        if src.len() > dst.len {
            return Err(length_error("write", src.len(), dst.len));
        }
        // SAFETY: `dst` is a live range of this backend's host memory at least `src.len()` bytes
        // long; `src` is a host slice that cannot overlap device blocks handed out by the allocator.
        unsafe { std::ptr::copy(src.as_ptr(), Self::host_ptr(dst), src.len()) };
        Ok(())
    }

    fn read(&self, src: BufferSlice, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len {
            return Err(length_error("read", src.len, dst.len()));
        }
        // SAFETY: `src` is a live range of this backend's host memory at least `dst.len()` bytes
        // long (zero-initialised at allocation, so every byte is initialised).
        unsafe { std::ptr::copy(Self::host_ptr(src), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy_within(&self, src: BufferSlice, dst: BufferSlice) -> Result<()> {
        if src.len > dst.len {
            return Err(length_error("copy_within", src.len, dst.len));
        }
        // SAFETY: both are live ranges of this backend's host memory; `copy` allows overlap.
        unsafe { std::ptr::copy(Self::host_ptr(src), Self::host_ptr(dst), src.len) };
        Ok(())
    }

    #[inline]
    fn launch(&self, kernel: &Kernel) -> Result<()> {
        kernel.check_bounds()?;
        self.check_supported(kernel)?;
        validate::check(kernel)?;
        match kernel {
            Kernel::Binary { op, lhs, rhs, out } => elementwise::binary(*op, lhs, rhs, out),
            Kernel::Unary { op, input, out } => elementwise::unary(*op, input, out),
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
            Kernel::Softmax { input, dim, log, out } => softmax::softmax(input, *dim, *log, out),
            Kernel::Matmul { lhs, rhs, out } => matmul::matmul(lhs, rhs, out),
            Kernel::Gather { input, index, dim, out } => index::gather(input, index, *dim, out),
            Kernel::IndexSelect { input, index, dim, out } => index::index_select(input, index, *dim, out),
        }
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
