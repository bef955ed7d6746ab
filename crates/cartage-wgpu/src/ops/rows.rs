//! Row geometry shared by the row kernels (scan, sort, norm, cross-entropy): the elements
//! sharing every coordinate but one dimension form a row; the other ("kept") dimensions are
//! merged jointly for up to four operands and walked by `row_bases` in `shaders/rows.wgsl`.
//!
//! Parameter words: 0 rows, 1 row length, 2 kept rank, 3 free; 4..8 the element offsets of the
//! four slots; 8..16 the kept sizes; 16..48 the kept strides, 8 per slot; 48..64 op-specific
//! (`P.x[0]` holds the four slots' strides along the row by convention).

use cartage_core::{Error, Result};

use crate::encoder::ParamBlock;
use crate::ops::geometry::{MAX_RANK, coalesce};

/// The row walker and parameter layout, prepended to every row kernel.
pub(crate) const ROWS: &str = include_str!("../../shaders/rows.wgsl");

/// First op-specific parameter word.
pub(crate) const EXTRA: usize = 48;

/// Rows of a set of operands over `shape` with one row dimension.
pub(crate) struct Rows {
    /// Number of rows.
    pub rows: usize,
    /// Elements per row.
    pub len: usize,
    shape: Vec<usize>,
    strides: Vec<Vec<usize>>,
}

impl Rows {
    /// The rows along `dim` of `shape` for operands with `strides` (at most four).
    pub fn new(op: &'static str, shape: &[usize], dim: usize, strides: &[&[usize]]) -> Result<Self> {
        let kept: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
        let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
        let kept_strides: Vec<Vec<usize>> = strides.iter().map(|s| kept.iter().map(|&d| s[d]).collect()).collect();
        let refs: Vec<&[usize]> = kept_strides.iter().map(Vec::as_slice).collect();
        let g = coalesce(&kept_shape, &refs);
        if g.shape.len() > MAX_RANK {
            return Err(Error::invalid(
                op,
                format!(
                    "the dimensions other than the row dimension still have rank {} after merging; \
                     the wgpu row kernels index at most rank {MAX_RANK}: make the operand contiguous first",
                    g.shape.len()
                ),
            ));
        }
        Ok(Rows {
            rows: kept_shape.iter().product(),
            len: shape.get(dim).copied().unwrap_or(1),
            shape: g.shape,
            strides: g.strides,
        })
    }

    /// The parameter block with the row geometry and the slots' element `offsets`.
    pub fn params(&self, offsets: &[u64]) -> Result<ParamBlock> {
        let mut p = ParamBlock::default();
        p.put_sizes(0, &[self.rows, self.len, self.shape.len()], "row count")?;
        for (k, &o) in offsets.iter().enumerate() {
            p.put_sizes(4 + k, &[o as usize], "element offset")?;
        }
        p.put_sizes(8, &self.shape, "dimension size")?;
        for (k, s) in self.strides.iter().enumerate() {
            p.put_sizes(16 + 8 * k, s, "stride")?;
        }
        Ok(p)
    }
}
