//! Loud skips that stay readable: when a device is missing, a test binary prints one `SKIP`
//! line for it — naming the device, the first test that wanted it, why it did not open and how
//! to get it — instead of one line per test. With `CARTAGE_REQUIRE` naming the device's kind the
//! callers fail instead of skipping (see [`super::harness::on_unavailable`]).

use std::io::Write;
use std::sync::Mutex;

/// The devices already reported by this process.
static REPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What to install or enable to get a device of `kind` (`cuda`, `wgpu`).
pub fn how_to_get(kind: &str) -> &'static str {
    match kind {
        "cuda" => "needs an NVIDIA GPU with its driver (libcuda) and the `cuda` feature",
        "wgpu" => {
            "needs a Vulkan, Metal or DX12 adapter (on Linux without a GPU: Mesa's lavapipe, \
                   `apt-get install mesa-vulkan-drivers`) and the `wgpu` feature"
        }
        _ => "needs that device",
    }
}

/// Report that `device` (`wgpu:0`, `cuda:0`) is missing for `test`, once per device and
/// process, past the test harness's capture. Returns true when this call printed the line.
pub fn device_missing(test: &str, device: &str, reason: &str) -> bool {
    let mut reported = REPORTED.lock().unwrap_or_else(|p| p.into_inner());
    if reported.iter().any(|d| d == device) {
        return false;
    }
    reported.push(device.to_string());
    let kind = device.split(':').next().unwrap_or(device);
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIP {device} for every test of this binary (first: {test}): {reason}\n     \
         ({}; set CARTAGE_REQUIRE={kind} to fail instead of skipping)",
        how_to_get(kind)
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_reported_once_per_process() {
        assert!(device_missing("first_test", "test-device:7", "no such thing"));
        assert!(!device_missing("second_test", "test-device:7", "no such thing"));
        assert!(device_missing("first_test", "test-device:8", "no such thing"));
        assert!(how_to_get("wgpu").contains("lavapipe"));
    }
}
