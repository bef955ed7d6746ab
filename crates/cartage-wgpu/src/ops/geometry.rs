//! Index geometry shared by the kernels: joint coalescing of operand layouts, parameter-block
//! field positions, and dispatch grids.

use cartage_core::{Error, Result};

use crate::encoder::ParamBlock;

/// The highest rank a kernel indexes after coalescing.
pub(crate) const MAX_RANK: usize = 8;

/// Threads per workgroup of the one-dimensional kernels.
pub(crate) const WORKGROUP: u64 = 256;

/// A shape with one stride vector per operand, after coalescing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Sizes (no size-1 dimensions; empty for one element).
    pub shape: Vec<usize>,
    /// Per operand, its strides over `shape`.
    pub strides: Vec<Vec<usize>>,
}

/// How a kernel reads one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    /// Dense, in logical order: offset + i.
    Contiguous,
    /// One element for all (every stride 0).
    Broadcast,
    /// Any strides.
    Strided,
}

impl Access {
    /// A one-letter tag for pipeline keys.
    pub fn tag(self) -> char {
        match self {
            Access::Contiguous => 'c',
            Access::Broadcast => 'b',
            Access::Strided => 's',
        }
    }
}

/// Merge the dimensions of `shape` that are adjacent in memory for every operand at once, and
/// drop size-1 dimensions, keeping row-major element order ([`cartage_core::layout::coalesce`]:
/// one element gives an empty shape, no element the shape `[0]`).
pub(crate) fn coalesce(shape: &[usize], strides: &[&[usize]]) -> Geometry {
    let c = cartage_core::layout::coalesce(shape, strides);
    Geometry {
        shape: c.shape.to_vec(),
        strides: c.strides.iter().map(|s| s.to_vec()).collect(),
    }
}

impl Geometry {
    /// How operand `k` is read.
    pub fn access(&self, k: usize) -> Access {
        let strides = &self.strides[k];
        if strides.iter().all(|&s| s == 0) && !self.shape.is_empty() {
            Access::Broadcast
        } else if self.shape.is_empty() || (self.shape.len() == 1 && strides[0] == 1) {
            Access::Contiguous
        } else {
            Access::Strided
        }
    }

    /// Fail when the rank exceeds what kernels index.
    pub fn check_rank(&self, op: &'static str) -> Result<()> {
        if self.shape.len() > MAX_RANK {
            return Err(Error::invalid(
                op,
                format!(
                    "after merging contiguous dimensions the operands still have rank {} (shape {:?}); the wgpu backend indexes at most rank {MAX_RANK}: make an operand contiguous first",
                    self.shape.len(),
                    self.shape
                ),
            ));
        }
        Ok(())
    }
}

/// Parameter-block word positions of the map-family kernels (see `shaders/map.wgsl`).
pub(crate) mod map_fields {
    /// Threads to run.
    pub const COUNT: usize = 0;
    // Words 1, 2, 3: logical elements of this chunk, rank, index of the chunk's first element.
    /// Sizes (8 words).
    pub const SHAPE: usize = 4;
    /// Element offsets of the four slots.
    pub const OFFS: usize = 12;
    /// Strides, 8 words per slot.
    pub const STRIDES: usize = 16;
    /// Op-specific words (8).
    pub const EXTRA: usize = 48;
    /// Two f64 values (words 56..60), in f64 kernels only.
    pub const F64: usize = 56;
}

/// Convert a size for a 32-bit kernel field, failing clearly when it does not fit.
pub(crate) fn word(value: usize, what: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        Error::invalid(
            "launch",
            format!("{what} {value} does not fit the 32-bit indices of the wgpu kernels; split the tensor"),
        )
    })
}

impl ParamBlock {
    /// Write `values` starting at word `at`.
    pub fn put(&mut self, at: usize, values: &[u32]) {
        self.0[at..at + values.len()].copy_from_slice(values);
    }

    /// Write `values` (sizes, strides) checked into 32 bits, starting at word `at`.
    pub fn put_sizes(&mut self, at: usize, values: &[usize], what: &str) -> Result<()> {
        for (i, &v) in values.iter().enumerate() {
            self.0[at + i] = word(v, what)?;
        }
        Ok(())
    }

    /// Write an f64 at words `at`, `at + 1` (little-endian halves).
    pub fn put_f64(&mut self, at: usize, value: f64) {
        let bits = value.to_bits();
        self.0[at] = bits as u32;
        self.0[at + 1] = (bits >> 32) as u32;
    }
}

/// A grid of `threads / per_group` workgroups folded into x and y (each at most `max_dim`).
pub(crate) fn grid(threads: u64, per_group: u64, max_dim: u32) -> [u32; 3] {
    let groups = threads.div_ceil(per_group).max(1);
    let x = groups.min(u64::from(max_dim));
    let y = groups.div_ceil(x);
    [x as u32, y.min(u64::from(max_dim)) as u32, 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_merges_only_what_every_operand_allows() {
        let g = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(g.shape, vec![24]);
        assert_eq!(g.access(0), Access::Contiguous);
        let g = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[0, 0, 1]]);
        assert_eq!(g.shape, vec![6, 4]);
        assert_eq!(g.strides[1], vec![0, 1]);
        assert_eq!(g.access(1), Access::Strided);
        let g = coalesce(&[2, 1, 3], &[&[3, 3, 1], &[0, 0, 0]]);
        assert_eq!(g.shape, vec![6]);
        assert_eq!(g.access(1), Access::Broadcast);
        let g = coalesce(&[1, 1], &[&[1, 1]]);
        assert!(g.shape.is_empty());
        assert_eq!(g.access(0), Access::Contiguous);
        let g = coalesce(&[2, 0, 3], &[&[0, 3, 1], &[3, 3, 1]]);
        assert_eq!(g.shape, vec![0]);
        assert_eq!(g.access(0), Access::Contiguous);
    }

    #[test]
    fn grids_fold_into_two_dimensions() {
        assert_eq!(grid(1, 256, 65535), [1, 1, 1]);
        assert_eq!(grid(256 * 70000, 256, 65535), [65535, 2, 1]);
    }
}
