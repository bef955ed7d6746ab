//! [`CoopTiling`]: the shape of a cooperative-matrix f16 matmul kernel, chosen when its pipeline
//! is made. `direct` (and `direct-prefetch`) is the one-subgroup kernel that loads fragments
//! straight from storage (`shaders/matmul_coop.wgsl`); `BMxBNxBK/WMxWN:S` is the staged kernel
//! (`shaders/matmul_coop_staged.wgsl`): a BM × BN block of C per workgroup, one WM × WN block
//! per subgroup, K advancing BK at a time through S (1 or 2) workgroup-memory buffers.

use std::fmt;

use cartage_core::{Error, Result};

/// Which cooperative-matrix kernel, and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopTiling {
    /// One subgroup per 64 × 64 block, fragments loaded straight from storage (`prefetch`: the
    /// next K step's fragments load while this one multiplies).
    Direct {
        /// Load the next step's fragments early.
        prefetch: bool,
    },
    /// Several subgroups per workgroup, A and B tiles staged through workgroup memory.
    Staged(StagedTiling),
}

/// The shape of the staged kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StagedTiling {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// K per workgroup-memory step (a multiple of 16).
    pub bk: u32,
    /// Rows of C per subgroup (a multiple of 16).
    pub wm: u32,
    /// Columns of C per subgroup (a multiple of 16).
    pub wn: u32,
    /// Workgroup-memory buffers: 1 (two barriers per step) or 2 (one).
    pub stages: u32,
}

/// Extra f16 elements at the end of every staged row, so that the 16 rows of a fragment fall
/// on different memory banks.
pub(crate) const PAD: u32 = 8;

impl StagedTiling {
    const fn new(bm: u32, bn: u32, bk: u32, wm: u32, wn: u32, stages: u32) -> Self {
        StagedTiling {
            bm,
            bn,
            bk,
            wm,
            wn,
            stages,
        }
    }

    /// Subgroups per workgroup.
    pub fn subgroups(&self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn)
    }

    /// Bytes of workgroup memory (f16 A and B tiles with padded rows, times the stages).
    pub fn workgroup_bytes(&self) -> u32 {
        self.stages * (self.bm * (self.bk + PAD) + self.bk * (self.bn + PAD)) * 2
    }

    /// True when the shape is well formed and fits `limits` with subgroups of `subgroup`.
    pub fn fits(&self, limits: &wgpu::Limits, subgroup: u32) -> bool {
        let threads = self.subgroups() * subgroup;
        // Chunks of eight f16 values each invocation copies per step, for A and for B.
        let chunks_even = |rows: u32, cols: u32| (rows * cols / 8).is_multiple_of(threads);
        [self.bm, self.bn, self.bk, self.wm, self.wn]
            .iter()
            .all(|v| *v > 0 && v.is_multiple_of(16))
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && matches!(self.stages, 1 | 2)
            && subgroup > 0
            && threads <= limits.max_compute_invocations_per_workgroup
            && threads <= limits.max_compute_workgroup_size_x
            && chunks_even(self.bm, self.bk)
            && chunks_even(self.bk, self.bn)
            && self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
    }
}

impl CoopTiling {
    /// One subgroup per 64 × 64 block, fragments straight from storage.
    pub const DIRECT: CoopTiling = CoopTiling::Direct { prefetch: false };

    /// The default where `CARTAGE_WGPU_MATMUL_VARIANT` names none: 128 × 256 blocks of four
    /// 64 × 64 subgroup tiles, K steps of 16, double-buffered in workgroup memory. Timed through
    /// `cargo xtask bench --sections sweep` with the override on an H200's Vulkan adapter, it was
    /// the fastest f16 shape at every size from 32 to 4096 (169 TFLOP/s at 4096³, where `direct`
    /// gave 73.7). Problems too small to fill the device with its blocks take
    /// [`CoopTiling::MEDIUM`], and adapters whose limits it does not fit take `direct`.
    pub const DEFAULT: CoopTiling = CoopTiling::Staged(StagedTiling::new(128, 256, 16, 64, 64, 2));

    /// Every shape the sweep tries (the direct kernels first).
    pub const CANDIDATES: [CoopTiling; 11] = [
        CoopTiling::DIRECT,
        CoopTiling::Direct { prefetch: true },
        CoopTiling::Staged(StagedTiling::new(128, 128, 32, 64, 32, 2)),
        CoopTiling::Staged(StagedTiling::new(128, 128, 32, 32, 64, 2)),
        CoopTiling::Staged(StagedTiling::new(128, 128, 32, 64, 64, 2)),
        CoopTiling::Staged(StagedTiling::new(128, 128, 16, 64, 32, 2)),
        CoopTiling::Staged(StagedTiling::new(128, 128, 32, 64, 32, 1)),
        CoopTiling::Staged(StagedTiling::new(128, 64, 32, 64, 32, 2)),
        CoopTiling::Staged(StagedTiling::new(64, 64, 32, 32, 32, 2)),
        CoopTiling::Staged(StagedTiling::new(128, 256, 16, 64, 64, 2)),
        CoopTiling::Staged(StagedTiling::new(256, 128, 16, 64, 64, 2)),
    ];

    /// The staged shape for problems too small to fill the device with large blocks.
    pub const MEDIUM: CoopTiling = CoopTiling::Staged(StagedTiling::new(64, 64, 32, 32, 32, 2));

    /// Rows and columns of C per workgroup.
    pub fn block(&self) -> (u32, u32) {
        match self {
            CoopTiling::Direct { .. } => (64, 64),
            CoopTiling::Staged(s) => (s.bm, s.bn),
        }
    }

    /// K per step (the problem's K must be a multiple of it).
    pub fn k_step(&self) -> u32 {
        match self {
            CoopTiling::Direct { .. } => 16,
            CoopTiling::Staged(s) => s.bk,
        }
    }

    /// True when the kernel can be built for `limits` with subgroups of `subgroup` (the staged
    /// kernel also needs the adapter's SUBGROUP feature for its `subgroup_id`).
    pub fn fits(&self, limits: &wgpu::Limits, subgroup: u32, has_subgroups: bool) -> bool {
        match self {
            CoopTiling::Direct { .. } => subgroup > 0,
            CoopTiling::Staged(s) => has_subgroups && s.fits(limits, subgroup),
        }
    }
}

impl fmt::Display for CoopTiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoopTiling::Direct { prefetch: false } => write!(f, "direct"),
            CoopTiling::Direct { prefetch: true } => write!(f, "direct-prefetch"),
            CoopTiling::Staged(s) => write!(f, "{}x{}x{}/{}x{}:{}", s.bm, s.bn, s.bk, s.wm, s.wn, s.stages),
        }
    }
}

impl std::str::FromStr for CoopTiling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                "cooperative matmul tiling",
                format!("`{s}` is not `direct`, `direct-prefetch` or BMxBNxBK/WMxWN:STAGES, e.g. 128x128x32/64x32:2"),
            )
        };
        match s.trim() {
            "direct" => return Ok(CoopTiling::DIRECT),
            "direct-prefetch" => return Ok(CoopTiling::Direct { prefetch: true }),
            _ => {}
        }
        let numbers = |text: &str| -> Option<Vec<u32>> { text.split('x').map(|v| v.parse().ok()).collect() };
        let (shape, stages) = s.trim().split_once(':').ok_or_else(bad)?;
        let (block, warp) = shape.split_once('/').ok_or_else(bad)?;
        let stages: u32 = stages.parse().map_err(|_| bad())?;
        match (numbers(block).as_deref(), numbers(warp).as_deref()) {
            (Some(&[bm, bn, bk]), Some(&[wm, wn])) => {
                Ok(CoopTiling::Staged(StagedTiling::new(bm, bn, bk, wm, wn, stages)))
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for t in CoopTiling::CANDIDATES {
            assert_eq!(t.to_string().parse::<CoopTiling>().unwrap(), t);
        }
        for bad in ["", "direct2", "128x128x32/64x32", "128x128/64x32:2", "axbxc/dxe:1"] {
            assert!(bad.parse::<CoopTiling>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_candidate_fits_an_h200_like_adapter() {
        // The limits the H200's Vulkan adapter reports where they matter here.
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 49152,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            ..wgpu::Limits::default()
        };
        for t in CoopTiling::CANDIDATES {
            assert!(t.fits(&limits, 32, true), "{t}");
            assert_eq!(
                t.fits(&limits, 32, false),
                matches!(t, CoopTiling::Direct { .. }),
                "{t}"
            );
        }
        let too_big = StagedTiling::new(256, 256, 64, 64, 64, 2);
        assert!(!too_big.fits(&limits, 32));
        let ragged = StagedTiling::new(128, 128, 32, 48, 32, 2);
        assert!(!ragged.fits(&limits, 32));
    }
}
