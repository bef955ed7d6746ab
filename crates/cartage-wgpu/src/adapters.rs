//! Adapter enumeration: one wgpu instance per process and its adapters in a stable order.
//!
//! `wgpu:N` is the N-th adapter in this order: discrete GPUs first, then integrated GPUs,
//! virtual GPUs, CPU (software) adapters such as Mesa's lavapipe, and anything else; within one
//! kind, by name and PCI bus id, so that the numbering does not depend on the driver's
//! enumeration order. Only the Vulkan backend is compiled in. A machine without a Vulkan loader
//! or driver has no adapters: `device_count()` is 0, never a panic.

use std::sync::OnceLock;

use wgpu::{Adapter, Backends, DeviceType, Instance, InstanceDescriptor, InstanceFlags};

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

fn enumerate() -> Option<Adapters> {
    let found = std::panic::catch_unwind(|| {
        let instance = Instance::new(InstanceDescriptor {
            backends: Backends::VULKAN,
            flags: InstanceFlags::empty().with_env(),
            ..InstanceDescriptor::new_without_display_handle()
        });
        let mut list = pollster::block_on(instance.enumerate_adapters(Backends::VULKAN));
        list.sort_by_cached_key(|a| {
            let info = a.get_info();
            (kind_rank(info.device_type), info.name, info.device_pci_bus_id)
        });
        Adapters {
            _instance: instance,
            list,
        }
    });
    match found {
        Ok(adapters) => Some(adapters),
        Err(_) => {
            tracing::warn!("wgpu: enumerating Vulkan adapters panicked; treating this machine as having none");
            None
        }
    }
}

/// The adapters of this process (enumerated once), or `None` when enumeration failed.
pub(crate) fn adapters() -> Option<&'static Adapters> {
    ADAPTERS.get_or_init(enumerate).as_ref()
}

/// How many adapters there are (0 without a Vulkan driver).
pub(crate) fn count() -> usize {
    adapters().map_or(0, |a| a.list.len())
}
