//! `Kernel::Gather` and `Kernel::IndexSelect` with i32/i64 indices.
//!
//! Every index is checked before anything is written: a negative index or one ≥ the size of the
//! indexed dimension is [`Error::IndexOutOfRange`] naming the first offender (row-major order).
//! Both kernels then run one engine: a joint walk over the output, the index (for `IndexSelect`
//! a 1-D index laid along `dim` with stride 0 elsewhere) and the input with its `dim` stride
//! zeroed; the input element is that offset plus `index × stride[dim]`.

use cartage_core::{DType, Device, Dims, Error, Result, TensorArg};

use crate::dispatch::with_bits;
use crate::map::base;
use crate::strided::{PARALLEL_MIN_ELEMENTS, SyncPtr, Walk, for_ranges, is_non_overlapping};

/// `Kernel::Gather` (torch.gather): `out` is shaped like `index`.
pub fn gather(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    run("gather", input, index, index.layout.strides().into(), dim, out)
}

/// `Kernel::IndexSelect`: entries of `input` along `dim` chosen by a 1-D `index`.
pub fn index_select(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let mut strides: Dims = Dims::from_elem(0, out.layout.rank());
    strides[dim] = index.layout.strides()[0];
    run("index_select", input, index, strides, dim, out)
}

fn run(
    op: &'static str,
    input: &TensorArg,
    index: &TensorArg,
    index_strides: Dims,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let size = input.layout.shape()[dim];
    match index.dtype {
        DType::I32 => check_indices::<i32>(op, index, dim, size)?,
        DType::I64 => check_indices::<i64>(op, index, dim, size)?,
        dtype => {
            return Err(Error::WrongDType {
                op,
                dtype,
                expected: "indices must be i32 or i64",
            });
        }
    }
    with_bits!(input.dtype.size_in_bytes(), T => {
        // SAFETY: launch checked shapes and bounds; every index was just checked to be in
        // `0..size`, so every input position read lies inside the input view.
        unsafe {
            if index.dtype == DType::I32 {
                select::<T, i32>(input, index, &index_strides, dim, out)
            } else {
                select::<T, i64>(input, index, &index_strides, dim, out)
            }
        }
    }, else return Err(Error::invalid(op, "elements of other than 1, 2, 4 or 8 bytes")));
    Ok(())
}

/// An index element.
trait IndexValue: Copy + Send + Sync {
    fn value(self) -> i64;
}
impl IndexValue for i32 {
    #[inline(always)]
    fn value(self) -> i64 {
        self as i64
    }
}
impl IndexValue for i64 {
    #[inline(always)]
    fn value(self) -> i64 {
        self
    }
}

fn check_indices<I: IndexValue>(op: &'static str, index: &TensorArg, dim: usize, size: usize) -> Result<()> {
    let p = base::<I>(index);
    let walk = Walk::new(index.layout.shape(), [index.layout.strides()]);
    let [stride] = walk.inner_strides();
    let mut bad: Option<i64> = None;
    walk.runs(0, index.layout.numel(), |[o], len| {
        if bad.is_some() {
            return;
        }
        for k in 0..len {
            // SAFETY: the walk stays inside the index view (bounds checked by launch).
            let v = unsafe { *p.add(o + k * stride) }.value();
            if v < 0 || v as u64 >= size as u64 {
                bad = Some(v);
                return;
            }
        }
    });
    match bad {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op,
            index,
            dim,
            size,
            device: Device::cpu(),
        }),
    }
}

/// # Safety
/// See [`run`]: shapes, bounds and every index value were checked.
unsafe fn select<T: Copy + Send + Sync, I: IndexValue>(
    input: &TensorArg,
    index: &TensorArg,
    index_strides: &[usize],
    dim: usize,
    out: &TensorArg,
) {
    let mut input_strides: Dims = input.layout.strides().into();
    let dim_stride = input_strides[dim];
    input_strides[dim] = 0;
    let walk = Walk::new(
        out.layout.shape(),
        [out.layout.strides(), index_strides, &input_strides],
    );
    let [so, si, sx] = walk.inner_strides();
    let (o, i, x): (SyncPtr<T>, SyncPtr<I>, SyncPtr<T>) = (base(out), base(index), base(input));
    let numel = out.layout.numel();
    let body = |s: usize, e: usize| {
        walk.runs(s, e, |[oo, oi, ox], len| {
            for k in 0..len {
                // SAFETY: the walk stays inside the output and index views; the index value is
                // in `0..size` of `dim`, so the input position is inside the input view.
                unsafe {
                    let at = (*i.add(oi + k * si)).value() as usize;
                    *o.add(oo + k * so) = *x.add(ox + k * sx + at * dim_stride);
                }
            }
        })
    };
    if numel >= PARALLEL_MIN_ELEMENTS && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges(numel, body);
    } else if numel > 0 {
        body(0, numel);
    }
}
