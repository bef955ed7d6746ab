//! Strided views the suite feeds to kernels: contiguous, offset, transposed, narrowed, permuted,
//! broadcast (stride 0) and scalar-broadcast, each built over a contiguous base buffer with
//! [`Layout`]'s own view methods, the layouts of 1-D operands ([`Line`]: any kind, or stride 2),
//! plus the table of shapes every element-wise family runs.

use crate::layout::{Layout, contiguous_strides};

/// Elements of the "large" cases: one past 2^20, so that a backend's parallel or vector path and
/// its remainder handling both run.
pub const LARGE: usize = 1_048_577;

/// How a view is laid over its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViewKind {
    /// Row-major, dense, offset 0.
    Contiguous,
    /// Row-major and dense, but starting 3 elements into the buffer (with 2 spare at the end).
    Offset,
    /// The last two dimensions swapped.
    Transposed,
    /// The last dimension cut out of a wider one (row stride larger than the row).
    Narrowed,
    /// A rank-3 permutation `[2, 0, 1]` of a contiguous tensor.
    Permuted,
    /// Dimension 0 broadcast from size 1 (stride 0).
    Broadcast,
    /// One element broadcast to the whole shape (every stride 0).
    Scalar,
}

impl ViewKind {
    /// Lower-case name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            ViewKind::Contiguous => "contiguous",
            ViewKind::Offset => "offset",
            ViewKind::Transposed => "transposed",
            ViewKind::Narrowed => "narrowed",
            ViewKind::Permuted => "permuted",
            ViewKind::Broadcast => "broadcast",
            ViewKind::Scalar => "scalar-broadcast",
        }
    }
}

/// A view of `layout.shape()` over a buffer of `base_len` elements.
#[derive(Clone, Debug)]
pub struct View {
    /// What kind of view it turned out to be (kinds that do not apply to a shape fall back to
    /// contiguous).
    pub kind: ViewKind,
    /// Elements the buffer must hold.
    pub base_len: usize,
    /// The view.
    pub layout: Layout,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element offsets of `layout` in row-major order, with a fast path for dense views (the
/// suite runs unoptimised in debug builds, where the general strided iterator dominates).
pub fn offsets(layout: &Layout) -> Box<dyn Iterator<Item = usize> + '_> {
    match layout.contiguous_range() {
        Some((start, len)) => Box::new(start..start + len),
        None => Box::new(layout.offsets()),
    }
}

/// Build a view of kind `kind` with shape `shape`.
pub fn view(kind: ViewKind, shape: &[usize]) -> View {
    let rank = shape.len();
    let layout_of = |base: &[usize]| Layout::contiguous(base).expect("suite shapes are small");
    let made = |kind, base_len, layout: Layout| {
        debug_assert_eq!(layout.shape(), shape);
        View { kind, base_len, layout }
    };
    match kind {
        ViewKind::Offset => {
            let layout = Layout::from_parts(shape, &contiguous_strides(shape), 3).expect("small");
            made(kind, numel(shape) + 5, layout)
        }
        ViewKind::Transposed if rank >= 2 => {
            let mut base = shape.to_vec();
            base.swap(rank - 2, rank - 1);
            let layout = layout_of(&base).transpose(rank - 2, rank - 1).expect("rank ≥ 2");
            made(kind, numel(&base), layout)
        }
        ViewKind::Narrowed if rank >= 1 => {
            let mut base = shape.to_vec();
            base[rank - 1] += 3;
            let layout = layout_of(&base).narrow(rank - 1, 2, shape[rank - 1]).expect("fits");
            made(kind, numel(&base), layout)
        }
        ViewKind::Permuted if rank == 3 => {
            let base = [shape[1], shape[2], shape[0]];
            let layout = layout_of(&base).permute(&[2, 0, 1]).expect("a permutation");
            made(kind, numel(&base), layout)
        }
        ViewKind::Broadcast if rank >= 1 => {
            let mut base = shape.to_vec();
            base[0] = 1;
            let layout = layout_of(&base).broadcast_to(shape).expect("broadcastable");
            made(kind, numel(&base), layout)
        }
        ViewKind::Scalar => {
            let layout = layout_of(&[]).broadcast_to(shape).expect("broadcastable");
            made(kind, 1, layout)
        }
        _ => made(ViewKind::Contiguous, numel(shape), layout_of(shape)),
    }
}

/// A 1-D view of `n` elements with stride 2 from offset 1.
pub fn strided_1d(n: usize) -> View {
    View {
        kind: ViewKind::Narrowed,
        base_len: 2 * n + 1,
        layout: Layout::from_parts(&[n], &[2], 1).expect("small"),
    }
}

/// How a 1-D operand (a norm's weight or bias, cross-entropy targets and losses) is laid out.
#[derive(Clone, Copy, Debug)]
pub enum Line {
    /// A view kind from [`view`].
    Kind(ViewKind),
    /// Stride 2 from offset 1.
    Stride2,
}

impl Line {
    /// The view of `n` elements.
    pub fn view(self, n: usize) -> View {
        match self {
            Line::Kind(kind) => view(kind, &[n]),
            Line::Stride2 => strided_1d(n),
        }
    }

    /// Lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Line::Kind(kind) => kind.name(),
            Line::Stride2 => "stride 2",
        }
    }
}

/// One case of the element-wise table: a shape and the view kind of each operand (up to three).
#[derive(Clone, Debug)]
pub struct Case {
    /// Short name for messages.
    pub label: &'static str,
    /// The output shape (operands are viewed with it).
    pub shape: Vec<usize>,
    /// View kinds of operands 0, 1, 2.
    pub kinds: [ViewKind; 3],
}

impl Case {
    /// A case with one view kind per operand.
    pub fn new(label: &'static str, shape: &[usize], kinds: [ViewKind; 3]) -> Self {
        Case {
            label,
            shape: shape.to_vec(),
            kinds,
        }
    }

    /// A case whose first operand is viewed as `kind` and the others contiguous.
    pub fn one(label: &'static str, shape: &[usize], kind: ViewKind) -> Self {
        Case::new(label, shape, [kind, ViewKind::Contiguous, ViewKind::Contiguous])
    }

    /// A message prefix naming the case and the views of its first `operands` operands.
    pub fn describe(&self, operands: usize) -> String {
        let kinds: Vec<&str> = self.kinds[..operands].iter().map(|k| k.name()).collect();
        format!("{} {:?} ({})", self.label, self.shape, kinds.join(", "))
    }
}

/// The shapes that matter for element-wise kernels: empty, scalar, one element, odd sizes, and
/// non-contiguous, broadcast and offset operands. The large case is separate ([`large_cases`]).
pub fn elementwise_cases() -> Vec<Case> {
    use ViewKind::*;
    vec![
        Case::new("empty", &[0], [Contiguous, Contiguous, Contiguous]),
        Case::new("empty-2d", &[3, 0], [Contiguous, Broadcast, Transposed]),
        Case::new("scalar", &[], [Contiguous, Contiguous, Contiguous]),
        Case::new("one", &[1], [Contiguous, Contiguous, Contiguous]),
        Case::new("odd-7", &[7], [Contiguous, Contiguous, Contiguous]),
        Case::new("odd-33", &[33], [Contiguous, Offset, Contiguous]),
        Case::new("odd-1023", &[1023], [Contiguous, Contiguous, Contiguous]),
        Case::new("transposed", &[9, 5], [Transposed, Transposed, Broadcast]),
        Case::new("narrowed", &[6, 7], [Narrowed, Transposed, Contiguous]),
        Case::new("permuted", &[5, 3, 4], [Permuted, Broadcast, Narrowed]),
        Case::new("broadcast", &[5, 7], [Broadcast, Contiguous, Scalar]),
        Case::new("scalar-broadcast", &[4, 3], [Scalar, Narrowed, Broadcast]),
        Case::new("offset", &[2, 33], [Offset, Scalar, Transposed]),
    ]
}

/// The large cases (only cheap ops run them): one contiguous vector of [`LARGE`] elements, and
/// a 1025 × 1024 matrix read transposed and with a broadcast row.
pub fn large_cases() -> Vec<Case> {
    use ViewKind::*;
    vec![
        Case::new("large", &[LARGE], [Contiguous, Contiguous, Contiguous]),
        Case::new("large-strided", &[1025, 1024], [Transposed, Broadcast, Contiguous]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_has_the_asked_shape_and_fits_its_buffer() {
        let kinds = [
            ViewKind::Contiguous,
            ViewKind::Offset,
            ViewKind::Transposed,
            ViewKind::Narrowed,
            ViewKind::Permuted,
            ViewKind::Broadcast,
            ViewKind::Scalar,
        ];
        for case in elementwise_cases() {
            for kind in kinds {
                let v = view(kind, &case.shape);
                assert_eq!(v.layout.shape(), case.shape.as_slice());
                assert!(v.layout.extent() <= v.base_len, "{kind:?} {:?}", case.shape);
            }
        }
        assert!(!view(ViewKind::Transposed, &[9, 5]).layout.is_contiguous());
        assert!(view(ViewKind::Broadcast, &[5, 7]).layout.is_broadcast());
        assert_eq!(view(ViewKind::Permuted, &[7]).kind, ViewKind::Contiguous);
    }
}
