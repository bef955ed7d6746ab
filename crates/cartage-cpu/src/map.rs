//! Element-wise engines: fill, generate, and maps of one, two and three operands.
//!
//! Each engine has a dense path (every operand contiguous: a tight loop over slices of raw
//! memory that the compiler vectorises) and a strided path ([`Walk`] runs with an inner loop of
//! fixed strides, specialised for the broadcast patterns `stride 0` and `stride 1`). Large work
//! goes to rayon through [`for_ranges`]; an output whose positions overlap in memory is written
//! on one thread.
//!
//! # Safety contract shared by every `unsafe fn` here
//! Every operand's layout fits inside its buffer (`Kernel::check_bounds` passed), the buffer is
//! live host memory of the cpu backend, aligned for its element type, which matches its dtype,
//! and every operand has the output's shape.

use cartage_core::TensorArg;

use crate::elem::{Float, Pod, Real};
use crate::strided::{PARALLEL_MIN_ELEMENTS, SyncPtr, Walk, for_ranges, is_non_overlapping};

/// The address of element 0 of `arg`'s view (its layout offset applied), typed as `T`.
#[inline(always)]
pub fn base<T>(arg: &TensorArg) -> SyncPtr<T> {
    let addr = arg.buffer.addr() as usize + arg.layout.offset() * std::mem::size_of::<T>();
    SyncPtr(std::ptr::with_exposed_provenance_mut(addr))
}

/// The bytes a view can touch: `[first, last)` addresses.
fn byte_span(arg: &TensorArg) -> (usize, usize) {
    let size = arg.dtype.size_in_bytes();
    let first = arg.buffer.addr() as usize + arg.layout.offset() * size;
    let extent = arg.layout.extent().saturating_sub(arg.layout.offset());
    (first, first + extent * size)
}

/// True when `numel` positions are worth rayon and safe to split: the output's positions are
/// distinct in memory and no input partly overlaps it (an input that *is* the output, position
/// for position, is fine: each position is read and written by the same task).
#[inline(always)]
fn use_threads(numel: usize, out: &TensorArg, inputs: &[&TensorArg]) -> bool {
    numel >= PARALLEL_MIN_ELEMENTS && safe_to_split(out, inputs)
}

/// The memory side of [`use_threads`], off the small-op path.
#[inline(never)]
fn safe_to_split(out: &TensorArg, inputs: &[&TensorArg]) -> bool {
    if !(out.layout.is_contiguous() || is_non_overlapping(out.layout.shape(), out.layout.strides())) {
        return false;
    }
    let (o0, o1) = byte_span(out);
    inputs.iter().all(|input| {
        let (i0, i1) = byte_span(input);
        let same = i0 == o0 && input.layout.strides() == out.layout.strides() && input.dtype == out.dtype;
        i1 <= o0 || o1 <= i0 || same
    })
}

/// Run `range(start, end)` over `0..numel`, on rayon when `threads`, else once here.
#[inline(always)]
fn ranges(numel: usize, threads: bool, range: impl Fn(usize, usize) + Sync) {
    if threads {
        for_ranges(numel, range);
    } else if numel > 0 {
        range(0, numel);
    }
}

/// Write `value` to every element of `out`.
///
/// # Safety
/// See the module docs.
pub unsafe fn fill<O: Pod>(out: &TensorArg, value: O) {
    let o = base::<O>(out);
    let numel = out.layout.numel();
    let threads = use_threads(numel, out, &[]);
    if out.layout.is_contiguous() {
        // SAFETY: positions `s..e` of a contiguous view lie inside its buffer.
        ranges(numel, threads, |s, e| unsafe {
            std::slice::from_raw_parts_mut(o.add(s), e - s).fill(value)
        });
        return;
    }
    let walk = Walk::new(out.layout.shape(), [out.layout.strides()]);
    let [so] = walk.inner_strides();
    ranges(numel, threads, |s, e| {
        walk.runs(s, e, |[oo], len| {
            for k in 0..len {
                // SAFETY: the walk stays inside the view.
                unsafe { *o.add(oo + k * so) = value };
            }
        })
    });
}

/// `out[i] = f(i)` for every row-major position `i` of `out`.
///
/// # Safety
/// See the module docs.
pub unsafe fn generate<O: Pod>(out: &TensorArg, f: impl Fn(usize) -> O + Sync) {
    let o = base::<O>(out);
    let numel = out.layout.numel();
    let threads = use_threads(numel, out, &[]);
    if out.layout.is_contiguous() {
        ranges(numel, threads, |s, e| {
            for i in s..e {
                // SAFETY: position `i` of a contiguous view lies inside its buffer.
                unsafe { *o.add(i) = f(i) };
            }
        });
        return;
    }
    let walk = Walk::new(out.layout.shape(), [out.layout.strides()]);
    let [so] = walk.inner_strides();
    ranges(numel, threads, |s, e| {
        let mut pos = s;
        walk.runs(s, e, |[oo], len| {
            for k in 0..len {
                // SAFETY: the walk stays inside the view.
                unsafe { *o.add(oo + k * so) = f(pos + k) };
            }
            pos += len;
        })
    });
}

/// `out[i] = f(input[i])`.
///
/// # Safety
/// See the module docs.
pub unsafe fn map1<I: Pod, O: Pod>(input: &TensorArg, out: &TensorArg, f: impl Fn(I) -> O + Sync) {
    let (i, o) = (base::<I>(input), base::<O>(out));
    let numel = out.layout.numel();
    let threads = use_threads(numel, out, &[input]);
    if input.layout.is_contiguous() && out.layout.is_contiguous() {
        // SAFETY: positions `s..e` of contiguous views lie inside their buffers.
        ranges(numel, threads, |s, e| unsafe { dense1(i.add(s), o.add(s), e - s, &f) });
        return;
    }
    let walk = Walk::new(out.layout.shape(), [input.layout.strides(), out.layout.strides()]);
    let [si, so] = walk.inner_strides();
    ranges(numel, threads, |s, e| {
        walk.runs(s, e, |[oi, oo], len| {
            // SAFETY: the walk stays inside both views.
            unsafe {
                let (ip, op) = (i.add(oi), o.add(oo));
                match (si, so) {
                    (1, 1) => dense1(ip, op, len, &f),
                    (0, _) => {
                        let v = f(*ip);
                        for k in 0..len {
                            *op.add(k * so) = v;
                        }
                    }
                    _ => {
                        for k in 0..len {
                            *op.add(k * so) = f(*ip.add(k * si));
                        }
                    }
                }
            }
        })
    });
}

#[inline(always)]
unsafe fn dense1<I: Pod, O: Pod>(i: *const I, o: *mut O, len: usize, f: &impl Fn(I) -> O) {
    for k in 0..len {
        // SAFETY: the caller passes `len` valid elements at `i` and `o`.
        unsafe { *o.add(k) = f(*i.add(k)) };
    }
}

/// `out[i] = f(lhs[i], rhs[i])`.
///
/// # Safety
/// See the module docs.
pub unsafe fn map2<A: Pod, B: Pod, O: Pod>(
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    f: impl Fn(A, B) -> O + Sync,
) {
    let (a, b, o) = (base::<A>(lhs), base::<B>(rhs), base::<O>(out));
    let numel = out.layout.numel();
    let threads = use_threads(numel, out, &[lhs, rhs]);
    if lhs.layout.is_contiguous() && rhs.layout.is_contiguous() && out.layout.is_contiguous() {
        // SAFETY: positions `s..e` of contiguous views lie inside their buffers.
        ranges(numel, threads, |s, e| unsafe {
            dense2(a.add(s), b.add(s), o.add(s), e - s, &f)
        });
        return;
    }
    let walk = Walk::new(
        out.layout.shape(),
        [lhs.layout.strides(), rhs.layout.strides(), out.layout.strides()],
    );
    let [sa, sb, so] = walk.inner_strides();
    ranges(numel, threads, |s, e| {
        walk.runs(s, e, |[oa, ob, oo], len| {
            // SAFETY: the walk stays inside every view.
            unsafe {
                let (ap, bp, op) = (a.add(oa), b.add(ob), o.add(oo));
                match (sa, sb, so) {
                    (1, 1, 1) => dense2(ap, bp, op, len, &f),
                    (0, 1, 1) => {
                        let x = *ap;
                        for k in 0..len {
                            *op.add(k) = f(x, *bp.add(k));
                        }
                    }
                    (1, 0, 1) => {
                        let y = *bp;
                        for k in 0..len {
                            *op.add(k) = f(*ap.add(k), y);
                        }
                    }
                    _ => {
                        for k in 0..len {
                            *op.add(k * so) = f(*ap.add(k * sa), *bp.add(k * sb));
                        }
                    }
                }
            }
        })
    });
}

#[inline(always)]
unsafe fn dense2<A: Pod, B: Pod, O: Pod>(a: *const A, b: *const B, o: *mut O, len: usize, f: &impl Fn(A, B) -> O) {
    for k in 0..len {
        // SAFETY: the caller passes `len` valid elements at each pointer.
        unsafe { *o.add(k) = f(*a.add(k), *b.add(k)) };
    }
}

/// `out[i] = f(c[i], a[i], b[i])`.
///
/// # Safety
/// See the module docs.
pub unsafe fn map3<C: Pod, A: Pod, B: Pod, O: Pod>(
    c: &TensorArg,
    a: &TensorArg,
    b: &TensorArg,
    out: &TensorArg,
    f: impl Fn(C, A, B) -> O + Sync,
) {
    let (cp, ap, bp, op) = (base::<C>(c), base::<A>(a), base::<B>(b), base::<O>(out));
    let numel = out.layout.numel();
    let threads = use_threads(numel, out, &[c, a, b]);
    let walk = Walk::new(
        out.layout.shape(),
        [
            c.layout.strides(),
            a.layout.strides(),
            b.layout.strides(),
            out.layout.strides(),
        ],
    );
    let [sc, sa, sb, so] = walk.inner_strides();
    ranges(numel, threads, |s, e| {
        walk.runs(s, e, |[oc, oa, ob, oo], len| {
            // SAFETY: the walk stays inside every view.
            unsafe {
                let (cq, aq, bq, oq) = (cp.add(oc), ap.add(oa), bp.add(ob), op.add(oo));
                if (sc, sa, sb, so) == (1, 1, 1, 1) {
                    for k in 0..len {
                        *oq.add(k) = f(*cq.add(k), *aq.add(k), *bq.add(k));
                    }
                } else {
                    for k in 0..len {
                        *oq.add(k * so) = f(*cq.add(k * sc), *aq.add(k * sa), *bq.add(k * sb));
                    }
                }
            }
        })
    });
}

/// Copy `input` into `out` (same dtype of `size_of::<T>()` bytes); dense views move as `memmove`.
///
/// # Safety
/// See the module docs.
pub unsafe fn copy<T: Pod>(input: &TensorArg, out: &TensorArg) {
    if input.layout.is_contiguous() && out.layout.is_contiguous() {
        let (i, o) = (base::<T>(input), base::<T>(out));
        let numel = out.layout.numel();
        let threads = use_threads(numel, out, &[input]);
        // SAFETY: both views are `numel` dense elements inside their buffers; `copy` allows overlap.
        ranges(numel, threads, |s, e| unsafe {
            std::ptr::copy(i.add(s), o.add(s), e - s)
        });
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { map1(input, out, |x: T| x) }
}

/// Elements converted per block on the blocked path of [`map1_real`] and [`map2_real`].
const REAL_BLOCK: usize = 256;

/// `out[i] = store(f(input[i].load()))` for a float dtype; f16/bf16 dense views convert in
/// blocks (see [`Real::BLOCKED`]).
///
/// # Safety
/// See the module docs.
pub unsafe fn map1_real<T: Real>(input: &TensorArg, out: &TensorArg, f: impl Fn(T::C) -> T::C + Sync) {
    if T::BLOCKED && input.layout.is_contiguous() && out.layout.is_contiguous() {
        let (i, o) = (base::<T>(input), base::<T>(out));
        let numel = out.layout.numel();
        ranges(numel, use_threads(numel, out, &[input]), |s, e| {
            let mut x = [T::C::ZERO; REAL_BLOCK];
            for start in (s..e).step_by(REAL_BLOCK) {
                let len = REAL_BLOCK.min(e - start);
                // SAFETY: positions `start..start + len` of dense views lie inside their buffers;
                // the input is read completely before the output (which may be the same memory)
                // is borrowed for writing.
                unsafe {
                    T::widen(std::slice::from_raw_parts(i.add(start), len), &mut x[..len]);
                    for v in &mut x[..len] {
                        *v = f(*v);
                    }
                    T::narrow(&x[..len], std::slice::from_raw_parts_mut(o.add(start), len));
                }
            }
        });
        return;
    }
    // SAFETY: forwarded.
    unsafe { map1(input, out, |x: T| T::store(f(x.load()))) }
}

/// `out[i] = store(f(lhs[i].load(), rhs[i].load()))` for a float dtype; f16/bf16 dense views
/// convert in blocks.
///
/// # Safety
/// See the module docs.
pub unsafe fn map2_real<T: Real>(
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    f: impl Fn(T::C, T::C) -> T::C + Sync,
) {
    if T::BLOCKED && lhs.layout.is_contiguous() && rhs.layout.is_contiguous() && out.layout.is_contiguous() {
        let (a, b, o) = (base::<T>(lhs), base::<T>(rhs), base::<T>(out));
        let numel = out.layout.numel();
        ranges(numel, use_threads(numel, out, &[lhs, rhs]), |s, e| {
            let (mut x, mut y) = ([T::C::ZERO; REAL_BLOCK], [T::C::ZERO; REAL_BLOCK]);
            for start in (s..e).step_by(REAL_BLOCK) {
                let len = REAL_BLOCK.min(e - start);
                // SAFETY: as in `map1_real`.
                unsafe {
                    T::widen(std::slice::from_raw_parts(a.add(start), len), &mut x[..len]);
                    T::widen(std::slice::from_raw_parts(b.add(start), len), &mut y[..len]);
                    for (v, &w) in x[..len].iter_mut().zip(&y[..len]) {
                        *v = f(*v, w);
                    }
                    T::narrow(&x[..len], std::slice::from_raw_parts_mut(o.add(start), len));
                }
            }
        });
        return;
    }
    // SAFETY: forwarded.
    unsafe { map2(lhs, rhs, out, |a: T, b: T| T::store(f(a.load(), b.load()))) }
}
