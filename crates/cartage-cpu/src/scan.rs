//! `Kernel::Scan`: inclusive cumsum and cumprod along one dimension, in order.
//!
//! Floats accumulate in their compute type (f32 for f16/bf16, f64 for f64) and round each
//! output once; integers wrap. Each row along `dim` is independent: rows are read and written
//! in place through their strides, and many rows spread over rayon. When neighbouring rows are
//! adjacent in memory (a scan over an outer dimension), a tile of them advances together, so
//! every step reads and writes a dense segment instead of one element per cache line.

use cartage_core::{DType, Device, Error, Result, ScanOp, TensorArg};

use crate::elem::{Arith, Float, Pod, Real};
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, Walk, for_ranges_with, is_non_overlapping};

/// Rows advanced together on the tiled path.
const TILE: usize = 64;

/// One scan: an accumulator, its start, one step, and the value stored.
trait Scanner: Sync {
    type T: Pod;
    type Acc: Copy;
    fn identity(&self) -> Self::Acc;
    fn step(&self, acc: Self::Acc, x: Self::T) -> Self::Acc;
    fn store(&self, acc: Self::Acc) -> Self::T;
}

/// Float scan in the compute type (`PROD`: cumprod).
struct FloatScan<T, const PROD: bool>(std::marker::PhantomData<T>);
impl<T: Real, const PROD: bool> Scanner for FloatScan<T, PROD> {
    type T = T;
    type Acc = T::C;
    #[inline(always)]
    fn identity(&self) -> T::C {
        if PROD { T::C::ONE } else { T::C::ZERO }
    }
    #[inline(always)]
    fn step(&self, acc: T::C, x: T) -> T::C {
        if PROD { acc * x.load() } else { acc + x.load() }
    }
    #[inline(always)]
    fn store(&self, acc: T::C) -> T {
        T::store(acc)
    }
}

/// Wrapping integer scan; `one` is the type's 1 (`PROD`: cumprod).
struct IntScan<T, const PROD: bool> {
    zero: T,
    one: T,
}
impl<T: Arith, const PROD: bool> Scanner for IntScan<T, PROD> {
    type T = T;
    type Acc = T;
    #[inline(always)]
    fn identity(&self) -> T {
        if PROD { self.one } else { self.zero }
    }
    #[inline(always)]
    fn step(&self, acc: T, x: T) -> T {
        if PROD { T::mul(acc, x) } else { T::add(acc, x) }
    }
    #[inline(always)]
    fn store(&self, acc: T) -> T {
        acc
    }
}

/// `Kernel::Scan`.
pub fn scan(op: ScanOp, input: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let prod = op == ScanOp::Prod;
    macro_rules! go {
        ($s_sum:expr, $s_prod:expr) => {
            // SAFETY: launch checked the kernel; the scanner's type is both operands' storage.
            unsafe {
                if prod {
                    run(&$s_prod, input, dim, out)
                } else {
                    run(&$s_sum, input, dim, out)
                }
            }
        };
    }
    macro_rules! float {
        ($t:ty) => {
            go!(
                FloatScan::<$t, false>(Default::default()),
                FloatScan::<$t, true>(Default::default())
            )
        };
    }
    macro_rules! int {
        ($t:ty) => {
            go!(
                IntScan::<$t, false> { zero: 0, one: 1 },
                IntScan::<$t, true> { zero: 0, one: 1 }
            )
        };
    }
    match input.dtype {
        DType::F32 => float!(f32),
        DType::F64 => float!(f64),
        DType::F16 => float!(half::f16),
        DType::BF16 => float!(half::bf16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::U8 => int!(u8),
        DType::Bool => {
            return Err(Error::unsupported(
                op.name(),
                DType::Bool,
                Device::cpu(),
                "scans are not defined for bool",
            ));
        }
    }
    Ok(())
}

/// # Safety
/// `launch` checked the kernel; `S::T` is the storage type of both operands.
unsafe fn run<S: Scanner>(s: &S, input: &TensorArg, dim: usize, out: &TensorArg) {
    let shape = input.layout.shape();
    let n = shape[dim];
    let (si, so) = (input.layout.strides()[dim], out.layout.strides()[dim]);
    let mut row_shape: cartage_core::Dims = shape.into();
    row_shape[dim] = 1;
    let rows = Walk::new(&row_shape, [input.layout.strides(), out.layout.strides()]);
    let [ri, ro] = rows.inner_strides();
    let row_count: usize = row_shape.iter().product();
    let tiled = ri == 1 && ro == 1 && rows.inner_len() >= 8 && n > 1;
    let (x, y) = (base::<S::T>(input), base::<S::T>(out));
    let body = |start: usize, end: usize| {
        rows.runs(start, end, |[oi, oo], len| {
            if tiled {
                for t0 in (0..len).step_by(TILE) {
                    let width = TILE.min(len - t0);
                    let mut acc = [s.identity(); TILE];
                    for k in 0..n {
                        for (j, a) in acc[..width].iter_mut().enumerate() {
                            // SAFETY: rows `t0 + j` of this run are adjacent (stride 1) and
                            // position `k < n` along `dim` is inside both views; each element is
                            // read before the same position of the output is written.
                            unsafe {
                                *a = s.step(*a, *x.add(oi + t0 + j + k * si));
                                *y.add(oo + t0 + j + k * so) = s.store(*a);
                            }
                        }
                    }
                }
            } else {
                for r in 0..len {
                    let (a, b) = (oi + r * ri, oo + r * ro);
                    let mut acc = s.identity();
                    for k in 0..n {
                        // SAFETY: as above, for one row.
                        unsafe {
                            acc = s.step(acc, *x.add(a + k * si));
                            *y.add(b + k * so) = s.store(acc);
                        }
                    }
                }
            }
        })
    };
    if n == 0 || row_count == 0 {
        return;
    }
    let work = row_count.saturating_mul(n);
    if work >= PARALLEL_MIN_ELEMENTS && row_count > 1 && is_non_overlapping(out.layout.shape(), out.layout.strides()) {
        for_ranges_with(row_count, 1, (CHUNK_MIN_ELEMENTS / n).max(1), body);
    } else {
        body(0, row_count);
    }
}
