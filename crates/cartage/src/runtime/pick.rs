//! `Device::pick()`: the one place in cartage that reads `CARTAGE_DEVICE` (R14, invariant 3).
//!
//! Pick once at program entry and pass the value down:
//! - `CARTAGE_DEVICE` unset (or empty) → the best available device: `cuda:0`, else `wgpu:0` when
//!   its adapter is a real GPU (never a software rasteriser), else `cpu`;
//! - set → that device, or a typed error: [`Error::InvalidDevice`] when it does not parse (a
//!   bare `cuda` asks for an ordinal), [`Error::BackendNotCompiled`] when its feature is off,
//!   [`Error::BackendUnavailable`] when the backend cannot open it.

use cartage_core::{Device, Error, Result};

use super::registry::{backend, is_software_adapter};

/// The environment variable that overrides the automatic choice of device.
pub const DEVICE_ENV: &str = "CARTAGE_DEVICE";

/// Choosing the device at program entry: `use cartage::prelude::*; let d = Device::pick()?;`.
pub trait DevicePick: Sized {
    /// `CARTAGE_DEVICE` if set (checked: it must parse, be compiled in and open), else
    /// [`DevicePick::best_available`]. The choice is logged with `tracing`.
    fn pick() -> Result<Self>;

    /// The best device this machine has: `cuda:0`, else `wgpu:0` on a hardware adapter, else
    /// the CPU. Never reads the environment, never fails.
    fn best_available() -> Self;
}

impl DevicePick for Device {
    fn pick() -> Result<Device> {
        let setting = std::env::var(DEVICE_ENV).ok();
        pick_from(setting.as_deref())
    }

    fn best_available() -> Device {
        match backend(&Device::cuda(0)) {
            Ok(_) => return Device::cuda(0),
            Err(e) => tracing::debug!(device = "cuda:0", error = %e, "not available"),
        }
        match backend(&Device::wgpu(0)) {
            Ok(b) if !is_software_adapter(&b.info()) => return Device::wgpu(0),
            Ok(b) => tracing::debug!(device = "wgpu:0", name = %b.info().name, "skipped: a software adapter"),
            Err(e) => tracing::debug!(device = "wgpu:0", error = %e, "not available"),
        }
        Device::cpu()
    }
}

/// [`DevicePick::pick`] with the value of `CARTAGE_DEVICE` given (`None` when unset): the same
/// checks, without reading the environment.
///
/// ```
/// use cartage::{Device, Error, runtime::pick_from};
/// assert_eq!(pick_from(Some("cpu")).unwrap(), Device::cpu());
/// assert!(matches!(pick_from(Some("cuda")), Err(Error::InvalidDevice { .. })));
/// ```
pub fn pick_from(setting: Option<&str>) -> Result<Device> {
    let Some(text) = setting.map(str::trim).filter(|t| !t.is_empty()) else {
        let device = Device::best_available();
        tracing::info!(%device, "device picked: best available ({DEVICE_ENV} is not set)");
        return Ok(device);
    };
    let device: Device = text.parse().map_err(|e| match e {
        Error::InvalidDevice { input, reason } => Error::InvalidDevice {
            input,
            reason: format!("{reason} (from {DEVICE_ENV})"),
        },
        other => other,
    })?;
    backend(&device)?;
    tracing::info!(%device, "device picked from {DEVICE_ENV}");
    Ok(device)
}
