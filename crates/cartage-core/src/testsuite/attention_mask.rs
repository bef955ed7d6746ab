//! The additive masks the attention conformance checks use (`Attention`, `AttentionBackward`):
//! key padding and a mask shared by every batch entry, both read with stride-0 dimensions, and
//! one float mask per entry read from an offset, with rows a mask removes entirely.

use crate::dtype::DType;
use crate::layout::Layout;

use super::harness::Harness;
use super::views::{View, ViewKind};
use super::{Operand, Spec};

/// An additive mask over the scores `[B, L, S]`, as the kernel's `[outer, inner, L, S]` view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mask {
    None,
    /// Key padding: `[B, S]` of 0 and −inf (entry b removes its last b keys), read as
    /// `[B, 1, L, S]` with strides `(S, 0, 0, 1)`.
    Padding,
    /// One `[L, S]` float mask for every batch entry, query row 1 removing every key, read as
    /// `[1, B, L, S]` with strides `(0, 0, S, 1)`.
    Shared,
    /// A float mask per batch entry, about a quarter −inf, three elements into its buffer.
    Full,
}

impl Mask {
    /// The view and its base values, or `None`.
    pub(super) fn operand(self, h: &Harness, dtype: DType, [b, l, s]: [usize; 3]) -> Option<Operand> {
        let spec = Spec::new((-1.0, 1.0), (-1, 1));
        let view = |kind, base_len, shape: [usize; 4], strides: [usize; 4], offset| View {
            kind,
            base_len,
            layout: Layout::from_parts(&shape, &strides, offset).expect("suite shapes are small"),
        };
        let (v, base) = match self {
            Mask::None => return None,
            Mask::Padding => {
                let base = (0..b * s)
                    .map(|x| if x % s + x / s < s { 0.0 } else { f64::NEG_INFINITY })
                    .collect();
                (view(ViewKind::Broadcast, b * s, [b, 1, l, s], [s, 0, 0, 1], 0), base)
            }
            Mask::Shared => {
                let mut base = h.random_values(dtype, l * s, spec);
                for x in base.iter_mut().skip(s).take(s) {
                    *x = f64::NEG_INFINITY;
                }
                (view(ViewKind::Broadcast, l * s, [1, b, l, s], [0, 0, s, 1], 0), base)
            }
            Mask::Full => {
                let mut base = h.random_values(dtype, b * l * s + 3, spec);
                for x in base.iter_mut().step_by(4) {
                    *x = f64::NEG_INFINITY;
                }
                let strides = [l * s, l * s, s, 1];
                (view(ViewKind::Offset, b * l * s + 3, [b, 1, l, s], strides, 3), base)
            }
        };
        Some(h.operand_from(dtype, v, &base))
    }
}
