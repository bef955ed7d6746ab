//! `Device::pick()` and `CARTAGE_DEVICE` (R14, R15, invariant 3): a bare `cuda` is refused with
//! an ordinal hint, a device whose feature is off is `BackendNotCompiled` naming the feature, a
//! compiled backend without its device is `BackendUnavailable`, unset picks the best device.
//!
//! These go through `pick_from` (the same checks without the environment); `pick_env.rs` checks
//! `Device::pick()` itself, alone in its binary because it changes the environment.

use cartage::prelude::*;
use cartage::runtime::{DEVICE_ENV, pick_from};
use cartage::{DeviceKind, Error};

#[test]
fn bare_gpu_kinds_ask_for_an_ordinal() {
    for bare in ["cuda", "wgpu", " CUDA "] {
        match pick_from(Some(bare)).unwrap_err() {
            Error::InvalidDevice { input, reason } => {
                assert_eq!(input.trim().to_ascii_lowercase(), bare.trim().to_ascii_lowercase());
                let kind = bare.trim().to_ascii_lowercase();
                assert!(reason.contains(&format!("{kind}:0")), "{reason}");
                assert!(reason.contains("ordinal"), "{reason}");
                assert!(reason.contains(DEVICE_ENV), "{reason}");
            }
            other => panic!("expected InvalidDevice for {bare:?}, got {other:?}"),
        }
    }
    for bad in ["tpu:0", "cuda:one", "cpu:3", "gpu"] {
        assert!(
            matches!(pick_from(Some(bad)), Err(Error::InvalidDevice { .. })),
            "{bad}"
        );
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_is_not_compiled_naming_the_feature() {
    match pick_from(Some("cuda:0")).unwrap_err() {
        Error::BackendNotCompiled { device, feature } => {
            assert_eq!((device, feature), (Device::cuda(0), "cuda"));
        }
        other => panic!("expected BackendNotCompiled, got {other:?}"),
    }
    let message = match cartage::backend(&Device::cuda(1)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("cuda:1 opened without the cuda feature"),
    };
    assert!(message.contains("--features cuda"), "{message}");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_compiled_in_opens_or_says_why_not() {
    match pick_from(Some("cuda:0")) {
        Ok(device) => assert_eq!(device, Device::cuda(0)),
        Err(Error::BackendUnavailable { device, reason }) => {
            assert_eq!(device, Device::cuda(0));
            assert!(!reason.is_empty());
        }
        Err(other) => panic!("expected a device or BackendUnavailable, got {other:?}"),
    }
    // An ordinal far beyond any machine's is unavailable, never a panic.
    assert!(matches!(
        pick_from(Some("cuda:4096")),
        Err(Error::BackendUnavailable { .. })
    ));
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn wgpu_without_the_feature_is_not_compiled() {
    assert!(matches!(
        pick_from(Some("wgpu:0")),
        Err(Error::BackendNotCompiled { feature: "wgpu", .. })
    ));
}

#[test]
fn cpu_and_best_available_always_work() -> Result<()> {
    assert_eq!(pick_from(Some("cpu"))?, Device::cpu());
    let best = Device::best_available();
    assert!(cartage::backend(&best).is_ok());
    assert_eq!(pick_from(None)?, best);
    assert_eq!(pick_from(Some("  "))?, best, "an empty setting means unset");
    // The best device is never a software rasteriser.
    if best.kind() == DeviceKind::Wgpu {
        assert!(!cartage::runtime::is_software_adapter(&cartage::backend(&best)?.info()));
    }
    Ok(())
}
