//! Adapter enumeration: one wgpu instance per process and its adapters in a stable order.
//!
//! `wgpu:N` is the N-th adapter in this order: discrete GPUs first, then integrated GPUs,
//! virtual GPUs, CPU (software) adapters such as Mesa's lavapipe, and anything else; within one
//! kind, Vulkan before Metal before DX12, then by name and PCI bus id, so that the numbering
//! does not depend on the driver's enumeration order. One GPU seen through two APIs (Vulkan and
//! DX12 on Windows) is listed once, through the earlier API. OpenGL (GLES 3.1 compute through
//! EGL) is a fallback: its adapters are listed only where no other API found one, and only
//! those with compute shaders. wgpu's `WGPU_BACKEND` variable (e.g. `vulkan`, `gl`) narrows the
//! APIs tried. A machine without any of these drivers has no adapters:
//! `device_count()` is 0, never a panic.

use std::sync::OnceLock;

use wgpu::{Adapter, Backend, Backends, DeviceType, DownlevelFlags, Instance, InstanceDescriptor, InstanceFlags};

/// The process-wide instance and its sorted adapters.
pub(crate) struct Adapters {
    /// The instance the adapters came from (kept alive with them).
    _instance: Instance,
    /// Adapters in cartage's documented order.
    pub list: Vec<Adapter>,
}

static ADAPTERS: OnceLock<Option<Adapters>> = OnceLock::new();

/// The rank of an adapter kind in the documented order (lower first).
pub(crate) fn kind_rank(kind: DeviceType) -> u8 {
    match kind {
        DeviceType::DiscreteGpu => 0,
        DeviceType::IntegratedGpu => 1,
        DeviceType::VirtualGpu => 2,
        DeviceType::Cpu => 3,
        DeviceType::Other => 4,
    }
}

/// The rank of a graphics API in the documented order (lower first).
pub(crate) fn backend_rank(backend: Backend) -> u8 {
    match backend {
        Backend::Vulkan => 0,
        Backend::Metal => 1,
        Backend::Dx12 => 2,
        Backend::Gl => 3,
        _ => 4,
    }
}

/// The APIs compiled in whose adapters are listed first.
const PRIMARY: Backends = Backends::VULKAN.union(Backends::METAL).union(Backends::DX12);

/// `list` in the documented order, one entry per physical GPU.
fn sorted(mut list: Vec<Adapter>) -> Vec<Adapter> {
    list.sort_by_cached_key(|a| {
        let info = a.get_info();
        (
            kind_rank(info.device_type),
            backend_rank(info.backend),
            info.name,
            info.device_pci_bus_id,
        )
    });
    let mut seen: Vec<(u32, u32, DeviceType, String)> = Vec::new();
    list.retain(|a| {
        let info = a.get_info();
        // Software adapters have no PCI identity to tell them apart: keep each.
        let identity = (info.vendor, info.device, info.device_type, info.name.clone());
        if info.vendor == 0 || info.device_type == DeviceType::Cpu {
            return true;
        }
        if seen.contains(&identity) {
            return false;
        }
        seen.push(identity);
        true
    });
    list
}

fn enumerate() -> Option<Adapters> {
    let found = std::panic::catch_unwind(|| {
        // `WGPU_BACKEND=vulkan,gl` (wgpu's own variable) narrows the APIs tried.
        let allowed = Backends::from_env().unwrap_or(PRIMARY | Backends::GL);
        let instance = Instance::new(InstanceDescriptor {
            backends: allowed,
            flags: InstanceFlags::empty().with_env(),
            ..InstanceDescriptor::new_without_display_handle()
        });
        let mut list = pollster::block_on(instance.enumerate_adapters(allowed & PRIMARY));
        if list.is_empty() && allowed.contains(Backends::GL) {
            list = pollster::block_on(instance.enumerate_adapters(Backends::GL))
                .into_iter()
                .filter(|a| {
                    a.get_downlevel_capabilities()
                        .flags
                        .contains(DownlevelFlags::COMPUTE_SHADERS)
                })
                .collect();
        }
        Adapters {
            _instance: instance,
            list: sorted(list),
        }
    });
    match found {
        Ok(adapters) => Some(adapters),
        Err(_) => {
            tracing::warn!("wgpu: enumerating adapters panicked; treating this machine as having none");
            None
        }
    }
}

/// The adapters of this process (enumerated once), or `None` when enumeration failed.
pub(crate) fn adapters() -> Option<&'static Adapters> {
    ADAPTERS.get_or_init(enumerate).as_ref()
}

/// How many adapters there are (0 without a driver for any compiled-in API).
pub(crate) fn count() -> usize {
    adapters().map_or(0, |a| a.list.len())
}
