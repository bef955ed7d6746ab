//! The DLPack C ABI (`dlpack.h`, version 1.1): the structs and constants exchanged with other
//! frameworks, laid out exactly as the header's (`#[repr(C)]`; the tests assert sizes and
//! offsets). Enumerations are plain integers so that any value a producer writes can be read
//! and refused, never undefined behaviour.

use std::ffi::c_void;

/// The DLPack major version this module speaks ([`DLManagedTensorVersioned::version`]).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The DLPack minor version this module speaks.
pub const DLPACK_MINOR_VERSION: u32 = 1;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the tensor.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer owns alone.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: a sub-byte type is padded, not packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLDeviceType` values (a C enum: `int32_t`).
pub mod device_type {
    /// `kDLCPU`: host memory.
    pub const CPU: i32 = 1;
    /// `kDLCUDA`: CUDA device memory.
    pub const CUDA: i32 = 2;
    /// `kDLCUDAHost`: pinned host memory from `cudaMallocHost`.
    pub const CUDA_HOST: i32 = 3;
    /// `kDLOpenCL`.
    pub const OPENCL: i32 = 4;
    /// `kDLVulkan`.
    pub const VULKAN: i32 = 7;
    /// `kDLMetal`.
    pub const METAL: i32 = 8;
    /// `kDLVPI`.
    pub const VPI: i32 = 9;
    /// `kDLROCM`.
    pub const ROCM: i32 = 10;
    /// `kDLROCMHost`.
    pub const ROCM_HOST: i32 = 11;
    /// `kDLExtDev`.
    pub const EXT_DEV: i32 = 12;
    /// `kDLCUDAManaged`: CUDA managed (unified) memory.
    pub const CUDA_MANAGED: i32 = 13;
    /// `kDLOneAPI`.
    pub const ONE_API: i32 = 14;
    /// `kDLWebGPU`.
    pub const WEBGPU: i32 = 15;
    /// `kDLHexagon`.
    pub const HEXAGON: i32 = 16;
    /// `kDLMAIA`.
    pub const MAIA: i32 = 17;
    /// `kDLTrn`.
    pub const TRN: i32 = 18;

    /// The header's name of a device type (`kDLCUDA`), or `None` for a value it does not define.
    pub fn name(device_type: i32) -> Option<&'static str> {
        Some(match device_type {
            CPU => "kDLCPU",
            CUDA => "kDLCUDA",
            CUDA_HOST => "kDLCUDAHost",
            OPENCL => "kDLOpenCL",
            VULKAN => "kDLVulkan",
            METAL => "kDLMetal",
            VPI => "kDLVPI",
            ROCM => "kDLROCM",
            ROCM_HOST => "kDLROCMHost",
            EXT_DEV => "kDLExtDev",
            CUDA_MANAGED => "kDLCUDAManaged",
            ONE_API => "kDLOneAPI",
            WEBGPU => "kDLWebGPU",
            HEXAGON => "kDLHexagon",
            MAIA => "kDLMAIA",
            TRN => "kDLTrn",
            _ => return None,
        })
    }
}

/// `DLDataTypeCode` values (stored in [`DLDataType::code`] as `uint8_t`).
pub mod type_code {
    /// `kDLInt`: signed integer.
    pub const INT: u8 = 0;
    /// `kDLUInt`: unsigned integer.
    pub const UINT: u8 = 1;
    /// `kDLFloat`: IEEE float.
    pub const FLOAT: u8 = 2;
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: u8 = 3;
    /// `kDLBfloat`: bfloat16.
    pub const BFLOAT: u8 = 4;
    /// `kDLComplex`.
    pub const COMPLEX: u8 = 5;
    /// `kDLBool`: one byte per element.
    pub const BOOL: u8 = 6;
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version: a different one means a different layout of the versioned struct.
    pub major: u32,
    /// Minor version: new enumeration values only.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// A [`device_type`] value (`DLDeviceType`, a C enum of `int32_t` size).
    pub device_type: i32,
    /// The device's index (0 for host memory).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// A [`type_code`] value.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars; more for vector types).
    pub lanes: u16,
}

/// `DLTensor`: a strided view of memory, owning nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// The memory (a host pointer on the CPU, a device pointer on CUDA).
    pub data: *mut c_void,
    /// Where the memory lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL: compact row-major, allowed before DLPack 1.0).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (the unversioned struct PyTorch's `to_dlpack` capsules hold, named
/// `"dltensor"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; frees the struct itself too. May be NULL.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (capsules named `"dltensor_versioned"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version; the fields after `flags` may be read only when its major is
    /// [`DLPACK_MAJOR_VERSION`].
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; frees the struct itself too. May be NULL.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}
