//! Shared helpers of the criterion benches: the devices of every compiled-in backend, the
//! bench names (`<backend>/<device-name>/<op>_<dtype>_<size>`), and the device-timed region
//! criterion's `iter_custom` reads (synchronised before the timer is read, LESSONS R29).

use std::sync::Arc;
use std::time::Duration;

use cartage::bench::{Bench, Timing, device_segment, time_region};
use cartage::{Backend, DType, Device, DeviceKind, Op, Result};

/// A device to bench.
pub struct BenchDevice {
    /// The device value.
    pub device: Device,
    /// Its backend.
    pub backend: Arc<dyn Backend>,
    /// Its name as a bench-name segment (`NVIDIA-H200`, `NVIDIA-H200-1` for a second one).
    pub name: String,
    /// The clock the benches read on it.
    pub timing: Timing,
}

impl BenchDevice {
    /// The criterion group of this device: `<backend>/<device-name>`.
    pub fn group(&self) -> String {
        format!("{}/{}", self.device.kind().name(), self.name)
    }

    /// True when the device runs `op` for `dtype`; prints a SKIP line when it does not.
    pub fn supports(&self, op: Op, dtype: DType, id: &str) -> bool {
        let supported = self.backend.capabilities().supports(op, dtype);
        if !supported {
            println!(
                "SKIP {}/{id}: {} has no `{}` kernel for {dtype}",
                self.group(),
                self.device,
                op.name()
            );
        }
        supported
    }

    /// The device time of `iters` calls of `work`, for criterion's `iter_custom`.
    pub fn time(&self, iters: u64, work: impl FnMut() -> Result<()>) -> Duration {
        match time_region(self.backend.as_ref(), self.timing, iters, work) {
            Ok(elapsed) => elapsed,
            Err(e) => panic!("{} failed while benchmarked: {e}", self.device),
        }
    }
}

/// Every device of every compiled-in backend; a compiled backend without a device prints a
/// SKIP line saying why.
pub fn devices() -> Vec<BenchDevice> {
    let mut found = Vec::new();
    for kind in [DeviceKind::Cpu, DeviceKind::Cuda, DeviceKind::Wgpu] {
        for ordinal in 0..if kind == DeviceKind::Cpu { 1 } else { 16 } {
            let device = Device::new(kind, ordinal);
            match cartage::backend(&device) {
                Ok(backend) => found.push(BenchDevice {
                    device,
                    name: device_segment(&device, &backend.info().name),
                    timing: Bench::new().timing_for(backend.as_ref()),
                    backend,
                }),
                Err(cartage::Error::BackendNotCompiled { .. }) => break,
                Err(e) => {
                    if ordinal == 0 {
                        println!("SKIP {}: {e}", kind.name());
                    }
                    break;
                }
            }
        }
    }
    found
}

/// `<op>_<dtype>_<size>`, the part of a bench name inside a device's group.
pub fn case_id(op: &str, dtype: DType, size: usize) -> String {
    format!("{op}_{dtype}_{size}")
}
