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
    /// average that leaves the padding out).
    pub fn taps_inside(&self, plane: [usize; 2], out: [usize; 2]) -> usize {
        let axis = |a: usize| {
            (0..self.kernel[a])
                .filter(|&t| {
                    let pos = (out[a] * self.stride[a] + t * self.dilation[a]) as isize - self.padding[a] as isize;
                    pos >= 0 && (pos as usize) < plane[a]
                })
                .count()
        };
        axis(0) * axis(1)
    }
}
