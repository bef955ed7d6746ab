//! Helpers shared by the memory, safetensors and loader tests: the devices to run on (the CPU,
//! plus `cuda:0` and `wgpu:0` when compiled in and present, with a loud SKIP line otherwise, or a
//! failure when `CARTAGE_REQUIRE` names the kind) and a lock so that tests measuring a device's
//! memory statistics do not run at the same time as other allocating tests of the same binary.

#![allow(dead_code)]

use std::io::Write;
use std::sync::{Mutex, MutexGuard};

use cartage::{Device, DeviceKind, backend};

static SERIAL: Mutex<()> = Mutex::new(());

/// Hold this while a test allocates or reads memory statistics.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// True when `CARTAGE_REQUIRE` (a comma list such as `cuda,wgpu`) names `kind`.
pub fn required(kind: DeviceKind) -> bool {
    std::env::var("CARTAGE_REQUIRE")
        .map(|v| v.split(',').any(|k| k.trim().eq_ignore_ascii_case(kind.name())))
        .unwrap_or(false)
}

/// Print `SKIP <what>` to the real stderr (not captured by the test harness, so it shows).
pub fn skip(what: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIP {what}");
}

/// The CPU, then every GPU device that opens here. A GPU kind that does not open is skipped
/// with a printed line, or fails the test when `CARTAGE_REQUIRE` names it.
pub fn devices_under_test(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    for device in [Device::cuda(0), Device::wgpu(0)] {
        match backend(&device) {
            Ok(_) => devices.push(device),
            Err(e) => {
                assert!(
                    !required(device.kind()),
                    "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                    device.kind().name()
                );
                cartage_core::testsuite::skip::device_missing(test, &device.to_string(), &e.to_string());
            }
        }
    }
    devices
}

/// A file under the system's temporary folder, unique to this process and name, removed (with
/// its folder, once empty) when dropped.
pub struct TempFile(pub std::path::PathBuf);

impl std::ops::Deref for TempFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A fresh path under the system's temporary folder, unique to this process and `name`.
pub fn temp_path(name: &str) -> TempFile {
    // One folder per file: a test removing its folder never races another test's file.
    let dir = std::env::temp_dir().join(format!("cartage-tests-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary folder");
    TempFile(dir.join(name))
}
