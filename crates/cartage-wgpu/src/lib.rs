//! The wgpu backend of cartage: every [`Kernel`](cartage_core::Kernel) as a WGSL compute
//! kernel on any adapter wgpu finds through Vulkan, Metal or DX12, or OpenGL where no other API
//! has one (a discrete GPU, or Mesa's lavapipe on a
//! machine without one).
//!
//! f16 and bf16 live two to a 32-bit word; kernels compute in f32 and round once on store. Where
//! the adapter has SHADER_F16, f16 kernels read through WGSL's `f16` type
//! ([`WgpuBackend::set_native_f16`], `CARTAGE_WGPU_F16=packed` to turn it off), and f16 matmuls
//! run on cooperative matrices where the adapter has them ([`WgpuBackend::set_cooperative_matrices`],
//! `CARTAGE_WGPU_COOP=0`). Pinned host memory ([`cartage_core::Backend::alloc_pinned`])
//! is a mapped wgpu buffer that device copies read and write in place.
//!
//! Entry points: [`device_count`] and [`open`]. `wgpu:N` is the N-th adapter in a stable order
//! — discrete GPUs, integrated GPUs, virtual GPUs, CPU (software) adapters, others; ties by
//! name and PCI bus id (see `adapters`). A machine without a driver has no adapters: `device_count()` is
//! `Ok(0)` and `open` returns [`Error::BackendUnavailable`].
//!
//! Layout of the crate: `adapters` (enumeration), `context` (device, queue, error sink),
//! `memory` (segments under core's caching allocator), `bindings` (binding windows, bind-group
//! cache), `encoder` (batched recording), `pipelines` (compiled-kernel cache), `wgsl` (shader
//! specialisation), `ops/*` (one family of kernels each, sources in `shaders/*.wgsl`),
//! `readback` (staging buffers), `mapped` (pinned host buffers), `ring` (staging rings for
//! large copies), `timing` (events), `capabilities`, and `backend`.

mod adapters;
mod backend;
mod bindings;
mod capabilities;
mod context;
mod encoder;
mod mapped;
mod memory;
mod ops;
mod pipelines;
mod profile;
mod readback;
mod ring;
mod timing;
mod wgsl;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cartage_core::{Backend, Device, Error, Result};

pub use backend::WgpuBackend;
pub use capabilities::capabilities_for;
pub use ops::matmul::MatmulTiling;
pub use profile::OpTiming;

/// The number of wgpu adapters on this machine (0 without a driver; never a panic).
pub fn device_count() -> Result<usize> {
    Ok(adapters::count())
}

static OPENED: OnceLock<Mutex<HashMap<usize, Arc<WgpuBackend>>>> = OnceLock::new();

/// Open adapter `ordinal` as `wgpu:ordinal`; the same `Arc` for the same ordinal within a process.
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>> {
    open_wgpu(ordinal).map(|b| b as Arc<dyn Backend>)
}

/// [`open`], returning the concrete backend (for the wgpu-specific methods).
pub fn open_wgpu(ordinal: usize) -> Result<Arc<WgpuBackend>> {
    let device = Device::wgpu(ordinal);
    let mut opened = OPENED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(backend) = opened.get(&ordinal) {
        return Ok(Arc::clone(backend));
    }
    let Some(list) = adapters::adapters() else {
        return Err(Error::BackendUnavailable {
            device,
            reason: "wgpu could not enumerate adapters (see the log); is a Vulkan loader (or Metal, DX12) available?"
                .into(),
        });
    };
    let Some(adapter) = list.list.get(ordinal) else {
        let reason = if list.list.is_empty() {
            "no wgpu adapter found: install a Vulkan driver (a GPU driver, or Mesa's lavapipe: `apt-get install mesa-vulkan-drivers libvulkan1`) and check `vulkaninfo --summary`".to_string()
        } else {
            format!(
                "only {} wgpu adapter(s) exist (wgpu:0..{}); pick an ordinal below the count",
                list.list.len(),
                list.list.len()
            )
        };
        return Err(Error::BackendUnavailable { device, reason });
    };
    let backend = Arc::new(WgpuBackend::new(adapter, device)?);
    opened.insert(ordinal, Arc::clone(&backend));
    Ok(backend)
}

/// Descriptions of every adapter in cartage's order (name, type, backend), without opening them.
pub fn adapter_names() -> Vec<String> {
    adapters::adapters()
        .map(|a| {
            a.list
                .iter()
                .map(|adapter| {
                    let info = adapter.get_info();
                    format!("{} ({:?}, {:?})", info.name, info.device_type, info.backend)
                })
                .collect()
        })
        .unwrap_or_default()
}
