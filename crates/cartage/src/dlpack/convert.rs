//! Between cartage's dtypes and devices and DLPack's codes, in both directions; every code
//! cartage cannot represent is an error naming it.

use cartage_core::{DType, Device, DeviceKind, Error, Result};

use super::abi::{DLDataType, DLDevice, device_type, type_code};

/// The DLPack type of `dtype` (one lane).
pub(crate) fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (type_code::FLOAT, 32),
        DType::F64 => (type_code::FLOAT, 64),
        DType::F16 => (type_code::FLOAT, 16),
        DType::BF16 => (type_code::BFLOAT, 16),
        DType::I32 => (type_code::INT, 32),
        DType::I64 => (type_code::INT, 64),
        DType::U8 => (type_code::UINT, 8),
        DType::Bool => (type_code::BOOL, 8),
    };
    DLDataType { code, bits, lanes: 1 }
}

/// The cartage dtype of a DLPack type, or an error naming what cartage lacks.
pub(crate) fn dtype_from_dl(dl: DLDataType) -> Result<DType> {
    if dl.lanes != 1 {
        return Err(Error::invalid(
            "from_dlpack",
            format!(
                "the tensor has vector elements of {} lanes; cartage has scalar dtypes only (lanes = 1): the \
                 producer exported a vector type",
                dl.lanes
            ),
        ));
    }
    let dtype = match (dl.code, dl.bits) {
        (type_code::FLOAT, 32) => DType::F32,
        (type_code::FLOAT, 64) => DType::F64,
        (type_code::FLOAT, 16) => DType::F16,
        (type_code::BFLOAT, 16) => DType::BF16,
        (type_code::INT, 32) => DType::I32,
        (type_code::INT, 64) => DType::I64,
        (type_code::UINT, 8) => DType::U8,
        (type_code::BOOL, 8) => DType::Bool,
        (type_code::BOOL, bits) => {
            return Err(Error::invalid(
                "from_dlpack",
                format!("a bool of {bits} bits; DLPack stores bool in 8 bits, and so does cartage"),
            ));
        }
        (code, bits) => {
            let name = match code {
                type_code::INT => "int",
                type_code::UINT => "uint",
                type_code::FLOAT => "float",
                type_code::BFLOAT => "bfloat",
                type_code::COMPLEX => "complex",
                type_code::OPAQUE_HANDLE => "opaque handle",
                7..=17 => "8-, 6- or 4-bit float",
                _ => "unknown type code",
            };
            return Err(Error::invalid(
                "from_dlpack",
                format!(
                    "no cartage dtype for DLPack type code {code} ({name}) with {bits} bits; cartage has f32 f64 f16 \
                     bf16 i32 i64 u8 bool: convert on the producer's side first (e.g. `t.to(torch.float32)`)"
                ),
            ));
        }
    };
    Ok(dtype)
}

/// The DLPack device of `device`; wgpu has none.
pub(crate) fn dl_device(device: Device) -> Result<DLDevice> {
    let device_type = match device.kind() {
        DeviceKind::Cpu => device_type::CPU,
        DeviceKind::Cuda => device_type::CUDA,
        DeviceKind::Wgpu => {
            return Err(Error::unsupported_feature(
                "to_dlpack",
                device,
                "DLPack has no device type for wgpu buffers (they are API objects, not addresses); move the \
                 tensor to the cpu or a CUDA device first, e.g. `x.to(&Device::cpu())?.to_dlpack()`",
            ));
        }
    };
    let device_id = i32::try_from(device.ordinal()).map_err(|_| {
        Error::invalid(
            "to_dlpack",
            format!("{device}: the ordinal does not fit DLPack's int32"),
        )
    })?;
    Ok(DLDevice { device_type, device_id })
}

/// The cartage device of a DLPack device: host memory (`kDLCPU`, and pinned `kDLCUDAHost`)
/// is the cpu, `kDLCUDA` is the CUDA device of that ordinal; every other type is refused.
pub(crate) fn device_from_dl(dl: DLDevice) -> Result<Device> {
    let bad = |reason: String| Err(Error::invalid("from_dlpack", reason));
    match dl.device_type {
        device_type::CPU | device_type::CUDA_HOST if dl.device_id == 0 => Ok(Device::cpu()),
        device_type::CPU | device_type::CUDA_HOST => bad(format!(
            "host memory with device_id {}; DLPack host memory has device_id 0 (a corrupt tensor?)",
            dl.device_id
        )),
        device_type::CUDA => match usize::try_from(dl.device_id) {
            Ok(ordinal) => Ok(Device::cuda(ordinal)),
            Err(_) => bad(format!("a CUDA device with the negative id {}", dl.device_id)),
        },
        device_type::CUDA_MANAGED => bad(
            "CUDA managed (unified) memory is not imported; copy it into device memory on the producer's side first"
                .into(),
        ),
        other => bad(match device_type::name(other) {
            Some(name) => format!(
                "the tensor lives on a {name} device ({other}); cartage imports host (kDLCPU) and CUDA (kDLCUDA) \
                 memory: move it there on the producer's side first"
            ),
            None => format!("unknown DLPack device type {other} (a corrupt tensor, or a newer DLPack?)"),
        }),
    }
}
