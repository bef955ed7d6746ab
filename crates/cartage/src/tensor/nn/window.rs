//! The sliding-window view shared by convolution and pooling.
//!
//! The input `[N, C, H, W]` is padded into a fresh tensor (filled with the padding value, the
//! input copied into its interior), then seen through one strided layout whose dimensions walk
//! the kernel taps and the output positions. That view reads overlapping elements (windows
//! share inputs), which is allowed for an operand that is only read; the ops then copy it
//! contiguous (im2col) or reduce over it in place.

use cartage_core::{Error, Layout, Result, Scalar, Site};

use crate::autograd::formulas;
use crate::autograd::graph::{self, keep, saving};
use crate::tensor::Tensor;

/// The geometry of a 2-D sliding window, one entry per spatial axis (height, width).
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    /// Kernel taps.
    pub kernel: [usize; 2],
    /// Step between output positions.
    pub stride: [usize; 2],
    /// Zeros (or the padding value) added on both sides.
    pub padding: [usize; 2],
    /// Step between kernel taps.
    pub dilation: [usize; 2],
}

const AXES: [&str; 2] = ["height", "width"];

impl Window {
    /// The output size along both axes for an input of `spatial` sizes, or a sentence saying
    /// why there is none (zero kernel, stride or dilation; a kernel wider than the padded
    /// input).
    pub fn output_size(&self, spatial: [usize; 2]) -> std::result::Result<[usize; 2], String> {
        let mut out = [0; 2];
        for axis in 0..2 {
            let (k, s, p, d, size) = (
                self.kernel[axis],
                self.stride[axis],
                self.padding[axis],
                self.dilation[axis],
                spatial[axis],
            );
            let name = AXES[axis];
            if k == 0 || s == 0 || d == 0 {
                return Err(format!(
                    "the kernel {name} ({k}), stride ({s}) and dilation ({d}) must all be at least 1"
                ));
            }
            if let Some(n) = cartage_core::conv_out_size(size, k, s, p, d) {
                out[axis] = n;
                continue;
            }
            let span = (k - 1).checked_mul(d).and_then(|x| x.checked_add(1));
            let padded = p.checked_mul(2).and_then(|x| x.checked_add(size));
            return Err(format!(
                "the kernel spans {} along the {name} (kernel {k}, dilation {d}) but the padded input \
                 {name} is only {} ({size} + 2 × padding {p})",
                span.map_or("more than usize::MAX".to_string(), |s| s.to_string()),
                padded.map_or("more than usize::MAX".to_string(), |s| s.to_string()),
            ));
        }
        Ok(out)
    }

    /// The strides (elements) of one step along each kernel axis and each output axis, for an
    /// input whose height and width strides are `row` and `col`: `[tap_h, tap_w, out_h, out_w]`.
    /// Saturating: a stride that overflows belongs to an axis of size 1, where it is never used
    /// (a larger axis is bounded by the input's extent).
    pub fn steps(&self, row: usize, col: usize) -> [usize; 4] {
        [
            self.dilation[0].saturating_mul(row),
            self.dilation[1].saturating_mul(col),
            self.stride[0].saturating_mul(row),
            self.stride[1].saturating_mul(col),
        ]
    }
}

impl Tensor {
    /// This `[N, C, H, W]` tensor with `padding` rows and columns of `value` on both sides: a
    /// fresh tensor with the input copied into its interior, or this tensor when there is no
    /// padding.
    pub(super) fn padded_2d(&self, padding: [usize; 2], value: Scalar, site: Site) -> Result<Tensor> {
        if padding == [0, 0] {
            return Ok(self.clone());
        }
        let s = self.shape();
        let grow = |size: usize, pad: usize| {
            pad.checked_mul(2)
                .and_then(|p| p.checked_add(size))
                .ok_or_else(|| Error::size_overflow(s, self.dtype))
        };
        let shape = [s[0], s[1], grow(s[2], padding[0])?, grow(s[3], padding[1])?];
        let out = {
            // The in-place copy into the interior is this op's own business: recorded below as
            // one `pad`, not refused as a write into a tracked tensor.
            let _plain = graph::tracking(&[self]).then(crate::autograd::no_grad);
            let out = self.fill_new_like(&shape, self.dtype, value, site)?;
            let interior = out.with_layout(out.layout.narrow(2, padding[0], s[2])?.narrow(3, padding[1], s[3])?);
            interior.copy_from(self)?;
            out
        };
        let pads = [padding[1], padding[1], padding[0], padding[0]];
        Ok(graph::record(out, "pad", &[self], |_| {
            formulas::shape::pad(self, &pads)
        }))
    }

    /// This `[N, C, H, W]` tensor (any strides) seen as `[N, C, kh, kw, OH, OW]`: element
    /// `[n, c, i, j, y, x]` is input `[n, c, y·stride + i·dilation, x·stride + j·dilation]`.
    /// Overlapping when windows share inputs; read it, never write it.
    pub(super) fn window_view(&self, window: &Window, out: [usize; 2]) -> Result<Tensor> {
        let (s, st) = (self.shape(), self.layout.strides());
        let [tap_h, tap_w, out_h, out_w] = window.steps(st[2], st[3]);
        let layout = Layout::from_parts(
            &[s[0], s[1], window.kernel[0], window.kernel[1], out[0], out[1]],
            &[st[0], st[1], tap_h, tap_w, out_h, out_w],
            self.layout.offset(),
        )?;
        let view = self.with_layout(layout);
        let plane: [usize; 4] = [s[0], s[1], s[2], s[3]];
        let window = *window;
        Ok(graph::record(view, "window_view", &[self], |_| {
            saving(keep(&[]), move |g, _| Ok(vec![Some(g.fold_windows(&window, plane)?)]))
        }))
    }
}
