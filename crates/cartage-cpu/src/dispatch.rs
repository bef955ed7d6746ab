//! Macros that bind a Rust element type to a runtime [`cartage_core::DType`], so each kernel is
//! written once, generically, and monomorphised per dtype.

/// Bind `$T` to the storage type of `$dtype` (all eight dtypes) and evaluate `$body`.
macro_rules! with_storage {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            cartage_core::DType::F32 => {
                type $T = f32;
                $body
            }
            cartage_core::DType::F64 => {
                type $T = f64;
                $body
            }
            cartage_core::DType::F16 => {
                type $T = half::f16;
                $body
            }
            cartage_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            cartage_core::DType::I32 => {
                type $T = i32;
                $body
            }
            cartage_core::DType::I64 => {
                type $T = i64;
                $body
            }
            cartage_core::DType::U8 => {
                type $T = u8;
                $body
            }
            cartage_core::DType::Bool => {
                type $T = $crate::elem::Bool8;
                $body
            }
        }
    };
}

/// Bind `$T` to the storage type of a float `$dtype`; other dtypes evaluate `$other`.
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dtype {
            cartage_core::DType::F32 => {
                type $T = f32;
                $body
            }
            cartage_core::DType::F64 => {
                type $T = f64;
                $body
            }
            cartage_core::DType::F16 => {
                type $T = half::f16;
                $body
            }
            cartage_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            _ => $other,
        }
    };
}

/// Bind `$T` to an unsigned type of `$bytes` bytes (1, 2, 4, 8): for kernels that only move
/// elements. Other sizes evaluate `$other`.
macro_rules! with_bits {
    ($bytes:expr, $T:ident => $body:expr, else $other:expr) => {
        match $bytes {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            8 => {
                type $T = u64;
                $body
            }
            _ => $other,
        }
    };
}

pub(crate) use {with_bits, with_float, with_storage};
