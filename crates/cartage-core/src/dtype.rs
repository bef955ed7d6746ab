//! [`DType`], the [`Element`] trait tying Rust types to dtypes, and [`Scalar`] fill values.
//!
//! Bytes are numel × dtype size (R19): f64/i64 8, f32/i32 4, f16/bf16 2, u8/bool 1.

use std::borrow::Cow;
use std::fmt;

use half::{bf16, f16};

/// An element type. `Bool` is stored as one byte holding 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 16-bit IEEE float (narrow range; computed in f32 on every backend).
    F16,
    /// bfloat16: f32's range with an 8-bit mantissa (computed in f32).
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer (the default index type).
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean, one byte.
    Bool,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The short name (`f32`, `bf16`, `bool`, …), as used in kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// True for f32, f64, f16 and bf16.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for i32, i64 and u8.
    pub const fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }

    /// True for the dtypes an index tensor may have (i32, i64).
    pub const fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// The dtype PyTorch's `torch.promote_types(self, other)` gives: the smallest dtype both
    /// convert to without losing their kind — bool below every integer, integers below every
    /// float, `f16` with `bf16` to `f32`, anything with `f64` to `f64`. cartage's binary ops do
    /// **not** promote (a mixed pair is [`crate::Error::DTypeMismatch`]); the error names this
    /// dtype as the cast to write.
    ///
    /// ```
    /// use cartage_core::DType;
    /// assert_eq!(DType::BF16.promote(DType::F32), DType::F32);
    /// assert_eq!(DType::F16.promote(DType::BF16), DType::F32);
    /// assert_eq!(DType::I64.promote(DType::F16), DType::F16);
    /// assert_eq!(DType::U8.promote(DType::I32), DType::I32);
    /// assert_eq!(DType::Bool.promote(DType::U8), DType::U8);
    /// ```
    pub const fn promote(self, other: DType) -> DType {
        use DType::*;
        match (self, other) {
            (a, b) if a as u8 == b as u8 => a,
            (Bool, x) | (x, Bool) => x,
            (F64, _) | (_, F64) => F64,
            (F32, _) | (_, F32) => F32,
            (F16, BF16) | (BF16, F16) => F32,
            (F16, _) | (_, F16) => F16,
            (BF16, _) | (_, BF16) => BF16,
            (I64, _) | (_, I64) => I64,
            (I32, _) | (_, I32) => I32,
            _ => U8,
        }
    }

    /// The machine epsilon of a float dtype, PyTorch's `torch.finfo(dtype).eps`: the gap between
    /// 1 and the next representable value (2⁻²³ for f32, 2⁻⁵² for f64, 2⁻¹⁰ for f16, 2⁻⁷ for
    /// bf16). `None` for integer and bool dtypes. `cartage`'s `Tensor::rms_norm` uses it when no
    /// `eps` is given, as PyTorch does.
    ///
    /// ```
    /// use cartage_core::DType;
    /// assert_eq!(DType::F32.eps(), Some(f32::EPSILON as f64));
    /// assert_eq!(DType::BF16.eps(), Some(0.0078125));
    /// assert_eq!(DType::I64.eps(), None);
    /// ```
    pub const fn eps(self) -> Option<f64> {
        match self {
            DType::F32 => Some(f32::EPSILON as f64),
            DType::F64 => Some(f64::EPSILON),
            DType::F16 => Some(1.0 / 1024.0),
            DType::BF16 => Some(1.0 / 128.0),
            DType::I32 | DType::I64 | DType::U8 | DType::Bool => None,
        }
    }

    /// Parse a short name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Round an `f64` to the value this dtype would store, as an `f64` (the conformance
    /// reference uses it). Integers truncate toward zero and saturate; NaN becomes 0.
    pub fn round_trip(self, v: f64) -> f64 {
        match self {
            DType::F64 => v,
            DType::F32 => v as f32 as f64,
            DType::F16 => f16::from_f64(v).to_f64(),
            DType::BF16 => bf16::from_f64(v).to_f64(),
            DType::I32 => v as i32 as f64,
            DType::I64 => v as i64 as f64,
            DType::U8 => v as u8 as f64,
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

/// The names [`DType::from_str`](std::str::FromStr::from_str) accepts for each dtype (lower
/// case; parsing ignores case, surrounding spaces and a `torch.` prefix).
const DTYPE_NAMES: [(DType, &[&str]); 8] = [
    (DType::F32, &["f32", "float32", "float"]),
    (DType::F64, &["f64", "float64", "double"]),
    (DType::F16, &["f16", "float16", "half"]),
    (DType::BF16, &["bf16", "bfloat16"]),
    (DType::I32, &["i32", "int32", "int"]),
    (DType::I64, &["i64", "int64", "long"]),
    (DType::U8, &["u8", "uint8"]),
    (DType::Bool, &["bool"]),
];

/// Parse a dtype name: the short names (`f32`, `bf16`, `i64`, `bool`, …), PyTorch's long
/// names (`float32`, `bfloat16`, `int64`, …) and aliases (`float`, `double`, `half`, `int`,
/// `long`), in any case, with or without a `torch.` prefix. Anything else is
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) listing the valid names.
///
/// ```
/// use cartage_core::DType;
/// assert_eq!("float32".parse::<DType>()?, DType::F32);
/// assert_eq!("BF16".parse::<DType>()?, DType::BF16);
/// assert_eq!("torch.int64".parse::<DType>()?, DType::I64);
/// let err = "f8".parse::<DType>().unwrap_err();
/// assert!(err.to_string().contains("bfloat16"));
/// # Ok::<(), cartage_core::Error>(())
/// ```
impl std::str::FromStr for DType {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let name = lower.strip_prefix("torch.").unwrap_or(&lower);
        for (dtype, names) in DTYPE_NAMES {
            if names.contains(&name) {
                return Ok(dtype);
            }
        }
        let valid: Vec<String> = DTYPE_NAMES.iter().map(|(_, names)| names.join("/")).collect();
        Err(crate::Error::invalid(
            "parse dtype",
            format!("unknown dtype `{s}`; valid names are {}", valid.join(", ")),
        ))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fill value, kept exact for integers beyond 2^53.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A floating-point value.
    Float(f64),
    /// An integer value.
    Int(i64),
    /// A boolean value.
    Bool(bool),
}

impl Scalar {
    /// The value as `f64` (booleans are 0 or 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(b) => b as u8 as f64,
        }
    }

    /// The value as `i64` (floats truncate toward zero, saturating; NaN is 0).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Float(v) => v as i64,
            Scalar::Int(v) => v,
            Scalar::Bool(b) => b as i64,
        }
    }

    /// The value as a boolean (non-zero is true).
    pub fn as_bool(self) -> bool {
        match self {
            Scalar::Float(v) => v != 0.0,
            Scalar::Int(v) => v != 0,
            Scalar::Bool(b) => b,
        }
    }

    /// The little-endian bytes of this value stored as `dtype` (`as` semantics for casts).
    pub fn to_bytes(self, dtype: DType) -> Vec<u8> {
        match dtype {
            DType::F32 => (self.as_f64() as f32).to_le_bytes().to_vec(),
            DType::F64 => self.as_f64().to_le_bytes().to_vec(),
            DType::F16 => f16::from_f64(self.as_f64()).to_le_bytes().to_vec(),
            DType::BF16 => bf16::from_f64(self.as_f64()).to_le_bytes().to_vec(),
            // A float converts straight to the target (`as` truncates and saturates there);
            // an integer wraps, as an integer `as` cast does.
            DType::I32 => match self {
                Scalar::Float(v) => v as i32,
                other => other.as_i64() as i32,
            }
            .to_le_bytes()
            .to_vec(),
            DType::I64 => self.as_i64().to_le_bytes().to_vec(),
            DType::U8 => vec![match self {
                Scalar::Float(v) => v as u8,
                other => other.as_i64() as u8,
            }],
            DType::Bool => vec![self.as_bool() as u8],
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}
impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v as f64)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v as i64)
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

/// A Rust type that is the element of a [`DType`].
///
/// ```
/// use cartage_core::{DType, Element};
/// assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
/// let bytes = f32::to_le_bytes_vec(&[1.0, 2.0]);
/// assert_eq!(f32::from_le_bytes_slice(&bytes), vec![1.0, 2.0]);
/// ```
pub trait Element: Copy + Send + Sync + fmt::Debug + PartialEq + 'static {
    /// The dtype this type stores as.
    const DTYPE: DType;
    /// Widen to `f64` (booleans are 0 or 1).
    fn to_f64(self) -> f64;
    /// Narrow from `f64` with `as` semantics.
    fn from_f64(v: f64) -> Self;
    /// The elements as little-endian bytes (borrowed where the layout already is).
    fn to_le_bytes_vec(values: &[Self]) -> Cow<'_, [u8]>;
    /// Elements from little-endian bytes; `bytes.len()` must be a multiple of the element size
    /// (trailing bytes are ignored).
    fn from_le_bytes_slice(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! pod_element {
    ($t:ty, $dtype:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            fn to_le_bytes_vec(values: &[Self]) -> Cow<'_, [u8]> {
                Cow::Borrowed(bytemuck::cast_slice(values))
            }
            fn from_le_bytes_slice(bytes: &[u8]) -> Vec<Self> {
                let n = bytes.len() / std::mem::size_of::<$t>();
                bytemuck::pod_collect_to_vec(&bytes[..n * std::mem::size_of::<$t>()])
            }
        }
    };
}

pod_element!(f32, DType::F32, |x: f32| x as f64, |v: f64| v as f32);
pod_element!(f64, DType::F64, |x: f64| x, |v: f64| v);
pod_element!(f16, DType::F16, |x: f16| x.to_f64(), f16::from_f64);
pod_element!(bf16, DType::BF16, |x: bf16| x.to_f64(), bf16::from_f64);
pod_element!(i32, DType::I32, |x: i32| x as f64, |v: f64| v as i32);
pod_element!(i64, DType::I64, |x: i64| x as f64, |v: f64| v as i64);
pod_element!(u8, DType::U8, |x: u8| x as f64, |v: f64| v as u8);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_le_bytes_vec(values: &[Self]) -> Cow<'_, [u8]> {
        Cow::Owned(values.iter().map(|&b| b as u8).collect())
    }
    fn from_le_bytes_slice(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_is_the_gap_above_one() {
        for d in DType::ALL {
            let Some(eps) = d.eps() else {
                assert!(!d.is_float(), "{d} is a float dtype without an eps");
                continue;
            };
            assert!(d.is_float());
            // 1 + eps is stored exactly, and nothing between 1 and it is: half the gap rounds
            // back to 1 (ties to even).
            assert_eq!(d.round_trip(1.0 + eps), 1.0 + eps, "{d}");
            assert_eq!(d.round_trip(1.0 + eps / 2.0), 1.0, "{d}");
            assert_eq!(d.round_trip(1.0 + eps * 0.75), 1.0 + eps, "{d}");
        }
    }

    #[test]
    fn sizes_follow_r19() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_in_bytes()).collect();
        assert_eq!(sizes, vec![4, 8, 2, 2, 4, 8, 1, 1]);
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }

    #[test]
    fn dtype_parses_every_name_and_refuses_others() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().ok(), Some(d));
            assert_eq!(d.name().to_uppercase().parse::<DType>().ok(), Some(d));
        }
        assert_eq!(" torch.float16 ".parse::<DType>().ok(), Some(DType::F16));
        assert_eq!("double".parse::<DType>().ok(), Some(DType::F64));
        assert_eq!("uint8".parse::<DType>().ok(), Some(DType::U8));
        let err = "float8".parse::<DType>().unwrap_err();
        assert!(matches!(err, crate::Error::InvalidArgument { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("`float8`") && message.contains("f32/float32/float"),
            "{message}"
        );
    }

    #[test]
    fn scalar_bytes_round_trip() {
        assert_eq!(Scalar::Int(i64::MAX).to_bytes(DType::I64), i64::MAX.to_le_bytes());
        assert_eq!(
            Scalar::Float(1.5).to_bytes(DType::BF16),
            bf16::from_f32(1.5).to_le_bytes()
        );
        assert_eq!(Scalar::Float(-2.7).to_bytes(DType::I32), (-2i32).to_le_bytes());
        assert_eq!(Scalar::Bool(true).to_bytes(DType::F32), 1f32.to_le_bytes());
        // Floats saturate into narrow integers (Rust `as`); integers wrap.
        assert_eq!(Scalar::Float(-2.7).to_bytes(DType::U8), [0]);
        assert_eq!(Scalar::Float(3e9).to_bytes(DType::I32), i32::MAX.to_le_bytes());
        assert_eq!(Scalar::Int(-5).to_bytes(DType::U8), [251]);
    }
}

#[cfg(test)]
mod promotion_tests {
    use super::DType;
    use DType::*;

    /// `torch.promote_types(a, b)` for every pair of `DType::ALL`, as PyTorch 2.x prints it.
    const TORCH: [[DType; 8]; 8] = [
        [F32, F64, F32, F32, F32, F32, F32, F32],
        [F64, F64, F64, F64, F64, F64, F64, F64],
        [F32, F64, F16, F32, F16, F16, F16, F16],
        [F32, F64, F32, BF16, BF16, BF16, BF16, BF16],
        [F32, F64, F16, BF16, I32, I64, I32, I32],
        [F32, F64, F16, BF16, I64, I64, I64, I64],
        [F32, F64, F16, BF16, I32, I64, U8, U8],
        [F32, F64, F16, BF16, I32, I64, U8, Bool],
    ];

    #[test]
    fn promote_is_pytorchs_table() {
        for (i, a) in DType::ALL.into_iter().enumerate() {
            for (j, b) in DType::ALL.into_iter().enumerate() {
                assert_eq!(a.promote(b), TORCH[i][j], "promote({a}, {b})");
            }
        }
    }
}
