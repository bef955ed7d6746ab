//! The device registry: one backend per device, opened on first use through the backend crate's
//! `open` and cached for the life of the process.
//!
//! A device whose backend feature was not compiled in is [`Error::BackendNotCompiled`] naming the
//! feature; a compiled backend that cannot open the device is [`Error::BackendUnavailable`]. The
//! frontend only ever sees `Arc<dyn Backend>` (invariant 1).

use std::sync::{Arc, Mutex};

use cartage_core::{Backend, Device, DeviceInfo, DeviceKind, Error, Result};

static OPENED: Mutex<Vec<(Device, Arc<dyn Backend>)>> = Mutex::new(Vec::new());

/// The backend that runs `device`, opened on first use and cached.
///
/// ```
/// let cpu = cartage::backend(&cartage::Device::cpu()).unwrap();
/// assert_eq!(cpu.device(), cartage::Device::cpu());
/// ```
pub fn backend(device: &Device) -> Result<Arc<dyn Backend>> {
    let mut opened = OPENED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, backend)) = opened.iter().find(|(d, _)| d == device) {
        return Ok(Arc::clone(backend));
    }
    let backend = open(*device)?;
    tracing::debug!(%device, name = %backend.info().name, "opened backend");
    opened.push((*device, Arc::clone(&backend)));
    Ok(backend)
}

/// The cargo feature of the `cartage` crate that compiles `kind`'s backend in.
pub(crate) const fn feature_of(kind: DeviceKind) -> &'static str {
    kind.name()
}

fn not_compiled(device: Device) -> Error {
    Error::BackendNotCompiled {
        device,
        feature: feature_of(device.kind()),
    }
}

/// Open `device` through its backend crate (not cached).
#[allow(unreachable_code)]
fn open(device: Device) -> Result<Arc<dyn Backend>> {
    match device.kind() {
        DeviceKind::Cpu => {
            #[cfg(feature = "cpu")]
            return cartage_cpu::open(device.ordinal());
            Err(not_compiled(device))
        }
        DeviceKind::Cuda => {
            #[cfg(feature = "cuda")]
            return cartage_cuda::open(device.ordinal());
            Err(not_compiled(device))
        }
        DeviceKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            return cartage_wgpu::open(device.ordinal());
            Err(not_compiled(device))
        }
    }
}

/// How many devices of `kind` the compiled backend sees; `None` when it is not compiled in.
#[allow(unreachable_code)]
fn device_count(kind: DeviceKind) -> Option<Result<usize>> {
    match kind {
        DeviceKind::Cpu => {
            #[cfg(feature = "cpu")]
            return Some(cartage_cpu::device_count());
            None
        }
        DeviceKind::Cuda => {
            #[cfg(feature = "cuda")]
            return Some(cartage_cuda::device_count());
            None
        }
        DeviceKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            return Some(cartage_wgpu::device_count());
            None
        }
    }
}

/// What one backend found: for `cargo xtask devices` and reports.
#[derive(Clone, Debug)]
pub struct BackendStatus {
    /// The backend family.
    pub kind: DeviceKind,
    /// The cargo feature that compiles it in.
    pub feature: &'static str,
    /// Whether this build has it.
    pub compiled: bool,
    /// The devices it opened.
    pub devices: Vec<DeviceInfo>,
    /// Why it found no device, or why a device failed to open (`None` when all is well).
    pub problem: Option<String>,
}

/// Every backend family, compiled in or not, with the devices it found and its problems.
pub fn backend_statuses() -> Vec<BackendStatus> {
    [DeviceKind::Cpu, DeviceKind::Cuda, DeviceKind::Wgpu]
        .into_iter()
        .map(status_of)
        .collect()
}

fn status_of(kind: DeviceKind) -> BackendStatus {
    let mut status = BackendStatus {
        kind,
        feature: feature_of(kind),
        compiled: false,
        devices: Vec::new(),
        problem: None,
    };
    let Some(count) = device_count(kind) else {
        status.problem = Some(format!("not compiled in (enable the `{}` feature)", status.feature));
        return status;
    };
    status.compiled = true;
    let count = match count {
        Ok(n) => n,
        Err(e) => {
            status.problem = Some(e.to_string());
            return status;
        }
    };
    if count == 0 {
        // Opening ordinal 0 is the backend's way of saying why it sees nothing.
        let reason = match backend(&Device::new(kind, 0)) {
            Err(e) => e.to_string(),
            Ok(_) => "the backend reports 0 devices".to_string(),
        };
        status.problem = Some(format!("no device found: {reason}"));
        return status;
    }
    let mut failures = Vec::new();
    for ordinal in 0..count {
        match backend(&Device::new(kind, ordinal)) {
            Ok(b) => status.devices.push(b.info()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    if !failures.is_empty() {
        status.problem = Some(failures.join("; "));
    }
    status
}

/// Every device the compiled-in backends can open, CPU first.
pub fn devices() -> Vec<DeviceInfo> {
    backend_statuses().into_iter().flat_map(|s| s.devices).collect()
}

/// True when a wgpu adapter is a software rasteriser (lavapipe/llvmpipe, SwiftShader, WARP)
/// rather than a GPU: such a device is never picked automatically.
pub fn is_software_adapter(info: &DeviceInfo) -> bool {
    let software_names = ["llvmpipe", "lavapipe", "swiftshader", "software", "warp"];
    let name = info.name.to_ascii_lowercase();
    if software_names.iter().any(|s| name.contains(s)) {
        return true;
    }
    info.details.iter().any(|(key, value)| {
        let (key, value) = (key.to_ascii_lowercase(), value.to_ascii_lowercase());
        key.contains("type") && (value == "cpu" || value.contains("software"))
    })
}
