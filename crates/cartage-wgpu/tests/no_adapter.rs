//! Without a driver the backend reports zero adapters and a typed error, never a panic (Vulkan
//! hidden, and the other APIs ruled out with wgpu's `WGPU_BACKEND`: OpenGL would otherwise be
//! the fallback).
//! (Its own test binary: the driver list is read once per process.)

use cartage_core::{Device, Error};

#[test]
fn no_driver_means_zero_devices_and_backend_unavailable() {
    // SAFETY: this test binary has one test and sets the variables before any thread or wgpu
    // instance exists.
    unsafe {
        std::env::set_var("VK_ICD_FILENAMES", "/nonexistent/icd.json");
        std::env::set_var("VK_DRIVER_FILES", "/nonexistent/icd.json");
        std::env::set_var("WGPU_BACKEND", "vulkan");
    }
    assert_eq!(cartage_wgpu::device_count().unwrap(), 0);
    match cartage_wgpu::open(0) {
        Err(Error::BackendUnavailable { device, reason }) => {
            assert_eq!(device, Device::wgpu(0));
            assert!(reason.contains("Vulkan") || reason.contains("adapter"), "{reason}");
        }
        other => panic!("expected BackendUnavailable, got {:?}", other.map(|b| b.device())),
    }
}
