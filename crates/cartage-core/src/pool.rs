//! The window and mode of 2-D pooling ([`crate::Kernel::Pool2d`] and
//! [`crate::Kernel::Pool2dBackward`]): which taps a window reads, how many windows fit, and
//! what each window computes.

/// Which pooling, as an op family ([`crate::Op::Pool2d`], [`crate::Op::Pool2dBackward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// The largest tap.
    Max,
    /// The mean of the taps.
    Avg,
}

impl PoolKind {
    /// Both kinds.
    pub const ALL: [PoolKind; 2] = [PoolKind::Max, PoolKind::Avg];

    /// The forward op's name (`max_pool2d`, `avg_pool2d`).
    pub const fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max_pool2d",
            PoolKind::Avg => "avg_pool2d",
        }
    }

    /// The backward op's name (`max_pool2d_backward`, `avg_pool2d_backward`).
    pub const fn backward_name(self) -> &'static str {
        match self {
            PoolKind::Max => "max_pool2d_backward",
            PoolKind::Avg => "avg_pool2d_backward",
        }
    }
}

/// What one pooling window computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolMode {
    /// The largest tap inside the input (padding never wins); NaN when any tap is NaN.
    Max,
    /// The sum of the taps inside the input, divided by the whole window's `kh·kw` taps when
    /// `count_include_pad` (PyTorch's default), else by the number of taps inside the input.
    Avg {
        /// Divide by the whole window rather than by the taps inside the input.
        count_include_pad: bool,
    },
}

impl PoolMode {
    /// The op family.
    pub const fn kind(self) -> PoolKind {
        match self {
            PoolMode::Max => PoolKind::Max,
            PoolMode::Avg { .. } => PoolKind::Avg,
        }
    }
}

/// A 2-D pooling window, each field `[height, width]`: `kernel` taps spaced by `dilation`,
/// moved by `stride`, over the input with `padding` rows and columns added on both sides.
///
/// Window `(i, j)` reads the taps `(i·stride − padding + a·dilation, j·stride − padding +
/// b·dilation)` for `a < kernel[0]`, `b < kernel[1]`; those outside the input are padding.
///
/// ```
/// use cartage_core::PoolWindow;
/// let w = PoolWindow::new([3, 3], [2, 2], [1, 1]);
/// assert_eq!(w.output_size([56, 56]), Some([28, 28]));
/// assert_eq!(w.output_size([0, 56]), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolWindow {
    /// Taps per window.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Rows and columns added on each side.
    pub padding: [usize; 2],
    /// Spacing of a window's taps (1: adjacent).
    pub dilation: [usize; 2],
}

impl PoolWindow {
    /// A window with adjacent taps (dilation 1).
    pub const fn new(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Self {
        PoolWindow {
            kernel,
            stride,
            padding,
            dilation: [1, 1],
        }
    }

    /// `[OH, OW]` for an input plane `[H, W]`: `(H + 2·padding − dilation·(kernel − 1) − 1) /
    /// stride + 1` per axis, or `None` when no window fits (or a field is 0, or a size
    /// overflows).
    pub fn output_size(&self, plane: [usize; 2]) -> Option<[usize; 2]> {
        let axis = |a: usize| {
            if self.kernel[a] == 0 || self.stride[a] == 0 || self.dilation[a] == 0 || plane[a] == 0 {
                return None;
            }
            crate::conv_out_size(
                plane[a],
                self.kernel[a],
                self.stride[a],
                self.padding[a],
                self.dilation[a],
            )
        };
        Some([axis(0)?, axis(1)?])
    }

    /// The number of taps of window `(i, j)` inside a plane `[H, W]` (the divisor of an
    /// average that leaves the padding out). Any fields give an answer (saturating at
    /// `usize::MAX`), never an overflow, in constant time.
    pub fn taps_inside(&self, plane: [usize; 2], out: [usize; 2]) -> usize {
        // Per axis, in padded coordinates (u128: products and sums of usizes cannot overflow):
        // tap `t` sits at `base + t·dilation` and lies inside when that is in
        // `padding..padding + plane`.
        let axis = |a: usize| -> u128 {
            let (kernel, dilation) = (self.kernel[a] as u128, self.dilation[a] as u128);
            let base = out[a] as u128 * self.stride[a] as u128;
            let (lo, hi) = (self.padding[a] as u128, self.padding[a] as u128 + plane[a] as u128);
            if dilation == 0 {
                // Every tap at `base`.
                return if (lo..hi).contains(&base) { kernel } else { 0 };
            }
            // The first tap at or past `lo`, and the first at or past `hi`.
            let first = lo.saturating_sub(base).div_ceil(dilation);
            let end = hi.saturating_sub(base).div_ceil(dilation).min(kernel);
            end.saturating_sub(first)
        };
        usize::try_from(axis(0).saturating_mul(axis(1))).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::PoolWindow;

    /// The taps counted one by one (small fields only).
    fn counted(w: &PoolWindow, plane: [usize; 2], out: [usize; 2]) -> usize {
        let axis = |a: usize| {
            (0..w.kernel[a])
                .filter(|&t| {
                    let pos = (out[a] * w.stride[a] + t * w.dilation[a]) as isize - w.padding[a] as isize;
                    pos >= 0 && (pos as usize) < plane[a]
                })
                .count()
        };
        axis(0) * axis(1)
    }

    #[test]
    fn taps_inside_matches_counting() {
        for k in 1..5 {
            for s in 1..4 {
                for p in 0..4 {
                    for d in 1..4 {
                        let w = PoolWindow {
                            kernel: [k, k + 1],
                            stride: [s, s],
                            padding: [p, p],
                            dilation: [d, 1],
                        };
                        for plane in [[1, 1], [3, 5], [7, 2]] {
                            for out in [[0, 0], [1, 2], [3, 1], [6, 6]] {
                                assert_eq!(
                                    w.taps_inside(plane, out),
                                    counted(&w, plane, out),
                                    "{w:?} {plane:?} {out:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn taps_inside_never_overflows() {
        let huge = usize::MAX;
        let w = PoolWindow {
            kernel: [3, 3],
            stride: [huge, huge],
            padding: [huge, huge],
            dilation: [huge, huge],
        };
        assert_eq!(w.taps_inside([huge, huge], [huge, huge]), 0);
        assert_eq!(w.taps_inside([huge, 4], [0, 0]), 1);
        let w = PoolWindow {
            kernel: [huge, huge],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        assert_eq!(w.taps_inside([huge, huge], [0, 0]), huge);
        assert_eq!(w.taps_inside([2, 3], [0, 0]), 6);
    }
}
