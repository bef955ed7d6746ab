//! [`GpuContext`]: one wgpu device and queue per adapter, opened with the adapter's real limits
//! and the optional features cartage uses, plus a sink for errors wgpu reports asynchronously.
//!
//! wgpu's default handler panics on an uncaptured error; ours records the message instead, and
//! the next synchronisation point returns it as [`Error::Driver`]. Buffer creation runs inside
//! error scopes (see [`GpuContext::create_buffer`]) so that an exhausted device is
//! `SegmentError::OutOfMemory`, which the caching allocator turns into `Error::OutOfMemory`.

use std::sync::{Arc, Mutex};

use cartage_core::raw::SegmentError;
use cartage_core::{Device, Error, Result};
use wgpu::{Adapter, AdapterInfo, Features, Limits};

/// The optional features cartage asks for when the adapter has them.
pub(crate) const WANTED_FEATURES: Features = Features::SHADER_F16
    .union(Features::TIMESTAMP_QUERY)
    .union(Features::TIMESTAMP_QUERY_INSIDE_ENCODERS)
    .union(Features::SUBGROUP)
    .union(Features::SHADER_F64)
    .union(Features::MAPPABLE_PRIMARY_BUFFERS);

/// The subgroup size for the cooperative-matrix f16 matmul on `adapter`, when it has the
/// experimental feature, a 16 × 16 × 16 configuration with f16 inputs and f32 accumulators, and
/// one subgroup size (the kernel's workgroup is exactly one subgroup); never without SHADER_F16,
/// and never when `CARTAGE_WGPU_COOP=0`.
fn cooperative_f16(adapter: &Adapter, info: &AdapterInfo) -> Option<u32> {
    let off = std::env::var("CARTAGE_WGPU_COOP").is_ok_and(|v| v.trim() == "0");
    let wanted = Features::EXPERIMENTAL_COOPERATIVE_MATRIX | Features::SHADER_F16;
    if off || !adapter.features().contains(wanted) {
        return None;
    }
    let f16_f32 = adapter.cooperative_matrix_properties().iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    });
    let single = info.subgroup_min_size == info.subgroup_max_size && info.subgroup_min_size > 0;
    tracing::debug!(f16_f32, single, "cooperative matrix probe");
    (f16_f32 && single).then_some(info.subgroup_min_size)
}

/// A wgpu device with its queue and what cartage needs to know about it.
pub(crate) struct GpuContext {
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue (cartage uses one, so work runs in submission order).
    pub queue: wgpu::Queue,
    /// The adapter's description.
    pub info: AdapterInfo,
    /// The limits the device was opened with (the adapter's own).
    pub limits: Limits,
    /// The features enabled on the device.
    pub features: Features,
    /// The cartage device this is (`wgpu:N`).
    pub cartage_device: Device,
    /// The subgroup size of the cooperative-matrix f16 matmul, where the adapter has 16 × 16 × 16
    /// f16 → f32 cooperative matrices and a single subgroup size (`None`: the tiled path only).
    pub coop_f16_subgroup: Option<u32>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl GpuContext {
    /// Open a device on `adapter` with the adapter's limits and the wanted features it has.
    pub fn open(adapter: &Adapter, cartage_device: Device) -> Result<Self> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let mut features = adapter.features() & WANTED_FEATURES;
        let coop_f16_subgroup = cooperative_f16(adapter, &info);
        let experimental_features = if coop_f16_subgroup.is_some() {
            features |= Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            // SAFETY: wgpu asks callers of experimental features to accept that their
            // implementation may still have bugs. cartage uses this one feature in one kernel
            // (`shaders/matmul_coop.wgsl`), whose loads and stores stay inside the bound
            // operands by construction (the host checks every size, offset and stride first);
            // `CARTAGE_WGPU_COOP=0` turns it off.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("cartage"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| Error::BackendUnavailable {
                device: cartage_device,
                reason: format!("the adapter `{}` refused to open a device: {e}", info.name),
            })?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&errors);
        let name = info.name.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            tracing::error!(adapter = %name, %error, "wgpu reported an error");
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(error.to_string());
        }));
        tracing::info!(
            device = %cartage_device,
            adapter = %info.name,
            kind = ?info.device_type,
            max_binding = limits.max_storage_buffer_binding_size,
            ?features,
            "wgpu device opened"
        );
        Ok(GpuContext {
            device,
            queue,
            info,
            limits,
            features,
            cartage_device,
            coop_f16_subgroup,
            errors,
        })
    }

    /// True when the device has `feature` enabled.
    pub fn has(&self, feature: Features) -> bool {
        self.features.contains(feature)
    }

    /// The largest byte range one storage binding may cover.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// Alignment of storage-binding offsets (at least 256, which every adapter accepts).
    pub fn binding_alignment(&self) -> u64 {
        u64::from(self.limits.min_storage_buffer_offset_alignment).max(256)
    }

    /// Fail with the first error wgpu reported since the last check, if any.
    pub fn take_errors(&self, op: &'static str) -> Result<()> {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        errors.clear();
        Err(Error::Driver {
            device: self.cartage_device,
            op,
            message,
        })
    }

    /// Create a buffer inside out-of-memory and validation error scopes: an exhausted device is
    /// `SegmentError::OutOfMemory`, any other refusal a typed driver error, never a panic.
    pub fn create_buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> std::result::Result<wgpu::Buffer, SegmentError> {
        self.create_buffer_inner(label, size, usage, false)
    }

    /// [`create_buffer`](Self::create_buffer), mapped at creation (a `MAP_WRITE` buffer ready
    /// for its first write; `size` a multiple of 4).
    pub fn create_buffer_mapped(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> std::result::Result<wgpu::Buffer, SegmentError> {
        self.create_buffer_inner(label, size, usage, true)
    }

    fn create_buffer_inner(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped_at_creation: bool,
    ) -> std::result::Result<wgpu::Buffer, SegmentError> {
        if size > self.limits.max_buffer_size {
            tracing::warn!(
                size,
                max = self.limits.max_buffer_size,
                "buffer larger than the adapter's max_buffer_size"
            );
            return Err(SegmentError::OutOfMemory);
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation,
        });
        let out_of_memory = pollster::block_on(oom.pop());
        let invalid = pollster::block_on(validation.pop());
        if let Some(error) = out_of_memory {
            tracing::warn!(size, %error, "wgpu buffer creation ran out of memory");
            return Err(SegmentError::OutOfMemory);
        }
        if let Some(error) = invalid {
            return Err(SegmentError::Failed(Error::Driver {
                device: self.cartage_device,
                op: "create_buffer",
                message: error.to_string(),
            }));
        }
        Ok(buffer)
    }

    /// Wait for submission `index` (or everything submitted so far).
    pub fn wait_for(&self, index: Option<wgpu::SubmissionIndex>, op: &'static str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: index,
                timeout: None,
            })
            .map_err(|e| Error::Driver {
                device: self.cartage_device,
                op,
                message: e.to_string(),
            })?;
        self.take_errors(op)
    }
}
