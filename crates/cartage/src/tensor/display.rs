//! `Display` of a tensor's values, PyTorch-style, with truncation; the values shown by `Debug`.
//!
//! `format!("{x}")` reads the values back to the host: a counted host sync, like `to_vec`
//! (`cartage::stats()` lists it with this module's call site). A tensor of more than
//! [`SUMMARY_THRESHOLD`] elements is summarised on the device first (the first and last
//! [`EDGE_ITEMS`] entries of every long dimension are gathered with `index_select`), so only
//! those few values travel. Floats print with 4 decimals, in scientific notation when the
//! magnitudes call for it; a failure to read prints as a message, never a panic.
//!
//! ```
//! use cartage::prelude::*;
//! # fn main() -> cartage::Result<()> {
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.5], &[2, 2], &Device::cpu())?;
//! assert_eq!(
//!     x.to_string(),
//!     "tensor([[1.0000, 2.0000],\n        [3.0000, 4.5000]], dtype=f32, device=cpu)"
//! );
//! # Ok(())
//! # }
//! ```

use std::fmt;

use cartage_core::{DType, Result};

use super::Tensor;

/// Tensors with more elements than this print summarised (PyTorch's default threshold).
const SUMMARY_THRESHOLD: usize = 1000;

/// Entries kept at each end of a summarised dimension.
const EDGE_ITEMS: usize = 3;

/// `Debug` shows the values of tensors with at most this many elements.
const DEBUG_VALUES_MAX: usize = 16;

/// What to print before the values; its width sets the indentation of continued rows.
const PREFIX: &str = "tensor(";

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = format!("dtype={}, device={})", self.dtype, self.device);
        if self.numel() == 0 {
            return write!(f, "{PREFIX}[], size={:?}, {suffix}", self.shape());
        }
        match self.render(Some(PREFIX.len())) {
            Ok(values) => write!(f, "{PREFIX}{values}, {suffix}"),
            Err(e) => write!(
                f,
                "{PREFIX}<values unavailable: {e}>, size={:?}, {suffix}",
                self.shape()
            ),
        }
    }
}

/// The `Debug` form: shape, dtype, device and origin, then the values of a small tensor
/// (at most [`DEBUG_VALUES_MAX`] elements; reading them is a counted host sync).
pub(super) fn debug(tensor: &Tensor, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "Tensor({:?}, {}, {}, from {}",
        tensor.shape(),
        tensor.dtype,
        tensor.device,
        tensor.origin
    )?;
    if tensor.numel() > 0 && tensor.numel() <= DEBUG_VALUES_MAX {
        match tensor.render(None) {
            Ok(values) => write!(f, ", values={values}")?,
            Err(e) => write!(f, ", values unavailable: {e}")?,
        }
    }
    f.write_str(")")
}

impl Tensor {
    /// The values as nested brackets. `indent` is the column of the outer bracket for
    /// multi-line output; `None` prints everything on one line.
    fn render(&self, indent: Option<usize>) -> Result<String> {
        let (shown, truncated) = self.summary()?;
        let cells = shown.cells()?;
        let width = cells.iter().map(String::len).max().unwrap_or(0);
        let mut out = String::new();
        let layout = Nesting {
            cells: &cells,
            width,
            truncated: &truncated,
            indent,
        };
        layout.write(&mut out, shown.shape(), 0, 0);
        Ok(out)
    }

    /// The tensor to print and, per dimension, whether it was cut to its first and last
    /// [`EDGE_ITEMS`] entries (only when the tensor is above [`SUMMARY_THRESHOLD`] elements).
    fn summary(&self) -> Result<(Tensor, Vec<bool>)> {
        let mut shown = self.clone();
        let mut truncated = vec![false; self.rank()];
        if self.numel() <= SUMMARY_THRESHOLD {
            return Ok((shown, truncated));
        }
        for (d, cut) in truncated.iter_mut().enumerate() {
            let n = self.shape()[d];
            if n <= 2 * EDGE_ITEMS {
                continue;
            }
            let keep: Vec<i64> = (0..EDGE_ITEMS).chain(n - EDGE_ITEMS..n).map(|i| i as i64).collect();
            let index = Tensor::from_slice(&keep, &[keep.len()], &self.device)?;
            shown = shown.index_select(d as isize, &index)?;
            *cut = true;
        }
        Ok((shown, truncated))
    }

    /// Every element formatted, row-major (one host read).
    fn cells(&self) -> Result<Vec<String>> {
        Ok(match self.dtype {
            DType::Bool => self.to_vec::<bool>()?.iter().map(bool::to_string).collect(),
            DType::I64 => self.to_vec::<i64>()?.iter().map(i64::to_string).collect(),
            DType::I32 | DType::U8 => self.to_vec_f64()?.iter().map(|&v| (v as i64).to_string()).collect(),
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => float_cells(&self.to_vec_f64()?),
        })
    }
}

/// Floats with 4 decimals, or in scientific notation when the largest finite magnitude is at
/// least 1e8 or the smallest non-zero one below 1e-4 (PyTorch's rule); `nan`, `inf`, `-inf`.
fn float_cells(values: &[f64]) -> Vec<String> {
    let magnitudes = values.iter().filter(|v| v.is_finite() && **v != 0.0).map(|v| v.abs());
    let (lo, hi) = magnitudes.fold((f64::INFINITY, 0.0f64), |(lo, hi), m| (lo.min(m), hi.max(m)));
    let scientific = hi >= 1e8 || lo < 1e-4;
    values
        .iter()
        .map(|&v| {
            if v.is_nan() {
                "nan".to_string()
            } else if v.is_infinite() {
                if v > 0.0 { "inf" } else { "-inf" }.to_string()
            } else if scientific {
                format!("{v:.4e}")
            } else {
                format!("{v:.4}")
            }
        })
        .collect()
}

/// Writes cells as nested brackets, right-aligned to one width, with `...` where a dimension
/// was summarised.
struct Nesting<'a> {
    cells: &'a [String],
    width: usize,
    truncated: &'a [bool],
    indent: Option<usize>,
}

impl Nesting<'_> {
    fn write(&self, out: &mut String, shape: &[usize], depth: usize, start: usize) {
        let Some((&n, inner)) = shape.split_first() else {
            out.push_str(&format!("{:>w$}", self.cells[start], w = self.width));
            return;
        };
        let stride: usize = inner.iter().product();
        out.push('[');
        for i in 0..n {
            if i > 0 {
                self.separator(out, inner.len(), depth);
            }
            if self.truncated[depth] && i == EDGE_ITEMS {
                // PyTorch's marks: ` ...` among numbers, `...` on a line of its own for rows.
                out.push_str(if inner.is_empty() { " ..." } else { "..." });
                self.separator(out, inner.len(), depth);
            }
            self.write(out, inner, depth + 1, start + i * stride);
        }
        out.push(']');
    }

    /// `, ` between scalars; between sub-arrays a comma, one newline per inner dimension and
    /// the indentation of the next bracket (or a space on one line).
    fn separator(&self, out: &mut String, inner_rank: usize, depth: usize) {
        out.push(',');
        match self.indent {
            Some(indent) if inner_rank > 0 => {
                out.push_str(&"\n".repeat(inner_rank));
                out.push_str(&" ".repeat(indent + depth + 1));
            }
            _ => out.push(' '),
        }
    }
}
