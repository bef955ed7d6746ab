//! [`IndexRange`] and [`Kernel::run_with_index_range`]: index kernels whose indices are known to
//! be in range, so that an asynchronous device need not wait to report a bad one.
//!
//! An index kernel (`Gather`, `IndexSelect`, `Scatter`, `CrossEntropy`,
//! `CrossEntropyBackward`) checks every index on the device and turns an out-of-range one into
//! [`Error::IndexOutOfRange`]. On CUDA that means reading a fault record back after the launch:
//! a host synchronisation on every embedding lookup and every loss. Most index tensors, though,
//! were made on the host (a batch of token ids, class labels) or by `arange`, and the frontend
//! knows the smallest and largest of their values without reading the device. When those lie
//! inside the kernel's bound, no index can be out of range, and the backend may launch without
//! the read-back ([`Backend::launch_with_indices_in_range`]).
//!
//! The device still checks every index it reads and skips a bad one, so a wrong range can never
//! make a kernel touch memory outside its operands: the proof only decides whether the result
//! is waited for.

use std::sync::Arc;

use crate::backend::Backend;
use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::kernel::Kernel;

/// The smallest and largest value an integer tensor holds, known on the host (`min <= max`).
///
/// ```
/// use cartage_core::IndexRange;
/// let r = IndexRange::of([3i64, -1, 7]).unwrap();
/// assert_eq!((r.min, r.max), (-1, 7));
/// assert!(!r.within(8));
/// assert!(IndexRange::of([0i64, 7]).unwrap().within(8));
/// assert!(IndexRange::of(std::iter::empty::<i64>()).is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexRange {
    /// The smallest value.
    pub min: i64,
    /// The largest value.
    pub max: i64,
}

impl IndexRange {
    /// The range of `values`; `None` when there are none.
    pub fn of(values: impl IntoIterator<Item = i64>) -> Option<IndexRange> {
        values.into_iter().fold(None, |range, v| {
            Some(match range {
                None => IndexRange { min: v, max: v },
                Some(r) => IndexRange {
                    min: r.min.min(v),
                    max: r.max.max(v),
                },
            })
        })
    }

    /// True when every value lies in `[0, size)`.
    pub fn within(&self, size: usize) -> bool {
        self.min >= 0 && u64::try_from(self.max).is_ok_and(|max| max < size as u64)
    }
}

impl Kernel {
    /// The bound the kernel's indices must respect: the size of the indexed dimension (the
    /// class count for the cross-entropy kernels); `None` for kernels without indices.
    pub fn index_bound(&self) -> Option<usize> {
        let size = |arg: &crate::kernel::TensorArg, dim: usize| arg.layout.shape().get(dim).copied();
        match self {
            Kernel::Gather { input, dim, .. } | Kernel::IndexSelect { input, dim, .. } => size(input, *dim),
            Kernel::Scatter { out, dim, .. } => size(out, *dim),
            Kernel::CrossEntropy { logits, .. } | Kernel::CrossEntropyBackward { logits, .. } => size(logits, 1),
            _ => None,
        }
    }

    /// [`Kernel::run`] for a kernel whose index operand holds only values in `range` (as the
    /// caller knows from how it was made). When the range lies inside the kernel's
    /// [`Kernel::index_bound`], the backend launches it without waiting to report a bad index
    /// ([`Backend::launch_with_indices_in_range`]); otherwise this is exactly [`Kernel::run`],
    /// with the device's check and its error.
    ///
    /// A `range` that is wrong cannot corrupt memory (the device still skips any index out of
    /// range), but such an index would then go unreported: the caller must know the range, not
    /// guess it.
    #[inline]
    pub fn run_with_index_range(&self, buffers: &[&DeviceBuffer], range: IndexRange) -> Result<()> {
        if !self.index_bound().is_some_and(|size| range.within(size)) {
            return self.run(buffers);
        }
        let backend: &Arc<dyn Backend> = self.check_buffers(buffers)?;
        // SAFETY: `check_buffers` found every operand inside a block owned by one of `buffers`,
        // all of this backend and borrowed (so live) for the call; blocks are freed in stream
        // order after queued work.
        unsafe { backend.launch_with_indices_in_range(self) }
    }
}
