//! [`Error`]: one variant per failure. Each message says what happened, the most likely cause and
//! what to check first (LESSONS R28), and carries the structured fields a program can match on.

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

/// The body of [`Error::SizeOverflow`]: the shape, the dtype, the element and byte counts it
/// asks for (computed in 128 bits, so they print even when they do not fit `usize`) and the limit.
struct SizeOverflowDisplay<'a>(&'a [usize], DType);

impl fmt::Display for SizeOverflowDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SizeOverflowDisplay(shape, dtype) = *self;
        let numel = shape.iter().try_fold(1u128, |n, &d| n.checked_mul(d as u128));
        write!(
            f,
            "shape {} of {dtype} overflows the addressable size: it asks for ",
            ShapeDisplay(shape)
        )?;
        match numel {
            Some(n) => match n.checked_mul(dtype.size_in_bytes() as u128) {
                Some(bytes) => write!(f, "{n} elements ({bytes} bytes)")?,
                None => write!(f, "{n} elements (more than 2^128 bytes)")?,
            },
            None => write!(f, "more than 2^128 elements")?,
        }
        write!(
            f,
            ", where at most {} elements and {} bytes fit. Check for a dimension computed from an \
             uninitialised, negative or wrapped-around value",
            crate::layout::MAX_ELEMENTS,
            isize::MAX
        )
    }
}

/// The valid dimensions of an op on a tensor of `rank` (`unsqueeze` may also insert at `rank`).
struct DimRange<'a>(&'a str, usize);

impl fmt::Display for DimRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            ("unsqueeze", rank) => write!(
                f,
                "a new dimension goes at 0..={rank}, or -{}..=-1 counting from the end",
                rank + 1
            ),
            (_, 0) => write!(f, "a rank-0 tensor has no dimension to name"),
            (_, rank) => write!(f, "valid: 0..{rank}, or negative from the end down to -{rank}"),
        }
    }
}

/// The body of [`Error::DTypeMismatch`], with the fix that suits the op: host reads name the
/// element type to read with (and `to_vec_f64`, which reads any dtype).
struct DTypeMismatchDisplay<'a> {
    op: &'a str,
    lhs: DType,
    lhs_site: &'a Site,
    rhs: DType,
    rhs_site: &'a Site,
}

impl fmt::Display for DTypeMismatchDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DTypeMismatchDisplay {
            op,
            lhs,
            lhs_site,
            rhs,
            rhs_site,
        } = *self;
        match op {
            "to_vec" => write!(
                f,
                "`to_vec::<{rhs}>()` at {rhs_site}: dtype mismatch, the tensor holds {lhs} (created at {lhs_site}) \
                 and cartage never converts silently. Read it with `to_vec::<{lhs}>()`, read any dtype widened \
                 to f64 with `to_vec_f64()`, or convert first with `.to_dtype(DType::{rhs:?})`"
            ),
            "item" => write!(
                f,
                "`item::<{rhs}>()` at {rhs_site}: dtype mismatch, the tensor holds {lhs} (created at {lhs_site}) \
                 and cartage never converts silently. Read it with `item::<{lhs}>()`, or convert first with \
                 `.to_dtype(DType::{rhs:?})`"
            ),
            _ => {
                let common = lhs.promote(rhs);
                let which = match (lhs == common, rhs == common) {
                    (true, _) => "the right operand",
                    (_, true) => "the left operand",
                    _ => "both operands",
                };
                write!(
                    f,
                    "`{op}`: dtype mismatch, {lhs} (created at {lhs_site}) against {rhs} (created at {rhs_site}). \
                     cartage never promotes silently (PyTorch would compute in {common}); convert {which} \
                     with `.to_dtype(DType::{common:?})`, or both to the dtype you mean"
                )
            }
        }
    }
}

/// The body of [`Error::RanksMissing`]: which ranks, how long, and what to check.
struct RanksMissingDisplay<'a> {
    op: &'a str,
    rank: usize,
    world_size: usize,
    missing: &'a [usize],
    waited: std::time::Duration,
}

impl fmt::Display for RanksMissingDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let RanksMissingDisplay {
            op,
            rank,
            world_size,
            missing,
            waited,
        } = *self;
        write!(f, "`{op}` on rank {rank} of {world_size}: ")?;
        match missing {
            [] => write!(f, "the other ranks did not complete it within {waited:.1?}")?,
            [one] => write!(f, "rank {one} did not take part within {waited:.1?}")?,
            many => write!(f, "ranks {many:?} did not take part within {waited:.1?}")?,
        }
        write!(
            f,
            ". Likely cause: a rank was not started, failed earlier (see its log), or was given another \
             WORLD_SIZE, MASTER_ADDR or MASTER_PORT; every rank must issue the same collectives in the same order"
        )
    }
}

/// The body of [`Error::StateMismatch`]: every offending key, grouped, and what to do.
struct StateMismatchDisplay<'a> {
    what: &'a str,
    missing: &'a [String],
    unexpected: &'a [String],
    mismatched: &'a [String],
}

impl fmt::Display for StateMismatchDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: the state does not match what it is loaded into", self.what)?;
        let groups = [
            ("missing keys", self.missing),
            ("unexpected keys", self.unexpected),
            ("mismatched entries", self.mismatched),
        ];
        for (label, keys) in groups {
            if !keys.is_empty() {
                write!(f, "; {} {label}: {}", keys.len(), keys.join(", "))?;
            }
        }
        write!(
            f,
            ". Nothing was loaded. Check that the file was saved from the same architecture and \
             configuration, or load with strict = false to take only the keys that match"
        )
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

    /// Operands of one op have dtypes that do not combine. For a host read (`to_vec`, `item`)
    /// `lhs` is the tensor's dtype and `rhs` the element type asked for, at the read's site.
    #[error("{}", DTypeMismatchDisplay { op, lhs: *lhs, lhs_site, rhs: *rhs, rhs_site })]
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

    /// A dimension index beyond the tensor's rank (`rank` is the tensor's own rank, also for
    /// `unsqueeze`, which may insert at `rank`).
    #[error(
        "`{op}`: dimension {dim} is out of range for a tensor of rank {rank} ({})",
        DimRange(op, *rank)
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

    /// A shape with more elements than a layout may span ([`crate::layout::MAX_ELEMENTS`]) or
    /// more bytes than fit in `isize`. The message gives the element and byte counts asked for.
    #[error("{}", SizeOverflowDisplay(shape, *dtype))]
    SizeOverflow {
        /// The shape.
        shape: Vec<usize>,
        /// The dtype (u8, one byte per element, when raised by a [`crate::Layout`], which knows
        /// no dtype; see [`Error::with_dtype`]).
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

    /// A backend that cannot run an op for a dtype (R26), or lacks a feature whatever the dtype
    /// (pinned memory, graph capture).
    #[error("`{op}`{} is not supported on {device}: {reason}{}", for_dtype(.dtype), dtype_hint(.dtype))]
    Unsupported {
        /// The op.
        op: String,
        /// The dtype, when the refusal depends on it; `None` for a feature the device lacks
        /// whatever the dtype.
        dtype: Option<DType>,
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

    /// A file could not be read or written. The operating system's error is kept whole (its
    /// [`std::io::ErrorKind`] through [`Error::io_kind`], and as the error's source).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A gradient was asked for where none can be computed: backward from a tensor that no
    /// variable leads to, from a non-scalar without an output gradient, through a graph an
    /// earlier backward freed, or through an op that has no derivative. The message says what to
    /// do instead.
    #[error("`{op}`: {reason}")]
    Autograd {
        /// The op (or `backward`).
        op: &'static str,
        /// What is wrong and what to do.
        reason: String,
    },

    /// Ranks of a distributed group that did not take part in a rendezvous or a collective in
    /// time (never started, failed, or left the group). `missing` is empty when the engine
    /// cannot tell which.
    #[error("{}", RanksMissingDisplay { op, rank: *rank, world_size: *world_size, missing, waited: *waited })]
    RanksMissing {
        /// The rendezvous or collective.
        op: &'static str,
        /// The rank that gave up.
        rank: usize,
        /// The group's size.
        world_size: usize,
        /// The ranks that never arrived or left, where known.
        missing: Vec<usize>,
        /// How long this rank waited.
        waited: std::time::Duration,
    },

    /// An operation that a graph capture cannot record: it waits for the device on the host
    /// (a synchronisation, a read-back, an upload from host memory, an event's time), or its
    /// result would repeat on every replay (a random draw), or it came from another thread while
    /// one thread captures the device's stream.
    #[error(
        "`{op}` cannot run while {device} captures a graph: {reason}. Do it before the capture (create and fill inputs first, warm up once) or after it (read outputs after `replay`)"
    )]
    GraphCapture {
        /// The refused operation.
        op: &'static str,
        /// The capturing device.
        device: Device,
        /// Why it cannot be captured.
        reason: &'static str,
    },

    /// A tensor that an op saved for backward was written in place (by a kernel into an
    /// existing tensor, `copy_from`, an optimizer step, or a write through a `detach()`ed view)
    /// after the op was recorded: its gradient would be computed from the new values. The
    /// message names the op and where it was recorded, and the last in-place write and its site.
    #[error(
        "`{op}` (recorded at {recorded_at}) saved a tensor for backward that was modified in place after it was saved (version {saved_version}, now {version}; last written by `{written_by}` at {written_at}). Its gradient would use the new values. Write into a copy (`.clone_data()`, or a fresh tensor), or run the in-place update after `backward`"
    )]
    ModifiedInPlace {
        /// The recorded op whose saved tensor changed.
        op: &'static str,
        /// Where the op was recorded.
        recorded_at: Site,
        /// The storage's version when the op saved it.
        saved_version: u64,
        /// The storage's version now.
        version: u64,
        /// The last in-place write (`copy_from`, `adam_step_`, ...).
        written_by: &'static str,
        /// Where that write was called.
        written_at: Site,
    },

    /// A call made in an order its object does not allow: a second `unscale` in one step, a
    /// `step` without `update` after it, a backward re-entered from its own hook, a second
    /// backward through a graph another thread is freeing. Nothing was changed.
    #[error("`{op}`: {reason}")]
    InvalidState {
        /// The refused call.
        op: &'static str,
        /// What was called before, and what to call instead.
        reason: String,
    },

    /// A checkpoint or state dict that does not match what it is loaded into: keys missing,
    /// keys unexpected, or entries of another shape or dtype. Nothing was loaded. Each list
    /// names every offending key; pass `strict = false` to load the keys that match.
    #[error("{}", StateMismatchDisplay { what, missing, unexpected, mismatched })]
    StateMismatch {
        /// What was being loaded (`load_state_dict`, `load_checkpoint`, ...).
        what: &'static str,
        /// Keys the target has and the source lacks.
        missing: Vec<String>,
        /// Keys the source has and the target does not.
        unexpected: Vec<String>,
        /// `key: expected …, found …` for entries of another shape or dtype.
        mismatched: Vec<String>,
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

/// What kind of failure an [`Error`] is: one value per variant, without the details, for
/// matching in tests and for logs and tables (`Copy`, comparable, hashable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::DeviceMismatch`].
    DeviceMismatch,
    /// [`Error::DTypeMismatch`].
    DTypeMismatch,
    /// [`Error::WrongDType`].
    WrongDType,
    /// [`Error::ShapeMismatch`].
    ShapeMismatch,
    /// [`Error::DimOutOfRange`].
    DimOutOfRange,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::SizeOverflow`].
    SizeOverflow,
    /// [`Error::DataLength`].
    DataLength,
    /// [`Error::IndexOutOfRange`].
    IndexOutOfRange,
    /// [`Error::NotAScalar`].
    NotAScalar,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::OutOfMemory`].
    OutOfMemory,
    /// [`Error::InvalidDevice`].
    InvalidDevice,
    /// [`Error::BackendNotCompiled`].
    BackendNotCompiled,
    /// [`Error::BackendUnavailable`].
    BackendUnavailable,
    /// [`Error::Driver`].
    Driver,
    /// [`Error::Io`].
    Io,
    /// [`Error::Format`].
    Format,
    /// [`Error::Autograd`].
    Autograd,
    /// [`Error::RanksMissing`].
    RanksMissing,
    /// [`Error::GraphCapture`].
    GraphCapture,
    /// [`Error::ModifiedInPlace`].
    ModifiedInPlace,
    /// [`Error::InvalidState`].
    InvalidState,
    /// [`Error::StateMismatch`].
    StateMismatch,
}

impl ErrorKind {
    /// A short, stable name (`device-mismatch`, `size-overflow`, …).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::DeviceMismatch => "device-mismatch",
            ErrorKind::DTypeMismatch => "dtype-mismatch",
            ErrorKind::WrongDType => "wrong-dtype",
            ErrorKind::ShapeMismatch => "shape-mismatch",
            ErrorKind::DimOutOfRange => "dim-out-of-range",
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::SizeOverflow => "size-overflow",
            ErrorKind::DataLength => "data-length",
            ErrorKind::IndexOutOfRange => "index-out-of-range",
            ErrorKind::NotAScalar => "not-a-scalar",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::OutOfMemory => "out-of-memory",
            ErrorKind::InvalidDevice => "invalid-device",
            ErrorKind::BackendNotCompiled => "backend-not-compiled",
            ErrorKind::BackendUnavailable => "backend-unavailable",
            ErrorKind::Driver => "driver",
            ErrorKind::Io => "io",
            ErrorKind::Format => "format",
            ErrorKind::Autograd => "autograd",
            ErrorKind::RanksMissing => "ranks-missing",
            ErrorKind::GraphCapture => "graph-capture",
            ErrorKind::ModifiedInPlace => "modified-in-place",
            ErrorKind::InvalidState => "invalid-state",
            ErrorKind::StateMismatch => "state-mismatch",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Error {
    /// What kind of failure this is.
    ///
    /// ```
    /// use cartage_core::error::ErrorKind;
    /// use cartage_core::Device;
    /// let err = "cuda".parse::<Device>().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidDevice);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::DeviceMismatch { .. } => ErrorKind::DeviceMismatch,
            Error::DTypeMismatch { .. } => ErrorKind::DTypeMismatch,
            Error::WrongDType { .. } => ErrorKind::WrongDType,
            Error::ShapeMismatch { .. } => ErrorKind::ShapeMismatch,
            Error::DimOutOfRange { .. } => ErrorKind::DimOutOfRange,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::SizeOverflow { .. } => ErrorKind::SizeOverflow,
            Error::DataLength { .. } => ErrorKind::DataLength,
            Error::IndexOutOfRange { .. } => ErrorKind::IndexOutOfRange,
            Error::NotAScalar { .. } => ErrorKind::NotAScalar,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::OutOfMemory(_) => ErrorKind::OutOfMemory,
            Error::InvalidDevice { .. } => ErrorKind::InvalidDevice,
            Error::BackendNotCompiled { .. } => ErrorKind::BackendNotCompiled,
            Error::BackendUnavailable { .. } => ErrorKind::BackendUnavailable,
            Error::Driver { .. } => ErrorKind::Driver,
            Error::Io { .. } => ErrorKind::Io,
            Error::Format { .. } => ErrorKind::Format,
            Error::Autograd { .. } => ErrorKind::Autograd,
            Error::GraphCapture { .. } => ErrorKind::GraphCapture,
            Error::RanksMissing { .. } => ErrorKind::RanksMissing,
            Error::ModifiedInPlace { .. } => ErrorKind::ModifiedInPlace,
            Error::InvalidState { .. } => ErrorKind::InvalidState,
            Error::StateMismatch { .. } => ErrorKind::StateMismatch,
        }
    }

    /// A short, stable name of the variant (for tables and logs): `self.kind().name()`.
    pub fn kind_name(&self) -> &'static str {
        self.kind().name()
    }

    /// The [`std::io::ErrorKind`] of an [`Error::Io`] (`NotFound`, `PermissionDenied`, …).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// Shorthand for [`Error::Io`].
    #[cold]
    pub fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }

    /// Shorthand for [`Error::SizeOverflow`].
    #[cold]
    pub fn size_overflow(shape: &[usize], dtype: DType) -> Self {
        Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype,
        }
    }

    /// The same error naming `dtype` if it is an [`Error::SizeOverflow`] (whose dtype a
    /// [`crate::Layout`] cannot know); any other error unchanged.
    #[cold]
    pub fn with_dtype(self, dtype: DType) -> Self {
        match self {
            Error::SizeOverflow { shape, .. } => Error::SizeOverflow { shape, dtype },
            other => other,
        }
    }

    /// Shorthand for [`Error::Unsupported`] of an op in a dtype.
    #[cold]
    pub fn unsupported(op: impl Into<String>, dtype: DType, device: Device, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            op: op.into(),
            dtype: Some(dtype),
            device,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Unsupported`] of a feature the device lacks whatever the dtype
    /// (its message does not suggest another dtype).
    ///
    /// ```
    /// use cartage_core::{Device, Error};
    /// let e = Error::unsupported_feature("begin_capture", Device::cpu(), "this device has no graph capture");
    /// assert_eq!(e.to_string(), "`begin_capture` is not supported on cpu: this device has no graph capture");
    /// ```
    #[cold]
    pub fn unsupported_feature(op: impl Into<String>, device: Device, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            op: op.into(),
            dtype: None,
            device,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    #[cold]
    pub fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }
}

/// " for f16" in [`Error::Unsupported`]'s message, or nothing when no dtype is named.
fn for_dtype(dtype: &Option<DType>) -> String {
    dtype.map(|d| format!(" for {d}")).unwrap_or_default()
}

/// The advice of [`Error::Unsupported`]'s message when the refusal depends on the dtype.
fn dtype_hint(dtype: &Option<DType>) -> &'static str {
    match dtype {
        Some(_) => ". Ask `capabilities()` before choosing a dtype, or cast with `.to_dtype(..)`",
        None => "",
    }
}
