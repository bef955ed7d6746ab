//! Every generated matmul kernel through naga, as wgpu compiles it for a Vulkan adapter with
//! the features of an H200 (SHADER_F16, SHADER_F64, SUBGROUP and cooperative matrices): WGSL
//! parsing, validation with the capabilities wgpu derives from those features, and SPIR-V
//! generation (where naga's SPIR-V writer is built). A kernel that this rejects would fail to
//! compile on that adapter, though no adapter here has cooperative matrices.

use wgpu::naga;

use crate::ops::matmul_coop::{self, CoopTiling};

/// The naga capabilities wgpu enables for an adapter with SHADER_F16, SHADER_F64, SUBGROUP and
/// EXPERIMENTAL_COOPERATIVE_MATRIX (`features_to_naga_capabilities`).
fn h200_capabilities() -> naga::valid::Capabilities {
    use naga::valid::Capabilities as C;
    C::FLOAT64 | C::SHADER_FLOAT16 | C::SUBGROUP | C::COOPERATIVE_MATRIX
}

/// Parse, validate and (where built) translate `text` to SPIR-V 1.6; the error names `name`.
fn compile(name: &str, text: &str) -> Result<(), String> {
    let module =
        naga::front::wgsl::parse_str(text).map_err(|e| format!("{name}: parse: {}", e.emit_to_string(text)))?;
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), h200_capabilities());
    let info = validator
        .validate(&module)
        .map_err(|e| format!("{name}: validate: {}", e.emit_to_string(text)))?;
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    {
        let options = naga::back::spv::Options {
            lang_version: (1, 6),
            // As `ShaderRuntimeChecks::unchecked()`, which the pipeline cache uses.
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: naga::proc::BoundsCheckPolicy::Unchecked,
                buffer: naga::proc::BoundsCheckPolicy::Unchecked,
                image_load: naga::proc::BoundsCheckPolicy::Unchecked,
                binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
            },
            force_loop_bounding: false,
            ..Default::default()
        };
        let words =
            naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| format!("{name}: SPIR-V: {e}"))?;
        if words.first() != Some(&0x0723_0203) {
            return Err(format!("{name}: SPIR-V without its magic number"));
        }
    }
    let _ = info;
    Ok(())
}

#[test]
fn every_cooperative_kernel_compiles_for_an_h200() {
    let mut failures = Vec::new();
    for tiling in CoopTiling::CANDIDATES {
        let text = matmul_coop::kernel_source(&tiling, 32).unwrap();
        if let Err(e) = compile(&format!("coop:{tiling}"), &text) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_tiled_kernel_compiles_for_an_h200() {
    // Every tiling and dtype with vec4 reads and stores and with scalar reads and stores, and
    // every combination of read modes under the default GPU tiling (the modes change only the
    // copy code, which is the same under every tiling).
    let kept = |name: &str| {
        name.contains(" Vec4 Vec4 c_vec4=true")
            || name.contains(" ScalarOuterFast ScalarInnerFast c_vec4=false")
            || name.starts_with("tiled 128x64x16/8x4 ")
    };
    let mut failures = Vec::new();
    let mut compiled = 0;
    for (name, text) in crate::ops::matmul::every_source().into_iter().filter(|(n, _)| kept(n)) {
        compiled += 1;
        if let Err(e) = compile(&name, &text) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(compiled, 15 * 4 * 2 + 4 * 9 * 2 - 4 * 2);
}

#[test]
fn a_kernel_naga_rejects_fails_here() {
    // The check is not vacuous: a cooperative kernel without its capability, and a broken one.
    let text = matmul_coop::kernel_source(&CoopTiling::CANDIDATES[2], 32).unwrap();
    let module = naga::front::wgsl::parse_str(&text).unwrap();
    let without = h200_capabilities() - naga::valid::Capabilities::COOPERATIVE_MATRIX;
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), without);
    assert!(validator.validate(&module).is_err());
    let broken = text.replace("coopMultiplyAdd(fa0, fb0,", "coopMultiplyAdd(fb0, fa0,");
    assert!(compile("broken", &broken).is_err());
}
