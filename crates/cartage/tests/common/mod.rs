//! Helpers shared by the frontend's integration tests: finding a second device, and skipping
//! loudly (or failing, when `CARTAGE_REQUIRE` names the device kind) when there is none.

#![allow(dead_code)]

use std::io::Write;

use cartage::{Device, DeviceKind, backend};

/// True when `CARTAGE_REQUIRE` (a comma list such as `cuda,wgpu`) names `kind`.
pub fn required(kind: DeviceKind) -> bool {
    std::env::var("CARTAGE_REQUIRE")
        .map(|v| v.split(',').any(|k| k.trim().eq_ignore_ascii_case(kind.name())))
        .unwrap_or(false)
}

/// A device other than the CPU that opens here (`wgpu:0`, else `cuda:0`). When there is none
/// the test prints a SKIP line and returns `None`; it panics instead when `CARTAGE_REQUIRE`
/// names a kind that did not open.
pub fn second_device(test: &str) -> Option<Device> {
    let mut reasons = Vec::new();
    for device in [Device::wgpu(0), Device::cuda(0)] {
        match backend(&device) {
            Ok(_) => return Some(device),
            Err(e) => {
                assert!(
                    !required(device.kind()),
                    "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                    device.kind().name()
                );
                reasons.push(format!("{device}: {e}"));
            }
        }
    }
    skip(&format!("{test}: no device besides the CPU ({})", reasons.join("; ")));
    None
}

/// Every GPU that opens here (`wgpu:0`, `cuda:0`). Each one that does not prints a SKIP line,
/// or panics when `CARTAGE_REQUIRE` names its kind.
pub fn gpu_devices(test: &str) -> Vec<Device> {
    let mut found = Vec::new();
    for device in [Device::wgpu(0), Device::cuda(0)] {
        match backend(&device) {
            Ok(_) => found.push(device),
            Err(e) => {
                assert!(
                    !required(device.kind()),
                    "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                    device.kind().name()
                );
                device_missing(test, &device, &e);
            }
        }
    }
    found
}

/// Report `device` as missing for `test`: one SKIP line per device and test binary.
pub fn device_missing(test: &str, device: &Device, error: &cartage::Error) {
    cartage_core::testsuite::skip::device_missing(test, &device.to_string(), &error.to_string());
}

/// Print `SKIP <what>` to the real stderr (not captured by the test harness, so it shows).
pub fn skip(what: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIP {what}");
}
