//! The table's backend columns: the capabilities of each backend, obtained without a GPU.
//!
//! - `cpu`: the CPU backend's own `capabilities()`.
//! - `cuda`: an sm_90 device (H200). The CUDA backend builds its capabilities from the compute
//!   capability in a private function, so until the crate exposes one
//!   (`cartage_cuda::capabilities_for(cc)`) [`assumed_cuda`] mirrors its rule here.
//! - `wgpu`: an adapter with `SHADER_F16` and `SHADER_F64`, and one without. The wgpu backend
//!   derives its capabilities from the adapter's features in a crate-private function, so until
//!   it exposes one (`cartage_wgpu::capabilities_for(features)`) [`assumed_wgpu`] mirrors its
//!   rule; a test checks the mirror against a real adapter whenever one is found.

use cartage::{BinaryOp, Capabilities, DType, Device, Op, ReduceOp, ScatterMode};

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
                         (Ampere) on, which also run bf16 matmul",
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

/// The CUDA backend's capabilities for compute capability `cc`: every defined op, but bf16
/// matmul only from Ampere (8.0) on. Mirrors `CudaBackend::capabilities` in `cartage-cuda`.
pub fn assumed_cuda(cc: (i32, i32)) -> Capabilities {
    let ampere = cc.0 >= 8;
    Capabilities::all_defined(|op, dtype| op == Op::Matmul && dtype == DType::BF16 && !ampere)
}

/// The wgpu backend's capabilities for an adapter with (`has_f64`) or without `SHADER_F64`.
/// Mirrors `refusal` in `cartage-wgpu/src/capabilities.rs`.
pub fn assumed_wgpu(has_f64: bool) -> Capabilities {
    Capabilities::all_defined(|op, dtype| wgpu_refuses(op, dtype, has_f64))
}

fn wgpu_refuses(op: Op, dtype: DType, has_f64: bool) -> bool {
    let touches_f64 = dtype == DType::F64 || op == Op::Cast(DType::F64);
    if touches_f64 && !has_f64 {
        return true;
    }
    match dtype {
        DType::F64 => match op {
            Op::Unary(u) => u.transcendental(),
            Op::Binary(BinaryOp::Pow)
            | Op::Softmax
            | Op::LogSoftmax
            | Op::CrossEntropy
            | Op::Reduce(ReduceOp::LogSumExp)
            | Op::Scatter(ScatterMode::Add) => true,
            _ => false,
        },
        DType::I64 => !matches!(
            op,
            Op::Fill
                | Op::Arange
                | Op::Cast(_)
                | Op::Copy
                | Op::Where
                | Op::Gather
                | Op::IndexSelect
                | Op::Sort
                | Op::Scatter(_)
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cartage::UnaryOp;

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
             update `assumed_wgpu` in xtask/src/ops_table/columns.rs to the backend's rule",
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
        let diff = differences(&assumed_cuda(cc), real.capabilities());
        assert!(
            diff.is_empty(),
            "{} ({}, sm_{}{}) supports differently from the assumed cuda column: {diff:?}; \
             update `assumed_cuda` in xtask/src/ops_table/columns.rs to the backend's rule",
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
            !wgpu.supports(Op::Binary(BinaryOp::Add), DType::I64),
            "no i64 arithmetic in WGSL"
        );
        assert!(!assumed_cuda((7, 5)).supports(Op::Matmul, DType::BF16));
        assert!(assumed_cuda((9, 0)).supports(Op::Matmul, DType::BF16));
    }
}
