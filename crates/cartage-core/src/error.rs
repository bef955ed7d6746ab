//! [`Error`]: one variant per failure. Each message says what happened, the most likely cause and
//! what to check first (ARTICLE R28), and carries the structured fields a program can match on.

use std::fmt;
use std::panic::Location;

use crate::allocator::OomReport;
use crate::device::Device;
use crate::dtype::DType;

/// A source location: where a tensor was created or last moved, or where a sync happened.
pub type Site = &'static Location<'static>;

/// A `Result` with cartage's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Prints a list of sizes as `[2, 3]`.
pub(crate) struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Every failure cartage reports. No user input panics; it becomes one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Operands of one op live on different devices (R16).
    #[error(
        "`{op}`: operands are on different devices, {lhs_device} and {rhs_device}. \
         The {lhs_device} operand was created or last moved at {lhs_site}; the {rhs_device} operand \
         at {rhs_site}. Likely cause: one of them was built or loaded without the device your \
         program picked. Check those two lines; move one with `.to(&device)` explicitly"
    )]
    DeviceMismatch {
        /// The op that found the mismatch.
        op: &'static str,
        /// Device of the first operand.
        lhs_device: Device,
        /// Where the first operand was created or last moved.
        lhs_site: Site,
        /// Device of the second operand.
        rhs_device: Device,
        /// Where the second operand was created or last moved.
        rhs_site: Site,
    },

    /// Operands of one op have dtypes that do not combine.
    #[error(
        "`{op}`: dtype mismatch, {lhs} (created at {lhs_site}) against {rhs} (created at \
         {rhs_site}). cartage never promotes silently; convert one operand with `.to_dtype(..)`"
    )]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// First dtype.
        lhs: DType,
        /// Where the first operand was created.
        lhs_site: Site,
        /// Second dtype.
        rhs: DType,
        /// Where the second operand was created.
        rhs_site: Site,
    },

    /// A dtype an op does not accept (for example a float tensor used as indices, R27).
    #[error("`{op}`: dtype {dtype} is not accepted here: {expected}")]
    WrongDType {
        /// The op.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the op expects, and the usual fix.
        expected: &'static str,
    },

    /// Shapes that do not fit together for this op.
    #[error(
        "`{op}`: shapes {} and {} do not fit: {reason}",
        ShapeDisplay(lhs),
        ShapeDisplay(rhs)
    )]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// First shape.
        lhs: Vec<usize>,
        /// Second shape.
        rhs: Vec<usize>,
        /// Why, and what to check.
        reason: String,
    },

    /// A dimension index beyond the tensor's rank.
    #[error(
        "`{op}`: dimension {dim} is out of range for a tensor of rank {rank} (valid: 0..{rank}, or negative from the end)"
    )]
    DimOutOfRange {
        /// The op.
        op: &'static str,
        /// The dimension asked for.
        dim: isize,
        /// The tensor's rank.
        rank: usize,
    },

    /// An invalid argument to a layout or construction op (bad narrow range, bad permutation…).
    #[error("`{op}`: {reason}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong and what to check.
        reason: String,
    },

    /// A shape whose element or byte count overflows `usize`.
    #[error(
        "shape {} of {dtype} overflows the addressable size: its element or byte count does not fit in memory. Check for a dimension computed from an uninitialised or negative value",
        ShapeDisplay(shape)
    )]
    SizeOverflow {
        /// The shape.
        shape: Vec<usize>,
        /// The dtype.
        dtype: DType,
    },

    /// Host data whose length does not match the shape asked for.
    #[error("`{op}`: {len} values given for shape {} which holds {numel}", ShapeDisplay(shape))]
    DataLength {
        /// The op.
        op: &'static str,
        /// The shape asked for.
        shape: Vec<usize>,
        /// Its element count.
        numel: usize,
        /// How many values were given.
        len: usize,
    },

    /// An index outside the indexed dimension, found on the device.
    #[error(
        "`{op}`: index {index} is out of range for dimension {dim} of size {size} on {device}. Check how the indices were computed (off by one? wrong vocabulary size?)"
    )]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// The offending index (the first found).
        index: i64,
        /// The indexed dimension.
        dim: usize,
        /// Its size.
        size: usize,
        /// The device that checked.
        device: Device,
    },

    /// `item()` on a tensor with other than one element.
    #[error(
        "`item`: the tensor has shape {} ({numel} elements); `item` needs exactly one. Reduce it first or use `to_vec`",
        ShapeDisplay(shape)
    )]
    NotAScalar {
        /// The shape.
        shape: Vec<usize>,
        /// Its element count.
        numel: usize,
    },

    /// A backend that cannot run an op for a dtype (R26).
    #[error(
        "`{op}` for {dtype} is not supported on {device}: {reason}. Ask `capabilities()` before choosing a dtype, or cast with `.to_dtype(..)`"
    )]
    Unsupported {
        /// The op.
        op: String,
        /// The dtype.
        dtype: DType,
        /// The device.
        device: Device,
        /// Why (missing hardware feature, no kernel for it…).
        reason: String,
    },

    /// The device ran out of memory (R22): the report says whether fragmentation is the cause.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),

    /// A device string or `CARTAGE_DEVICE` value that does not parse.
    #[error("invalid device `{input}`: {reason}")]
    InvalidDevice {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A device whose backend was not compiled into this build (R28: "not compiled with CUDA").
    #[error(
        "{device} was asked for, but this build of cartage was compiled without its backend. Enable the `{feature}` feature of the `cartage` crate (e.g. `cargo build --features {feature}`), or pick another device with CARTAGE_DEVICE"
    )]
    BackendNotCompiled {
        /// The device asked for.
        device: Device,
        /// The cargo feature that enables it.
        feature: &'static str,
    },

    /// The backend is compiled in but cannot run here (no driver, no adapter, no such ordinal).
    #[error("{device} is not available: {reason}")]
    BackendUnavailable {
        /// The device asked for.
        device: Device,
        /// Why, and what to check (driver installed? `nvidia-smi`? ordinal below the count?).
        reason: String,
    },

    /// A failure reported by the driver or runtime underneath a backend.
    #[error("{device}: `{op}` failed in the driver: {message}")]
    Driver {
        /// The device.
        device: Device,
        /// What cartage was doing.
        op: &'static str,
        /// The driver's message.
        message: String,
    },

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file whose contents are not in the expected format.
    #[error("{path}: not a valid {format} file: {reason}")]
    Format {
        /// The file.
        path: String,
        /// The expected format.
        format: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// A short, stable name of the variant (for tables and logs).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Error::DeviceMismatch { .. } => "device-mismatch",
            Error::DTypeMismatch { .. } => "dtype-mismatch",
            Error::WrongDType { .. } => "wrong-dtype",
            Error::ShapeMismatch { .. } => "shape-mismatch",
            Error::DimOutOfRange { .. } => "dim-out-of-range",
            Error::InvalidArgument { .. } => "invalid-argument",
            Error::SizeOverflow { .. } => "size-overflow",
            Error::DataLength { .. } => "data-length",
            Error::IndexOutOfRange { .. } => "index-out-of-range",
            Error::NotAScalar { .. } => "not-a-scalar",
            Error::Unsupported { .. } => "unsupported",
            Error::OutOfMemory(_) => "out-of-memory",
            Error::InvalidDevice { .. } => "invalid-device",
            Error::BackendNotCompiled { .. } => "backend-not-compiled",
            Error::BackendUnavailable { .. } => "backend-unavailable",
            Error::Driver { .. } => "driver",
            Error::Io { .. } => "io",
            Error::Format { .. } => "format",
        }
    }

    /// Shorthand for [`Error::Unsupported`].
    pub fn unsupported(op: impl Into<String>, dtype: DType, device: Device, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            op: op.into(),
            dtype,
            device,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }
}
