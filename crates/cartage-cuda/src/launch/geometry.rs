//! Kernel geometry: the `Shape`/`Strides` parameter structs of `kernels/common.cuh`, joint
//! coalescing of several operands that share a shape, and grid sizes.
//!
//! Coalescing merges adjacent dimensions that are contiguous in *every* operand and drops size-1
//! dimensions, so dense data becomes rank 1 (offsets are a multiply, no division) and the rank
//! limit of 8 is rarely reached.

use cartage_core::layout::coalesce;
use cartage_core::{Error, Layout, Result};
use cudarc::driver::{DeviceRepr, LaunchConfig};

/// The most dimensions a kernel takes after coalescing (`MAX_RANK` in common.cuh).
pub const MAX_RANK: usize = 8;
/// Threads per block of every kernel (`THREADS` in common.cuh).
pub const THREADS: u32 = 256;

/// `struct Shape` of common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelShape {
    /// Number of elements.
    pub numel: u64,
    /// Number of dimensions used.
    pub rank: i32,
    pad: i32,
    /// Sizes, outermost first.
    pub dims: [u64; MAX_RANK],
}

/// `struct Strides` of common.cuh (elements).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStrides {
    /// Strides, outermost first.
    pub s: [i64; MAX_RANK],
}

// SAFETY: plain `repr(C)` data with the layout of the C structs the kernels declare.
unsafe impl DeviceRepr for KernelShape {}
// SAFETY: as above.
unsafe impl DeviceRepr for KernelStrides {}

impl KernelShape {
    /// A shape from sizes (at most [`MAX_RANK`]; checked by the caller).
    pub fn new(dims: &[usize]) -> Self {
        let mut shape = KernelShape {
            numel: dims.iter().map(|&d| d as u64).product(),
            rank: dims.len() as i32,
            ..Default::default()
        };
        for (slot, &d) in shape.dims.iter_mut().zip(dims) {
            *slot = d as u64;
        }
        shape
    }
}

impl KernelStrides {
    /// Strides from element strides.
    pub fn new(strides: &[usize]) -> Self {
        let mut out = KernelStrides::default();
        for (slot, &s) in out.s.iter_mut().zip(strides) {
            *slot = s as i64;
        }
        out
    }
}

/// Sizes shared by several operands and each operand's strides, coalesced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coalesced {
    /// The merged sizes (rank ≥ 1).
    pub dims: Vec<usize>,
    /// One stride list per operand, matching `dims`.
    pub strides: Vec<Vec<usize>>,
}

impl Coalesced {
    /// Merge the dimensions of `shape` that every operand (`strides[i]`) stores contiguously
    /// ([`cartage_core::layout::coalesce`]); one element becomes `[1]` with stride 0, so the
    /// kernels always see rank ≥ 1.
    pub fn new(shape: &[usize], strides: &[&[usize]]) -> Self {
        let c = coalesce(shape, strides);
        if c.shape.is_empty() {
            return Coalesced {
                dims: vec![1],
                strides: vec![vec![0]; strides.len()],
            };
        }
        Coalesced {
            dims: c.shape.to_vec(),
            strides: c.strides.iter().map(|s| s.to_vec()).collect(),
        }
    }

    /// The layouts' shared shape coalesced; fails when more than [`MAX_RANK`] dimensions remain.
    pub fn of(op: &'static str, layouts: &[&Layout]) -> Result<Self> {
        let strides: Vec<&[usize]> = layouts.iter().map(|l| l.strides()).collect();
        let c = Coalesced::new(layouts[0].shape(), &strides);
        c.check_rank(op)?;
        Ok(c)
    }

    /// Fail when the rank is above [`MAX_RANK`].
    pub fn check_rank(&self, op: &'static str) -> Result<()> {
        if self.dims.len() > MAX_RANK {
            return Err(Error::invalid(
                op,
                format!(
                    "the operands have {} dimensions that cannot be merged; CUDA kernels take at most {MAX_RANK} (make the tensor contiguous first)",
                    self.dims.len()
                ),
            ));
        }
        Ok(())
    }

    /// The kernel shape.
    pub fn shape(&self) -> KernelShape {
        KernelShape::new(&self.dims)
    }

    /// The kernel strides of operand `i`.
    pub fn strides(&self, i: usize) -> KernelStrides {
        KernelStrides::new(&self.strides[i])
    }
}

/// A 1-D grid of [`THREADS`]-thread blocks for `items` work items (grid-stride loops cover the
/// rest), at most `max_blocks`.
pub fn grid(items: u64, max_blocks: u32) -> LaunchConfig {
    let blocks = items.div_ceil(THREADS as u64).clamp(1, max_blocks as u64) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_operands_become_rank_one() {
        let c = Coalesced::new(&[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(c.dims, vec![24]);
        assert_eq!(c.strides, vec![vec![1], vec![1]]);
    }

    #[test]
    fn broadcast_and_transpose_keep_their_dimensions() {
        // out [2, 3] dense; rhs a row broadcast over dimension 0.
        let c = Coalesced::new(&[2, 3], &[&[3, 1], &[0, 1]]);
        assert_eq!(c.dims, vec![2, 3]);
        assert_eq!(c.strides, vec![vec![3, 1], vec![0, 1]]);
        // A transposed operand blocks the merge.
        let t = Coalesced::new(&[4, 5], &[&[5, 1], &[1, 4]]);
        assert_eq!(t.dims, vec![4, 5]);
        // Size-1 dimensions vanish; a scalar becomes one element.
        let s = Coalesced::new(&[1, 1], &[&[1, 1]]);
        assert_eq!((s.dims, s.strides), (vec![1], vec![vec![0]]));
        let e = Coalesced::new(&[3, 0], &[&[0, 1]]);
        assert_eq!(e.dims, vec![0]);
        assert_eq!(e.shape().numel, 0);
    }

    #[test]
    fn structs_match_the_c_layout() {
        assert_eq!(std::mem::size_of::<KernelShape>(), 80);
        assert_eq!(std::mem::size_of::<KernelStrides>(), 64);
        let shape = KernelShape::new(&[2, 3]);
        assert_eq!((shape.numel, shape.rank, shape.dims[1]), (6, 2, 3));
        assert!(grid(0, 10).grid_dim.0 == 1 && grid(1 << 30, 10).grid_dim.0 == 10);
    }
}
