//! The checks every op makes before it allocates or launches: one device, matching dtypes, a
//! dtype the op is defined for. Each failure is a typed [`Error`] naming both operands' devices
//! or dtypes and where each operand was created or last moved (R16, R27).

use cartage_core::{DType, Dims, Error, Layout, Op, Result, broadcast_shapes};

use super::Tensor;

/// Fail with [`Error::DeviceMismatch`] unless `lhs` and `rhs` live on one device.
pub(super) fn same_device(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<()> {
    if lhs.device == rhs.device {
        return Ok(());
    }
    Err(Error::DeviceMismatch {
        op,
        lhs_device: lhs.device,
        lhs_site: lhs.origin,
        rhs_device: rhs.device,
        rhs_site: rhs.origin,
    })
}

/// Fail with [`Error::DTypeMismatch`] unless `lhs` and `rhs` have one dtype (never promotes).
pub(super) fn same_dtype(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<()> {
    if lhs.dtype == rhs.dtype {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        op,
        lhs: lhs.dtype,
        lhs_site: lhs.origin,
        rhs: rhs.dtype,
        rhs_site: rhs.origin,
    })
}

/// Both checks, device first.
pub(super) fn same_device_and_dtype(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<()> {
    same_device(op, lhs, rhs)?;
    same_dtype(op, lhs, rhs)
}

/// Fail with [`Error::WrongDType`] unless `kernel_op` is defined for `dtype` on any device.
pub(super) fn defined_for(name: &'static str, kernel_op: Op, dtype: DType, expected: &'static str) -> Result<()> {
    if kernel_op.defined_for(dtype) {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op: name,
            dtype,
            expected,
        })
    }
}

/// Fail with [`Error::WrongDType`] unless `dtype` is a float dtype.
pub(super) fn float(name: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op: name,
            dtype,
            expected: "a float dtype (f32, f64, f16, bf16); convert with `.to_dtype(DType::F32)` first",
        })
    }
}

/// Fail with [`Error::WrongDType`] unless `index` holds integers (i32 or i64) — on every device
/// alike, so code that passes on one backend cannot break on another (R27).
pub(super) fn index_dtype(name: &'static str, index: &Tensor) -> Result<()> {
    if index.dtype.is_index() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op: name,
            dtype: index.dtype,
            expected: "an index tensor of i64 or i32; float indices are refused on every device. \
                       Build indices as integers, or convert with `.to_dtype(DType::I64)`",
        })
    }
}

/// The broadcast (numpy rules) of two operands: both layouts viewed at the common shape.
pub(super) fn broadcast_pair(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<(Layout, Layout, Dims)> {
    if lhs.shape() == rhs.shape() {
        let shape = Dims::from_slice(lhs.shape());
        return Ok((lhs.layout.clone(), rhs.layout.clone(), shape));
    }
    let shape = broadcast_shapes(lhs.shape(), rhs.shape()).map_err(|e| rename(e, op))?;
    let l = lhs
        .layout
        .broadcast_to(&shape)
        .map_err(|e| rename(e, op).with_dtype(lhs.dtype))?;
    let r = rhs
        .layout
        .broadcast_to(&shape)
        .map_err(|e| rename(e, op).with_dtype(rhs.dtype))?;
    Ok((l, r, shape))
}

/// Put the op's own name on a shape error raised by a layout helper.
pub(super) fn rename(error: Error, op: &'static str) -> Error {
    match error {
        Error::ShapeMismatch { lhs, rhs, reason, .. } => Error::ShapeMismatch { op, lhs, rhs, reason },
        Error::DimOutOfRange { dim, rank, .. } => Error::DimOutOfRange { op, dim, rank },
        Error::InvalidArgument { reason, .. } => Error::InvalidArgument { op, reason },
        other => other,
    }
}
