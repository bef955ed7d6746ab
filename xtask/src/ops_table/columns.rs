//! The table's backend columns: the capabilities of each backend, obtained without a GPU.
//!
//! - `cpu`: the CPU backend's own `capabilities()`.
//! - `cuda`: an sm_90 device (H200), from `cartage_cuda::capabilities_for`, the rule the backend
//!   itself uses (an optional fused kernel that depends on a library found at run time, such as
//!   cuDNN, is noted under the table).
//! - `wgpu`: an adapter with `SHADER_F64`, and one without, from `cartage_wgpu::capabilities_for`.
//!   A test checks each rule against a real device whenever one is found.
//!
//! Built without the `cuda` or `wgpu` feature, that column is empty.

use cartage::{Capabilities, Device};

/// One backend column of the table.
pub struct Column {
    /// The header (`cpu`, `cuda (sm_90)`, …).
    pub name: &'static str,
    /// What the column assumes about the device, for the notes under the table.
    pub assumption: &'static str,
    /// What runs there.
    pub caps: Capabilities,
}

/// Every column, in table order. The table describes each backend, not a device the program
/// picked: the names are labels, and the CPU column is the CPU backend itself.
// cartage: device-entry
pub fn all() -> anyhow::Result<Vec<Column>> {
    let cpu = cartage::backend(&Device::cpu())?.capabilities().clone();
    Ok(vec![
        Column {
            name: "cpu",
            assumption: "the CPU backend's own `capabilities()`",
            caps: cpu,
        },
        Column {
            name: "cuda",
            assumption: "a compute capability 9.0 device (H200, sm_90); the same for every device from 8.0 \
                         (Ampere) on, which also run bf16 matmul and fused attention. The fused `conv2d`, \
                         `conv2d_backward_input` and `conv2d_backward_weight` kernels are listed at run \
                         time when cuDNN 9 loads (f32, f64, f16, and bf16 from Ampere on), so this column \
                         shows them as absent; without them conv2d and its gradients are composed",
            caps: assumed_cuda((9, 0)),
        },
        Column {
            name: "wgpu",
            assumption: "an adapter with `SHADER_F16` and `SHADER_F64` (f16 and bf16 are stored packed and \
                         computed in f32 on every adapter)",
            caps: assumed_wgpu(true),
        },
        Column {
            name: "wgpu, no f64",
            assumption: "an adapter without `SHADER_F64` (most integrated and mobile GPUs, Metal)",
            caps: assumed_wgpu(false),
        },
    ])
}

/// The CUDA backend's capabilities for compute capability `cc` (`cartage_cuda::capabilities_for`).
pub fn assumed_cuda(cc: (i32, i32)) -> Capabilities {
    #[cfg(feature = "cuda")]
    {
        cartage_cuda::capabilities_for(cc)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cc;
        Capabilities::default()
    }
}

/// The wgpu backend's capabilities for an adapter with (`has_f64`) or without `SHADER_F64`
/// (`cartage_wgpu::capabilities_for`).
pub fn assumed_wgpu(has_f64: bool) -> Capabilities {
    #[cfg(feature = "wgpu")]
    {
        cartage_wgpu::capabilities_for(has_f64)
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = has_f64;
        Capabilities::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cartage::{BinaryOp, DType, Op, ScatterMode, UnaryOp};

    /// The (op, dtype) pairs on which two capability sets disagree.
    fn differences(a: &Capabilities, b: &Capabilities) -> Vec<String> {
        let mut out = Vec::new();
        for op in Op::all() {
            for dtype in DType::ALL {
                if a.supports(op, dtype) != b.supports(op, dtype) {
                    out.push(format!("{} {dtype}", op.name()));
                }
            }
        }
        out
    }

    #[test]
    fn the_assumed_wgpu_columns_match_a_real_adapter() {
        let Some(info) = cartage::devices()
            .into_iter()
            .find(|d| d.device.kind() == cartage::DeviceKind::Wgpu)
        else {
            eprintln!("no wgpu adapter: the assumed wgpu columns were not checked against one");
            return;
        };
        let features = info
            .details
            .iter()
            .find(|(k, _)| k == "features")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let has_f64 = features.contains("SHADER_F64");
        let real = cartage::backend(&info.device).expect("the adapter opens");
        let diff = differences(&assumed_wgpu(has_f64), real.capabilities());
        assert!(
            diff.is_empty(),
            "{} ({}, SHADER_F64: {has_f64}) supports differently from the assumed wgpu column: {diff:?}; \
             the backend's `capabilities_for` and its `capabilities()` disagree",
            info.device,
            info.name
        );
    }

    #[test]
    fn the_assumed_cuda_column_matches_a_real_device() {
        let Some(info) = cartage::devices()
            .into_iter()
            .find(|d| d.device.kind() == cartage::DeviceKind::Cuda)
        else {
            eprintln!("no CUDA device: the assumed cuda column was not checked against one");
            return;
        };
        let cc = info
            .details
            .iter()
            .find(|(k, _)| k == "compute capability")
            .and_then(|(_, v)| v.split_once('.'))
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
            .expect("a CUDA device reports its compute capability as `major.minor`");
        let real = cartage::backend(&info.device).expect("the device opens");
        // conv2d and its two backward kernels depend on cuDNN loading at run time, which the
        // rule cannot know: the column's note says so, and everything else must agree.
        let diff: Vec<String> = differences(&assumed_cuda(cc), real.capabilities())
            .into_iter()
            .filter(|d| {
                !["conv2d ", "conv2d_backward_input ", "conv2d_backward_weight "]
                    .iter()
                    .any(|p| d.starts_with(p))
            })
            .collect();
        assert!(
            diff.is_empty(),
            "{} ({}, sm_{}{}) supports differently from the assumed cuda column: {diff:?}; \
             the backend's `capabilities_for` and its `capabilities()` disagree",
            info.device,
            info.name,
            cc.0,
            cc.1
        );
    }

    #[test]
    fn the_columns_differ_where_the_backends_do() {
        let wgpu = assumed_wgpu(true);
        let no_f64 = assumed_wgpu(false);
        assert!(wgpu.supports(Op::Binary(BinaryOp::Add), DType::F64));
        assert!(!no_f64.supports(Op::Binary(BinaryOp::Add), DType::F64));
        assert!(
            !wgpu.supports(Op::Unary(UnaryOp::Exp), DType::F64),
            "no f64 exp in Vulkan"
        );
        assert!(
            wgpu.supports(Op::Binary(BinaryOp::Mul), DType::I64),
            "i64 is emulated on word pairs"
        );
        assert!(
            !wgpu.supports(Op::Scatter(ScatterMode::Add), DType::F64),
            "no 64-bit float atomics"
        );
        assert!(!assumed_cuda((7, 5)).supports(Op::Matmul, DType::BF16));
        assert!(assumed_cuda((9, 0)).supports(Op::Matmul, DType::BF16));
    }
}
