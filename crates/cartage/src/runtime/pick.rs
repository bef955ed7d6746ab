//! `Device::pick()`: the one place in cartage that reads `CARTAGE_DEVICE` (R14, invariant 3).
//!
//! Pick once at program entry and pass the value down:
//! - `CARTAGE_DEVICE` unset (or empty) → the best available device: `cuda:0`, else `wgpu:0` when
//!   its adapter is a real GPU (never a software rasteriser), else `cpu`;
//! - set → that device, or a typed error: [`Error::InvalidDevice`] when it does not parse (a
//!   bare `cuda` asks for an ordinal), [`Error::BackendNotCompiled`] when its feature is off,
//!   [`Error::BackendUnavailable`] when the backend cannot open it.
//!
//! In a distributed run, `LOCAL_RANK` (set by torchrun or `cargo xtask launch`) chooses this
//! rank's device among the node's: the ordinal of the device chosen above moves up by the local
//! rank (`cuda:0` becomes `cuda:<LOCAL_RANK>`; `CARTAGE_DEVICE=cuda:2` with two ranks gives
//! `cuda:2` and `cuda:3`); the CPU stays the CPU. A malformed `LOCAL_RANK` is
//! [`Error::InvalidDevice`]; an ordinal beyond the node's devices is
//! [`Error::BackendUnavailable`] naming `LOCAL_RANK`. A value of either variable that is not
//! UTF-8 is an [`Error::InvalidDevice`] naming it (never read as unset).

use cartage_core::{Device, Error, Result};

use super::registry::{backend, is_software_adapter};
use crate::distributed::env::LOCAL_RANK_ENV;

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

    /// Open this device's backend now (once per process; later calls are free), or say why it
    /// cannot: [`Error::BackendNotCompiled`] when its feature is off,
    /// [`Error::BackendUnavailable`] when the driver or the device is missing. Ops open their
    /// device on first use anyway; `ensure` moves that check (and its cost) to program entry.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// Device::cpu().ensure()?;
    /// assert!(Device::cuda(4096).ensure().is_err());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    fn ensure(&self) -> Result<()>;
}

impl DevicePick for Device {
    fn pick() -> Result<Device> {
        let setting = env_text(DEVICE_ENV)?;
        let local_rank = env_text(LOCAL_RANK_ENV)?;
        pick_for_local_rank(setting.as_deref(), local_rank.as_deref())
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

    fn ensure(&self) -> Result<()> {
        backend(self).map(drop)
    }
}

/// The value of the variable `name` (`None` when unset); [`Error::InvalidDevice`] naming it when
/// it is not UTF-8, where `std::env::var(..).ok()` would silently read it as unset.
fn env_text(name: &str) -> Result<Option<String>> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(value) => match value.into_string() {
            Ok(text) => Ok(Some(text)),
            Err(raw) => Err(Error::InvalidDevice {
                input: format!("{name}={}", raw.to_string_lossy()),
                reason: format!(
                    "{name} is not valid UTF-8 (the replacement characters show where): check how it is set"
                ),
            }),
        },
    }
}

/// [`DevicePick::pick`] with the value of `CARTAGE_DEVICE` given (`None` when unset): the same
/// checks, without reading the environment; errors name `CARTAGE_DEVICE` as the value's source.
/// For a value from elsewhere (a command-line flag, a config file), use [`pick_named`].
///
/// ```
/// use cartage::{Device, Error, runtime::pick_from};
/// assert_eq!(pick_from(Some("cpu")).unwrap(), Device::cpu());
/// assert!(matches!(pick_from(Some("cuda")), Err(Error::InvalidDevice { .. })));
/// ```
pub fn pick_from(setting: Option<&str>) -> Result<Device> {
    pick_named(setting, DEVICE_ENV)
}

/// [`pick_from`] for a value that came from `source` (`"--device"`, say): a bad value's error
/// names `source`, not `CARTAGE_DEVICE`. `None` (or an empty value) picks the best available
/// device.
///
/// ```
/// use cartage::{Error, runtime::pick_named};
/// match pick_named(Some("cuda"), "--device") {
///     Err(Error::InvalidDevice { reason, .. }) => {
///         assert!(reason.contains("--device") && !reason.contains("CARTAGE_DEVICE"));
///     }
///     other => panic!("{other:?}"),
/// }
/// ```
pub fn pick_named(setting: Option<&str>, source: &str) -> Result<Device> {
    let Some(text) = setting.map(str::trim).filter(|t| !t.is_empty()) else {
        let device = Device::best_available();
        tracing::info!(%device, "device picked: best available (no device was named)");
        return Ok(device);
    };
    let device: Device = text.parse().map_err(|e| match e {
        Error::InvalidDevice { input, reason } => Error::InvalidDevice {
            input,
            reason: format!("{reason} (from {source})"),
        },
        other => other,
    })?;
    backend(&device)?;
    tracing::info!(%device, "device picked from {source}");
    Ok(device)
}

/// [`pick_from`], then this rank's device when `local_rank` (the value of `LOCAL_RANK`) is set:
/// the chosen device's ordinal moves up by the local rank; the CPU stays the CPU.
fn pick_for_local_rank(setting: Option<&str>, local_rank: Option<&str>) -> Result<Device> {
    let Some(text) = local_rank.map(str::trim).filter(|t| !t.is_empty()) else {
        return pick_from(setting);
    };
    let rank: usize = text.parse().map_err(|_| Error::InvalidDevice {
        input: format!("{LOCAL_RANK_ENV}={text}"),
        reason: format!("{LOCAL_RANK_ENV} must be a non-negative integer (torchrun and `cargo xtask launch` set it)"),
    })?;
    let base = pick_from(setting)?;
    if base.is_cpu() || rank == 0 {
        return Ok(base);
    }
    let Some(ordinal) = base.ordinal().checked_add(rank) else {
        return Err(Error::InvalidDevice {
            input: format!("{LOCAL_RANK_ENV}={rank}"),
            reason: format!("{base} moved up by {LOCAL_RANK_ENV}={rank} is past any device ordinal"),
        });
    };
    let device = Device::new(base.kind(), ordinal);
    backend(&device).map_err(|e| match e {
        Error::BackendUnavailable { device, reason } => Error::BackendUnavailable {
            device,
            reason: format!(
                "{reason} (this rank's device is {base} moved up by {LOCAL_RANK_ENV}={rank}: start at most as many \
                 ranks per node as it has devices)"
            ),
        },
        other => other,
    })?;
    tracing::info!(%device, local_rank = rank, "device picked for this rank ({LOCAL_RANK_ENV})");
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_rank_moves_the_ordinal_and_leaves_the_cpu() {
        assert_eq!(pick_for_local_rank(Some("cpu"), Some("3")).unwrap(), Device::cpu());
        assert_eq!(pick_for_local_rank(Some("cpu"), None).unwrap(), Device::cpu());
        assert_eq!(pick_for_local_rank(Some("cpu"), Some(" ")).unwrap(), Device::cpu());
        let err = pick_for_local_rank(Some("cpu"), Some("one")).unwrap_err();
        assert!(matches!(err, Error::InvalidDevice { .. }), "{err}");
        assert!(err.to_string().contains("LOCAL_RANK=one"), "{err}");
        // A GPU ordinal past the machine's devices names LOCAL_RANK (or the backend is not
        // compiled in at all).
        match pick_for_local_rank(Some("wgpu:0"), Some("999")) {
            Err(Error::BackendUnavailable { device, reason }) => {
                if reason.contains("LOCAL_RANK") {
                    assert_eq!(device, Device::wgpu(999), "{reason}");
                }
            }
            Err(Error::BackendNotCompiled { .. }) => {}
            other => panic!("expected an unavailable device, got {other:?}"),
        }
    }
}
