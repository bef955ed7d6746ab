//! Helpers shared by cartage-nn's integration tests: the GPUs that open here, each missing one
//! skipped loudly (or a failure when `CARTAGE_REQUIRE` names its kind), and a model's
//! parameters by name, as they are or as copies for a written-out reference.

use cartage::{Device, Result, Var, backend};
use cartage_nn::ParamStore;

/// The parameters `names` of `store`, or (with `copies`) new variables holding their values,
/// for a reference computed beside the model.
#[allow(dead_code)] // not every test binary writes a reference out
pub fn params(store: &ParamStore, names: &[&str], copies: bool) -> Result<Vec<Var>> {
    names
        .iter()
        .map(|n| {
            let var = store.get(n).unwrap_or_else(|| panic!("{n} is a parameter"));
            if copies { Var::new(var.value().clone()) } else { Ok(var) }
        })
        .collect()
}

/// Every GPU that opens here (`wgpu:0`, `cuda:0`). Each one that does not prints a SKIP line,
/// or panics when `CARTAGE_REQUIRE` (a comma list such as `cuda,wgpu`) names its kind.
pub fn gpu_devices(test: &str) -> Vec<Device> {
    let mut found = Vec::new();
    for device in [Device::wgpu(0), Device::cuda(0)] {
        match backend(&device) {
            Ok(_) => found.push(device),
            Err(e) => {
                let required = std::env::var("CARTAGE_REQUIRE").is_ok_and(|v| {
                    v.split(',')
                        .any(|k| k.trim().eq_ignore_ascii_case(device.kind().name()))
                });
                assert!(
                    !required,
                    "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                    device.kind().name()
                );
                cartage_core::testsuite::skip::device_missing(test, &device.to_string(), &e.to_string());
            }
        }
    }
    found
}
