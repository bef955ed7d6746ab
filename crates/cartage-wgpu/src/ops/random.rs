//! Random tensors (`shaders/random.wgsl`): Philox4x32-10 at counter `offset + i` under `seed`,
//! the same stream as every other backend. Uniform draws are exact in f32 (`(w0 >> 8)·2⁻²⁴`),
//! then `low + (high − low)·u` (in f32 for f32/f16/bf16, in f64 for f64).

use cartage_core::{DType, Distribution, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::ops::map::{MapKernel, launch};
use crate::wgsl::convert;

const RANDOM: &str = include_str!("../../shaders/random.wgsl");

/// Fill `out` with draws of `distribution`.
pub(crate) fn random(
    backend: &WgpuBackend,
    out: &TensorArg,
    distribution: Distribution,
    seed: u64,
    offset: u64,
) -> Result<()> {
    let f64_out = out.dtype == DType::F64;
    let (a, b, unit, name) = match distribution {
        Distribution::Uniform { low, high } => (low, high - low, "uniform_unit", "rand"),
        Distribution::Normal { mean, std } => (mean, std, "normal_unit", "randn"),
    };
    let dtype = out.dtype;
    let body = move || {
        if f64_out {
            format!("{RANDOM}\nfn compute(i: u32) -> f64 {{ return P.xf.x + P.xf.y * f64({unit}(philox_words(i))); }}")
        } else {
            let value = convert(DType::F32, dtype, "v");
            format!(
                "{RANDOM}\nfn compute(i: u32) -> {c} {{
    let v = bitcast<f32>(P.extra[1].x) + bitcast<f32>(P.extra[1].y) * {unit}(philox_words(i));
    return {value};
}}",
                c = crate::wgsl::compute_type(dtype)
            )
        }
    };
    let mut kernel = MapKernel::new((name, ""), out, vec![], body);
    kernel.extra[..4].copy_from_slice(&[offset as u32, (offset >> 32) as u32, seed as u32, (seed >> 32) as u32]);
    kernel.extra[4] = (a as f32).to_bits();
    kernel.extra[5] = (b as f32).to_bits();
    if f64_out {
        kernel.extra_f64 = Some([a, b]);
    }
    launch(backend, &kernel)
}
