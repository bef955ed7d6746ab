//! Datasheet peaks of known devices, set beside the ceilings the run measured. Arithmetic peaks
//! are dense (the datasheets' tensor-core figures halved where they are quoted with sparsity);
//! the host link is one direction of the bus. A device not in the table has no datasheet
//! figures, and the report says "unknown".

/// A device's datasheet figures, in FLOP/s and bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peaks {
    /// The part the figures are for (`NVIDIA H200 SXM`).
    pub part: &'static str,
    /// Device-memory bandwidth, bytes per second.
    pub memory_bandwidth: f64,
    /// The memory technology (`HBM3e`).
    pub memory: &'static str,
    /// Host link bandwidth in one direction, bytes per second.
    pub host_link: f64,
    /// The host link (`PCIe 5.0 x16`).
    pub link: &'static str,
    /// Dense f32 (without tensor cores).
    pub f32: f64,
    /// Dense TF32 on tensor cores.
    pub tf32: f64,
    /// Dense f16 on tensor cores (f32 accumulation).
    pub f16: f64,
    /// Dense bf16 on tensor cores (f32 accumulation).
    pub bf16: f64,
}

impl Peaks {
    /// The arithmetic peak for a matmul key of [`Ceilings::matmul_gflops`](super::Ceilings)
    /// (`f32`, `f32-tf32`, `f16`, `bf16`).
    pub fn matmul(&self, key: &str) -> Option<f64> {
        match key {
            "f32" => Some(self.f32),
            "f32-tf32" => Some(self.tf32),
            "f16" => Some(self.f16),
            "bf16" => Some(self.bf16),
            _ => None,
        }
    }
}

const T: f64 = 1e12;
const PCIE5: f64 = 64e9;
const PCIE4: f64 = 32e9;

/// Known devices: a name fragment the device's name must contain, and its figures. More specific
/// fragments come first (`H200 NVL` before `H200`).
const KNOWN: [(&str, Peaks); 6] = [
    (
        "H200 NVL",
        Peaks {
            part: "NVIDIA H200 NVL",
            memory_bandwidth: 4.8 * T,
            memory: "HBM3e",
            host_link: PCIE5,
            link: "PCIe 5.0 x16",
            f32: 60.0 * T,
            tf32: 417.5 * T,
            f16: 835.5 * T,
            bf16: 835.5 * T,
        },
    ),
    (
        "H200",
        Peaks {
            part: "NVIDIA H200 SXM",
            memory_bandwidth: 4.8 * T,
            memory: "HBM3e",
            host_link: PCIE5,
            link: "PCIe 5.0 x16",
            f32: 67.0 * T,
            tf32: 494.5 * T,
            f16: 989.5 * T,
            bf16: 989.5 * T,
        },
    ),
    (
        "H100 PCIe",
        Peaks {
            part: "NVIDIA H100 PCIe",
            memory_bandwidth: 2.0 * T,
            memory: "HBM2e",
            host_link: PCIE5,
            link: "PCIe 5.0 x16",
            f32: 51.0 * T,
            tf32: 378.0 * T,
            f16: 756.5 * T,
            bf16: 756.5 * T,
        },
    ),
    (
        "H100",
        Peaks {
            part: "NVIDIA H100 SXM",
            memory_bandwidth: 3.35 * T,
            memory: "HBM3",
            host_link: PCIE5,
            link: "PCIe 5.0 x16",
            f32: 67.0 * T,
            tf32: 494.5 * T,
            f16: 989.5 * T,
            bf16: 989.5 * T,
        },
    ),
    (
        "A100-SXM4-80GB",
        Peaks {
            part: "NVIDIA A100 SXM4 80GB",
            memory_bandwidth: 2.039 * T,
            memory: "HBM2e",
            host_link: PCIE4,
            link: "PCIe 4.0 x16",
            f32: 19.5 * T,
            tf32: 156.0 * T,
            f16: 312.0 * T,
            bf16: 312.0 * T,
        },
    ),
    (
        "A100-SXM4-40GB",
        Peaks {
            part: "NVIDIA A100 SXM4 40GB",
            memory_bandwidth: 1.555 * T,
            memory: "HBM2",
            host_link: PCIE4,
            link: "PCIe 4.0 x16",
            f32: 19.5 * T,
            tf32: 156.0 * T,
            f16: 312.0 * T,
            bf16: 312.0 * T,
        },
    ),
];

/// The datasheet figures of the device named `name`, if it is a known one. A software device
/// (lavapipe) never matches, whatever it reports.
pub fn lookup(name: &str, software: bool) -> Option<Peaks> {
    if software {
        return None;
    }
    KNOWN
        .iter()
        .find(|(fragment, _)| name.contains(fragment))
        .map(|(_, peaks)| *peaks)
}
