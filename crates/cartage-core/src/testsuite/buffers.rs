//! Host-side data of the suite: how random inputs are drawn ([`Spec`], and NaN/±inf sprinkled
//! into float inputs by [`sprinkle_specials`]), device allocations that free themselves
//! ([`DeviceBuffer`]), operands with their views and logical values ([`Operand`]), and the byte
//! encodings of every dtype.

use std::sync::{Arc, Weak};

use crate::allocator::BufferSlice;
use crate::dtype::DType;
use crate::kernel::TensorArg;
use crate::layout::Layout;

use super::harness::Harness;
use super::views::{ViewKind, view};

/// How to draw random input values: floats uniform in `float` (optionally on a grid of `step`
/// and with a random sign), integers uniform in `int` (clamped to the dtype), bools fair.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Float range `[lo, hi)`.
    pub float: (f64, f64),
    /// Integer range `lo..=hi`.
    pub int: (i64, i64),
    /// Round floats to multiples of this (0: continuous), so ties occur.
    pub step: f64,
    /// Negate floats with probability 1/2.
    pub random_sign: bool,
}

impl Spec {
    /// Floats in `float`, integers in `int`.
    pub const fn new(float: (f64, f64), int: (i64, i64)) -> Self {
        Spec {
            float,
            int,
            step: 0.0,
            random_sign: false,
        }
    }

    /// The default range: floats in [-4, 4), integers in -100..=100.
    pub const fn standard() -> Self {
        Spec::new((-4.0, 4.0), (-100, 100))
    }

    /// Floats on a grid of `step` (ties happen).
    pub const fn grid(mut self, step: f64) -> Self {
        self.step = step;
        self
    }

    /// Floats with a random sign.
    pub const fn signed(mut self) -> Self {
        self.random_sign = true;
        self
    }
}

/// The float values whose semantics are special cased (NaN propagation, infinities as extremes).
pub const SPECIAL_FLOATS: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// Replace each of `values` (already drawn for `dtype`) with NaN, +inf or −inf (one of
/// [`SPECIAL_FLOATS`], uniformly) with probability `1 / one_in`. Integer and bool dtypes, which
/// hold none of them, are left alone; so is everything when `one_in` is 0.
pub fn sprinkle_specials(h: &Harness, dtype: DType, values: &mut [f64], one_in: usize) {
    if !dtype.is_float() || one_in == 0 {
        return;
    }
    for v in values {
        if h.below(one_in) == 0 {
            *v = SPECIAL_FLOATS[h.below(SPECIAL_FLOATS.len())];
        }
    }
}

/// An operand like [`Harness::operand`] whose float values are NaN, +inf or −inf with
/// probability `1 / one_in` each (see [`sprinkle_specials`]).
#[track_caller]
pub fn operand_with_specials(
    h: &Harness,
    dtype: DType,
    kind: ViewKind,
    shape: &[usize],
    spec: Spec,
    one_in: usize,
) -> Operand {
    let v = view(kind, shape);
    let mut base = h.random_values(dtype, v.base_len, spec);
    sprinkle_specials(h, dtype, &mut base, one_in);
    h.operand_from(dtype, v, &base)
}

/// An allocation on the backend under test, freed when dropped: core's sound
/// [`crate::DeviceBuffer`] (shared, so the harness can borrow it for a launch) with the element
/// type and count the suite reads it as.
pub struct DeviceBuffer {
    inner: Arc<crate::DeviceBuffer>,
    /// The element type.
    pub dtype: DType,
    /// Elements in the buffer.
    pub len: usize,
}

impl DeviceBuffer {
    /// Wrap a device buffer holding `len` elements of `dtype`.
    pub fn new(inner: Arc<crate::DeviceBuffer>, dtype: DType, len: usize) -> Self {
        DeviceBuffer { inner, dtype, len }
    }

    /// The whole buffer.
    pub fn slice(&self) -> BufferSlice {
        self.inner.slice()
    }

    /// The owned device buffer (for the sound copy methods).
    pub fn raw(&self) -> &crate::DeviceBuffer {
        &self.inner
    }

    /// A weak reference the harness keeps to find the owner of a kernel's operands.
    pub(crate) fn weak(&self) -> Weak<crate::DeviceBuffer> {
        Arc::downgrade(&self.inner)
    }

    /// An operand viewing this buffer through `layout`.
    pub fn arg(&self, layout: &Layout) -> TensorArg {
        TensorArg {
            buffer: self.slice(),
            layout: layout.clone(),
            dtype: self.dtype,
        }
    }

    /// An operand viewing this buffer as a contiguous tensor of `shape`.
    pub fn contiguous(&self, shape: &[usize]) -> TensorArg {
        self.arg(&Layout::contiguous(shape).expect("suite shapes are small"))
    }
}

/// A device operand with its layout and its logical values (row-major through the layout).
pub struct Operand {
    /// The buffer.
    pub buf: DeviceBuffer,
    /// The view.
    pub layout: Layout,
    /// How the view was built (for messages).
    pub kind: ViewKind,
    /// The values seen through the view, row-major.
    pub values: Vec<f64>,
}

impl Operand {
    /// The kernel operand.
    pub fn arg(&self) -> TensorArg {
        self.buf.arg(&self.layout)
    }
}

/// Little-endian bytes of `values` stored as `dtype` (floats round to nearest, integers wrap,
/// bools are `!= 0`). Integer values are expected to be integral.
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    fn bytes<const N: usize>(values: &[f64], one: impl Fn(f64) -> [u8; N]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * N);
        for &v in values {
            out.extend_from_slice(&one(v));
        }
        out
    }
    match dtype {
        DType::F32 => bytes(values, |v| (v as f32).to_le_bytes()),
        DType::F64 => bytes(values, f64::to_le_bytes),
        DType::F16 => bytes(values, |v| half::f16::from_f64(v).to_le_bytes()),
        DType::BF16 => bytes(values, |v| half::bf16::from_f64(v).to_le_bytes()),
        DType::I32 => bytes(values, |v| (v as i64 as i32).to_le_bytes()),
        DType::I64 => bytes(values, |v| (v as i64).to_le_bytes()),
        DType::U8 => values.iter().map(|&v| v as i64 as u8).collect(),
        DType::Bool => values.iter().map(|&v| (v != 0.0) as u8).collect(),
    }
}

/// Decode little-endian `dtype` bytes to f64 (bool bytes keep their raw value, so a byte other
/// than 0 or 1 shows up).
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    fn values<const N: usize>(bytes: &[u8], one: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        bytes
            .chunks_exact(N)
            .map(|c| one(c.try_into().expect("chunks of N")))
            .collect()
    }
    match dtype {
        DType::F32 => values(bytes, |c| f32::from_le_bytes(c) as f64),
        DType::F64 => values(bytes, f64::from_le_bytes),
        DType::F16 => values(bytes, |c| half::f16::from_le_bytes(c).to_f64()),
        DType::BF16 => values(bytes, |c| half::bf16::from_le_bytes(c).to_f64()),
        DType::I32 => values(bytes, |c| i32::from_le_bytes(c) as f64),
        DType::I64 => values(bytes, |c| i64::from_le_bytes(c) as f64),
        DType::U8 | DType::Bool => bytes.iter().map(|&b| b as f64).collect(),
    }
}

/// Exact little-endian bytes of integers stored as `dtype` (wrapping, as `as` does).
pub fn encode_ints(dtype: DType, values: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        match dtype {
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::U8 => out.push(v as u8),
            other => panic!("suite bug: {other} is not an integer dtype"),
        }
    }
    out
}

/// Exact integers from little-endian `dtype` bytes.
pub fn decode_ints(dtype: DType, bytes: &[u8]) -> Vec<i64> {
    match dtype {
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        DType::U8 => bytes.iter().map(|&b| b as i64).collect(),
        other => panic!("suite bug: {other} is not an integer dtype"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_in_every_dtype() {
        let values = [0.0, 1.0, -2.5, 100.0];
        for dtype in DType::ALL {
            let stored: Vec<f64> = values.iter().map(|&v| dtype.round_trip(v)).collect();
            let wrapped: Vec<f64> = match dtype {
                DType::U8 => vec![0.0, 1.0, 254.0, 100.0],
                DType::I32 | DType::I64 => vec![0.0, 1.0, -2.0, 100.0],
                _ => stored.clone(),
            };
            let bytes = encode(dtype, &stored);
            assert_eq!(bytes.len(), values.len() * dtype.size_in_bytes());
            let back = decode(dtype, &bytes);
            if dtype != DType::U8 {
                assert_eq!(back, wrapped, "{dtype}");
            }
        }
        let edge = [i64::MIN, i64::MAX, -1];
        assert_eq!(decode_ints(DType::I64, &encode_ints(DType::I64, &edge)), edge);
        assert_eq!(decode_ints(DType::U8, &encode_ints(DType::U8, &[-1, 256])), [255, 0]);
    }
}
