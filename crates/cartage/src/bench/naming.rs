//! Benchmark names that join across tools: `<backend>/<device-name>/<op>_<dtype>_<size>`
//! (`cuda/NVIDIA-H200/matmul_f32_1024`), used by the report and the criterion benches alike.

use cartage_core::Device;

/// A device name as one path segment: runs of characters other than ASCII letters, digits,
/// `.` and `_` become one `-`.
///
/// ```
/// assert_eq!(cartage::bench::name_segment("llvmpipe (LLVM 15.0.6, 256 bits)"), "llvmpipe-LLVM-15.0.6-256-bits");
/// ```
pub fn name_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// The device part of a bench name: its name as a segment, with `-<ordinal>` after it for
/// ordinals above 0, so that two identical GPUs get distinct names (`NVIDIA-H200`, `NVIDIA-H200-1`).
///
/// ```
/// use cartage::{Device, bench::device_segment};
/// assert_eq!(device_segment(&Device::cuda(0), "NVIDIA H200"), "NVIDIA-H200");
/// assert_eq!(device_segment(&Device::cuda(1), "NVIDIA H200"), "NVIDIA-H200-1");
/// ```
pub fn device_segment(device: &Device, device_name: &str) -> String {
    let name = name_segment(device_name);
    match device.ordinal() {
        0 => name,
        n => format!("{name}-{n}"),
    }
}

/// `<backend>/<device-name>/<op>_<dtype>_<size>` (see [`device_segment`]).
///
/// ```
/// use cartage::{Device, bench::bench_name};
/// assert_eq!(bench_name(&Device::cuda(0), "NVIDIA H200", "matmul", "f32", 1024), "cuda/NVIDIA-H200/matmul_f32_1024");
/// ```
pub fn bench_name(device: &Device, device_name: &str, op: &str, dtype: &str, size: usize) -> String {
    format!(
        "{}/{}/{op}_{dtype}_{size}",
        device.kind().name(),
        device_segment(device, device_name)
    )
}
