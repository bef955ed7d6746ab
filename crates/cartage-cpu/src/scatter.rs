//! `Kernel::Scatter` (scatter, scatter_add, index_add) with i32/i64 indices, in place on `out`.
//!
//! One joint walk over the index's shape reads the index, `src` and `out` with its `dim`
//! stride zeroed; the destination is that offset plus `index × stride[dim]`. The kernel runs on
//! the calling thread: duplicate indices make different positions write one destination, so a
//! serial walk is the race-free choice (and `Add` then sums duplicates in row-major order).
//!
//! As in [`crate::index`], every index value is loaded once (an atomic load), checked against
//! `out.shape[dim]`, and only that checked value addresses `out`. The first negative or too
//! large index stops the kernel with [`Error::IndexOutOfRange`]; the positions before it were
//! written.

use cartage_core::{DType, Device, Dims, Error, Result, ScatterMode, TensorArg};

use crate::dispatch::with_bits;
use crate::elem::Arith;
use crate::index::IndexValue;
use crate::map::base;
use crate::strided::{SyncPtr, Walk};

/// `Kernel::Scatter`.
pub fn scatter(mode: ScatterMode, src: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let size = out.layout.shape()[dim];
    let first_bad = match mode {
        ScatterMode::Assign => with_bits!(src.dtype.size_in_bytes(), T => {
            // SAFETY: launch ran `Kernel::validate`; `T` has the elements' size; `walk` checks
            // every index value before using it.
            unsafe { by_index(src, index, dim, out, |d: &mut T, s: T| *d = s) }
        }, else return Err(Error::invalid(mode.name(), "elements of other than 1, 2, 4 or 8 bytes"))),
        ScatterMode::Add => match src.dtype {
            DType::F32 => add::<f32>(src, index, dim, out),
            DType::F64 => add::<f64>(src, index, dim, out),
            DType::F16 => add::<half::f16>(src, index, dim, out),
            DType::BF16 => add::<half::bf16>(src, index, dim, out),
            DType::I32 => add::<i32>(src, index, dim, out),
            DType::I64 => add::<i64>(src, index, dim, out),
            DType::U8 => add::<u8>(src, index, dim, out),
            DType::Bool => Err(Error::unsupported(
                mode.name(),
                DType::Bool,
                Device::cpu(),
                "scatter_add is not defined for bool",
            )),
        },
    }?;
    match first_bad {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op: mode.name(),
            index,
            dim,
            size,
            device: Device::cpu(),
        }),
    }
}

fn add<T: Arith>(src: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<Option<i64>> {
    // SAFETY: launch ran `Kernel::validate`; `T` is the storage type of `src` and `out`.
    unsafe { by_index(src, index, dim, out, |d: &mut T, s: T| *d = T::add(*d, s)) }
}

/// Apply `write(destination, src value)` at every index position; returns the first
/// out-of-range index value (row-major order of the index), if any.
///
/// # Safety
/// `Kernel::validate` passed: the index's shape fits inside `src`'s and (but `dim`) `out`'s, the
/// layouts fit their buffers, and `T` has the element size of `src` and `out`.
unsafe fn by_index<T: Copy>(
    src: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
    write: impl Fn(&mut T, T),
) -> Result<Option<i64>> {
    match index.dtype {
        // SAFETY: forwarded.
        DType::I32 => Ok(unsafe { walk::<T, i32>(src, index, dim, out, write) }),
        // SAFETY: forwarded.
        DType::I64 => Ok(unsafe { walk::<T, i64>(src, index, dim, out, write) }),
        dtype => Err(Error::invalid(
            "scatter",
            format!("{dtype} indices reached the kernel; Kernel::validate admits only i32 and i64"),
        )),
    }
}

/// # Safety
/// See [`by_index`].
unsafe fn walk<T: Copy, I: IndexValue>(
    src: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
    write: impl Fn(&mut T, T),
) -> Option<i64> {
    let size = out.layout.shape()[dim] as u64;
    let mut out_strides: Dims = out.layout.strides().into();
    let dim_stride = out_strides[dim];
    out_strides[dim] = 0;
    let walk = Walk::new(
        index.layout.shape(),
        [index.layout.strides(), src.layout.strides(), &out_strides],
    );
    let [si, ss, so] = walk.inner_strides();
    let (i, s, o): (SyncPtr<I>, SyncPtr<T>, SyncPtr<T>) = (base(index), base(src), base(out));
    let mut bad = None;
    walk.runs(0, index.layout.numel(), |[oi, os, oo], len| {
        if bad.is_some() {
            return;
        }
        for k in 0..len {
            // SAFETY: the walk stays inside the index view, which is aligned.
            let v = unsafe { I::load(i.add(oi + k * si)) };
            if v < 0 || v as u64 >= size {
                bad = Some(v);
                return;
            }
            // SAFETY: the walk stays inside the src view (the index box is a prefix of src's
            // shape); `v` (this very load) is in `0..size`, so the destination is inside `out`.
            unsafe { write(&mut *o.add(oo + k * so + v as usize * dim_stride), *s.add(os + k * ss)) };
        }
    });
    bad
}
