//! Finding the devices to measure: every backend family asked for, compiled in or not, each
//! device it opens (software wgpu adapters only when no GPU adapter exists), with capabilities.

use cartage::bench::Bench;
use cartage::{BinaryOp, Capabilities, CompareOp, DType, Device, DeviceKind, Error, Op, ReduceOp, UnaryOp};

use super::report::{BackendEntry, CapabilityRow, DeviceEntry, Support};

/// The most ordinals probed per backend.
const MAX_ORDINALS: usize = 16;

/// A device to measure.
pub struct Found {
    /// The device value.
    pub device: Device,
    /// Its report entry (ceilings filled later).
    pub entry: DeviceEntry,
    /// What it can run.
    pub capabilities: Capabilities,
}

/// Every backend family and the devices to measure.
pub struct Discovery {
    /// One entry per family, asked for or not.
    pub backends: Vec<BackendEntry>,
    /// The devices, CPU first.
    pub devices: Vec<Found>,
}

/// Whether this binary has `kind`'s backend compiled in.
fn compiled(kind: DeviceKind) -> bool {
    match kind {
        DeviceKind::Cpu => true,
        DeviceKind::Cuda => cfg!(feature = "cuda"),
        DeviceKind::Wgpu => cfg!(feature = "wgpu"),
    }
}

/// Open every device of the `requested` families.
pub fn discover(requested: &[DeviceKind]) -> Discovery {
    let mut backends = Vec::new();
    let mut devices = Vec::new();
    for kind in [DeviceKind::Cpu, DeviceKind::Cuda, DeviceKind::Wgpu] {
        let mut entry = BackendEntry {
            backend: kind.name().to_string(),
            compiled: compiled(kind),
            requested: requested.contains(&kind),
            devices: Vec::new(),
            problem: None,
        };
        if !entry.requested {
            entry.problem = Some("not asked for (--backends)".into());
            backends.push(entry);
            continue;
        }
        let mut opened = Vec::new();
        let ordinals = if kind == DeviceKind::Cpu { 1 } else { MAX_ORDINALS };
        for ordinal in 0..ordinals {
            let device = Device::new(kind, ordinal);
            match cartage::backend(&device) {
                Ok(backend) => opened.push(found(device, backend.as_ref())),
                Err(e) if ordinal == 0 => {
                    if matches!(e, Error::BackendNotCompiled { .. }) {
                        entry.compiled = false;
                    }
                    entry.problem = Some(e.to_string());
                    break;
                }
                Err(_) => break,
            }
        }
        let has_gpu = opened.iter().any(|f| !f.entry.software);
        let (kept, dropped): (Vec<Found>, Vec<Found>) =
            opened.into_iter().partition(|f| !(has_gpu && f.entry.software));
        if !dropped.is_empty() {
            let names: Vec<String> = dropped
                .iter()
                .map(|f| format!("{} ({})", f.entry.device, f.entry.name))
                .collect();
            entry.problem = Some(format!(
                "not measured: {}, a software rasteriser, since a GPU adapter exists",
                names.join(", ")
            ));
        }
        entry.devices = kept.iter().map(|f| f.entry.device.clone()).collect();
        devices.extend(kept);
        backends.push(entry);
    }
    Discovery { backends, devices }
}

fn found(device: Device, backend: &dyn cartage::Backend) -> Found {
    let info = backend.info();
    let capabilities = backend.capabilities().clone();
    let entry = DeviceEntry {
        device: device.to_string(),
        backend: device.kind().name().to_string(),
        name: info.name.clone(),
        total_memory: info.total_memory,
        details: info.details.clone(),
        software: device.kind() == DeviceKind::Wgpu && cartage::runtime::is_software_adapter(&info),
        timing: Bench::new().timing_for(backend).name().to_string(),
        capabilities: capability_table(&capabilities),
        ceilings: Default::default(),
    };
    Found {
        device,
        entry,
        capabilities,
    }
}

/// Op families and their ops, for the capability table.
fn families() -> Vec<(&'static str, Vec<Op>)> {
    vec![
        ("fill, arange", vec![Op::Fill, Op::Arange]),
        ("random", vec![Op::RandomUniform, Op::RandomNormal]),
        ("cast", DType::ALL.iter().map(|&d| Op::Cast(d)).collect()),
        ("copy", vec![Op::Copy]),
        ("unary", UnaryOp::ALL.iter().map(|&o| Op::Unary(o)).collect()),
        ("binary", BinaryOp::ALL.iter().map(|&o| Op::Binary(o)).collect()),
        ("compare, where", {
            let mut ops: Vec<Op> = CompareOp::ALL.iter().map(|&o| Op::Compare(o)).collect();
            ops.push(Op::Where);
            ops
        }),
        ("reduce", ReduceOp::ALL.iter().map(|&o| Op::Reduce(o)).collect()),
        ("softmax", vec![Op::Softmax, Op::LogSoftmax]),
        ("matmul", vec![Op::Matmul]),
        ("gather, index_select", vec![Op::Gather, Op::IndexSelect]),
    ]
}

/// Support of each op family per dtype: all, some or none of the ops defined for that dtype.
pub fn capability_table(caps: &Capabilities) -> Vec<CapabilityRow> {
    families()
        .into_iter()
        .map(|(family, ops)| CapabilityRow {
            family: family.to_string(),
            support: DType::ALL
                .iter()
                .map(|&dtype| {
                    let defined: Vec<&Op> = ops.iter().filter(|op| op.defined_for(dtype)).collect();
                    let supported = defined.iter().filter(|op| caps.supports(***op, dtype)).count();
                    let support = match supported {
                        0 => Support::None,
                        n if n == defined.len() => Support::All,
                        _ => Support::Some,
                    };
                    (dtype.name().to_string(), support)
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_table_tells_all_from_some_from_none() {
        let caps = Capabilities::all_defined(|op, dtype| {
            (op == Op::Matmul && dtype == DType::BF16) || (op == Op::Unary(UnaryOp::Exp) && dtype == DType::F16)
        });
        let table = capability_table(&caps);
        let get = |family: &str, dtype: &str| {
            let row = table.iter().find(|r| r.family == family).unwrap();
            row.support.iter().find(|(d, _)| d == dtype).unwrap().1
        };
        assert_eq!(get("matmul", "f32"), Support::All);
        assert_eq!(get("matmul", "bf16"), Support::None);
        assert_eq!(
            get("matmul", "i32"),
            Support::None,
            "matmul is not defined for integers"
        );
        assert_eq!(get("unary", "f16"), Support::Some);
        assert_eq!(
            get("unary", "i32"),
            Support::All,
            "neg, abs and relu are all an integer has"
        );
    }
}
