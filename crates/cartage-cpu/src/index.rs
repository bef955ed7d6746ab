//! `Kernel::Gather` and `Kernel::IndexSelect` with i32/i64 indices.
//!
//! Both kernels run one engine: a joint walk over the output, the index (for `IndexSelect` a 1-D
//! index laid along `dim` with stride 0 elsewhere) and the input with its `dim` stride zeroed;
//! the input element is that offset plus `index × stride[dim]`.
//!
//! Every index value is loaded exactly once per use, into a local (one atomic load: the
//! compiler may neither repeat nor split it), checked against the size of the indexed
//! dimension, and only that checked local addresses the input. There is no separate validation
//! pass whose values a second read could contradict, so another thread writing the index tensor
//! meanwhile can change which elements are selected, never make a read leave the input.
//!
//! A negative index or one ≥ the size is [`Error::IndexOutOfRange`] naming the first offender in
//! the output's row-major order (the same value on the serial and the parallel path: a worker
//! skips only work that starts after an offender already found). The output is then partly
//! written: every element before the first offender, and possibly some after it that parallel
//! workers had finished; the rest keeps its old contents. Callers treat it as unspecified (the
//! GPU backends write other elements, zeros included).

use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicUsize, Ordering};

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
    let first_bad = with_bits!(input.dtype.size_in_bytes(), T => {
        // SAFETY: launch ran `Kernel::validate` (shapes, bounds, alignment); `select` checks
        // every index value it loads before using it, so every input read lies inside the input.
        unsafe {
            match index.dtype {
                DType::I32 => select::<T, i32>(input, index, &index_strides, dim, out),
                DType::I64 => select::<T, i64>(input, index, &index_strides, dim, out),
                dtype => {
                    return Err(Error::invalid(
                        op,
                        format!("{dtype} indices reached the kernel; Kernel::validate admits only i32 and i64"),
                    ));
                }
            }
        }
    }, else return Err(Error::invalid(op, "elements of other than 1, 2, 4 or 8 bytes")));
    match first_bad {
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

/// An index element type.
pub(crate) trait IndexValue: Copy + Send + Sync {
    /// Load the element at `p` once, as i64.
    ///
    /// # Safety
    /// `p` points to a live, aligned element of host memory.
    unsafe fn load(p: *mut Self) -> i64;
}

impl IndexValue for i32 {
    #[inline(always)]
    unsafe fn load(p: *mut Self) -> i64 {
        // SAFETY: the caller guarantees a live, aligned i32; a relaxed atomic load is one plain
        // load that the compiler keeps as exactly one, even if another thread writes the index.
        unsafe { AtomicI32::from_ptr(p) }.load(Ordering::Relaxed) as i64
    }
}

impl IndexValue for i64 {
    #[inline(always)]
    unsafe fn load(p: *mut Self) -> i64 {
        // SAFETY: as for i32, with a live, aligned i64.
        unsafe { AtomicI64::from_ptr(p) }.load(Ordering::Relaxed)
    }
}

/// The first out-of-range index found, by row-major output position, shared by the workers.
pub(crate) struct FirstBad {
    /// The position of the earliest offender found so far (`usize::MAX`: none). Workers skip
    /// runs that start after it: they cannot hold an earlier offender.
    position: AtomicUsize,
    /// That position and the offending value.
    found: Mutex<Option<(usize, i64)>>,
}

impl FirstBad {
    pub(crate) fn new() -> Self {
        FirstBad {
            position: AtomicUsize::new(usize::MAX),
            found: Mutex::new(None),
        }
    }

    /// True when an offender before `position` is already known.
    #[inline(always)]
    pub(crate) fn before(&self, position: usize) -> bool {
        self.position.load(Ordering::Relaxed) < position
    }

    /// Record an offender (kept if it is the earliest so far).
    #[cold]
    pub(crate) fn record(&self, position: usize, value: i64) {
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        if found.is_none_or(|(at, _)| position < at) {
            *found = Some((position, value));
            self.position.fetch_min(position, Ordering::Relaxed);
        }
    }

    pub(crate) fn into_value(self) -> Option<i64> {
        self.found
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .map(|(_, v)| v)
    }
}

/// Copy the selected input elements into `out`, checking each index as it is loaded; returns
/// the first out-of-range index value (row-major output order), if any.
///
/// # Safety
/// `Kernel::validate` passed (bounds, shapes, alignment, no output overlapping an input):
/// the walk stays inside the output and index views, and the input view with the `dim`
/// coordinate set to any value in `0..size` is inside the input's buffer.
unsafe fn select<T: Copy + Send + Sync, I: IndexValue>(
    input: &TensorArg,
    index: &TensorArg,
    index_strides: &[usize],
    dim: usize,
    out: &TensorArg,
) -> Option<i64> {
    let size = input.layout.shape()[dim] as u64;
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
    let first_bad = FirstBad::new();
    let body = |s: usize, e: usize| {
        let mut position = s;
        let mut stopped = false;
        walk.runs(s, e, |[oo, oi, ox], len| {
            if stopped || first_bad.before(position) {
                stopped = true;
                return;
            }
            for k in 0..len {
                // SAFETY: the walk stays inside the index view, which is aligned.
                let v = unsafe { I::load(i.add(oi + k * si)) };
                if v < 0 || v as u64 >= size {
                    first_bad.record(position + k, v);
                    stopped = true;
                    return;
                }
                // SAFETY: the walk stays inside the output view; `v` (this very load) is in
                // `0..size`, so the input position is inside the input view.
                unsafe { *o.add(oo + k * so) = *x.add(ox + k * sx + v as usize * dim_stride) };
            }
            position += len;
        })
    };
    if numel >= PARALLEL_MIN_ELEMENTS && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges(numel, body);
    } else if numel > 0 {
        body(0, numel);
    }
    first_bad.into_value()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use cartage_core::{Backend, Layout};

    use super::*;
    use crate::CpuBackend;

    /// A contiguous operand of `shape` holding `data`, in memory of `backend` (never freed: the
    /// backend lives only as long as the test).
    fn host<T: Copy>(backend: &CpuBackend, dtype: DType, data: &[T], shape: &[usize]) -> TensorArg {
        let bytes = std::mem::size_of_val(data);
        let buffer = backend
            .alloc(bytes.max(1), std::panic::Location::caller())
            .expect("small allocation")
            .slice();
        // SAFETY: the cpu backend's address is a live host allocation of at least `bytes` bytes,
        // 64-byte aligned, that nothing else uses yet.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buffer.addr() as usize as *mut T, data.len()) };
        TensorArg {
            buffer,
            layout: Layout::contiguous(shape).expect("small"),
            dtype,
        }
    }

    /// The `n` elements of a contiguous operand.
    fn elements<T: Copy>(arg: &TensorArg, n: usize) -> Vec<T> {
        // SAFETY: `arg` was made by `host` with at least `n` elements of `T`.
        unsafe { std::slice::from_raw_parts(arg.buffer.addr() as usize as *const T, n) }.to_vec()
    }

    #[test]
    fn out_of_range_is_an_error_naming_the_first_offender() {
        let b = CpuBackend::new();
        let input = host(&b, DType::F32, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        for (values, first) in [([0i64, -1, 7, 2], -1i64), ([3, 0, 1, -5], 3), ([1, 2, 0, 9], 9)] {
            let index = host(&b, DType::I64, &values, &[4]);
            let out = host(&b, DType::F32, &[0.0f32; 8], &[2, 4]);
            let err = index_select(&input, &index, 1, &out).unwrap_err();
            assert!(
                matches!(err, Error::IndexOutOfRange { index, dim: 1, size: 3, .. } if index == first),
                "{values:?}: {err}"
            );
        }
        let index = host(&b, DType::I32, &[2i32, 0, 1, 1], &[2, 2]);
        let out = host(&b, DType::F32, &[0.0f32; 4], &[2, 2]);
        gather(&input, &index, 1, &out).unwrap();
        assert_eq!(elements::<f32>(&out, 4), vec![3.0, 1.0, 5.0, 5.0]);
    }

    /// Above the parallel threshold, offenders in several workers' ranges: the error still names
    /// the first in row-major order, and every element before it was written.
    #[test]
    fn the_parallel_path_names_the_first_offender() {
        let b = CpuBackend::new();
        let rows = 4usize;
        let input = host(&b, DType::F32, &[10.0f32, 11.0, 12.0, 13.0], &[rows, 1]);
        let n = 3 * PARALLEL_MIN_ELEMENTS;
        let mut values: Vec<i32> = (0..n).map(|k| (k % rows) as i32).collect();
        let first = n / 2 + 12_345;
        values[first] = -7;
        values[n - 3] = 99;
        values[first + PARALLEL_MIN_ELEMENTS / 2] = rows as i32;
        let index = host(&b, DType::I32, &values, &[n]);
        let out = host(&b, DType::F32, &vec![0.0f32; n], &[n, 1]);
        let err = index_select(&input, &index, 0, &out).unwrap_err();
        assert!(
            matches!(
                err,
                Error::IndexOutOfRange {
                    index: -7,
                    dim: 0,
                    size: 4,
                    ..
                }
            ),
            "{err}"
        );
        // With one offender at the very end, everything before it is selected.
        values[first] = 1;
        values[first + PARALLEL_MIN_ELEMENTS / 2] = 2;
        let index = host(&b, DType::I32, &values, &[n]);
        let err = index_select(&input, &index, 0, &out).unwrap_err();
        assert!(matches!(err, Error::IndexOutOfRange { index: 99, .. }), "{err}");
        let got = elements::<f32>(&out, n - 3);
        assert!(got.iter().zip(&values).all(|(&g, &v)| g == 10.0 + v as f32));
    }

    /// Another thread flips index values between valid and wildly out of range while the kernel
    /// runs: every launch either succeeds or reports the bad value, and no read leaves the input
    /// (with a check pass followed by a second read, this crashed).
    #[test]
    fn a_concurrently_written_index_never_reads_out_of_bounds() {
        let b = CpuBackend::new();
        let rows = 8usize;
        let data: Vec<f32> = (0..rows).map(|r| r as f32).collect();
        let input = host(&b, DType::F32, &data, &[rows, 1]);
        let n = PARALLEL_MIN_ELEMENTS + PARALLEL_MIN_ELEMENTS / 2;
        let values: Vec<i64> = (0..n).map(|k| (k % rows) as i64).collect();
        let index = host(&b, DType::I64, &values, &[n]);
        let out = host(&b, DType::F32, &vec![0.0f32; n], &[n, 1]);
        let addr = index.buffer.addr() as usize;
        let bad = 1i64 << 45;
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut round = 0usize;
                while !done.load(Ordering::Relaxed) {
                    let k = (round * 7919) % n;
                    // SAFETY: `k < n`: an aligned i64 of the live index allocation; the kernel
                    // reads it with atomic loads too.
                    let slot = unsafe { AtomicI64::from_ptr((addr as *mut i64).add(k)) };
                    slot.store(bad, Ordering::Relaxed);
                    std::hint::spin_loop();
                    slot.store((k % rows) as i64, Ordering::Relaxed);
                    round += 1;
                }
            });
            for _ in 0..20 {
                match index_select(&input, &index, 0, &out) {
                    Ok(()) => {}
                    Err(Error::IndexOutOfRange { index, .. }) => assert_eq!(index, bad),
                    Err(other) => panic!("{other}"),
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        // Whatever was selected came from inside the input.
        assert!(
            elements::<f32>(&out, n)
                .iter()
                .all(|&v| (0.0..rows as f32).contains(&v))
        );
    }
}
