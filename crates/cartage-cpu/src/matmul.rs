//! `Kernel::Matmul`: `[B, M, K] × [B, K, N] → [B, M, N]` through the `gemm` crate, which takes
//! any row and column strides, so transposed, sliced and batch-broadcast (batch stride 0)
//! operands are read in place, never copied. Tiny products use register tiles instead
//! (the `tiny_matmul` module).
//!
//! The crate was chosen by measurement on the development machine (2 cores, AVX-512;
//! `examples/matmul_crates.rs`): with its AVX-512 kernels (feature `x86-v4`) `gemm` was faster
//! than `matrixmultiply` 0.3 at every size — single-threaded 69–114 against 44–103 GFLOP/s
//! (f32, n = 32…512), on two threads 182–212 against 139–188 GFLOP/s (n = 256…2048), and
//! likewise for f64 (98–104 against 81–97 GFLOP/s). It also takes the parallelism per call,
//! where `matrixmultiply`'s thread count is a process-wide setting that would put 128×128
//! products on two threads.
//!
//! Threads: a product of at most [`SMALL_MATMUL`] multiply-adds (128³) never leaves the calling
//! thread (measured again on the shared 2-core machine: `gemm` on one thread took 26 µs at
//! n = 128 against 36 µs on two, and one thread stayed ahead up to n = 384 there); larger ones
//! let `gemm` use rayon. [`may_use_threads`] tells a backend which products may use threads. A batch of small products is spread over rayon
//! only from [`BATCH_PARALLEL_MIN`] multiply-adds on (a batch of 1000 8×8 products takes about
//! 40 µs on one thread, less than waking a second one costs on a shared machine). f16 and bf16
//! operands are widened to f32 one matrix at a time, multiplied in f32 and rounded once on store
//! (`gemm`'s native f16 path accumulates into the f16 output between depth blocks, which would
//! round more than once).

use cartage_core::{DType, Device, Error, Result, TensorArg};
use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;

use crate::elem::Real;
use crate::map::base;
use crate::strided::SyncPtr;
use crate::tiny_matmul::{self, TINY_MATMUL};

/// Products of at most this many multiply-adds (`M·N·K`, 128³) run on the calling thread.
pub const SMALL_MATMUL: usize = 128 * 128 * 128;

/// A batch of small products goes to rayon when it holds at least this many multiply-adds
/// (about 150 µs of work on one thread).
pub const BATCH_PARALLEL_MIN: usize = 1 << 21;

/// One matrix operand: element strides of its rows and columns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strides {
    pub(crate) batch: usize,
    pub(crate) row: isize,
    pub(crate) col: isize,
}

fn strides(arg: &TensorArg) -> Strides {
    let s = arg.layout.strides();
    // Strides are bounded by the buffer (check_bounds), itself at most isize::MAX bytes.
    Strides {
        batch: s[0],
        row: s[1] as isize,
        col: s[2] as isize,
    }
}

/// The dtypes `gemm` multiplies natively.
pub(crate) trait GemmScalar:
    Copy + Send + Sync + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + 'static
{
    const ONE: Self;
    const ZERO: Self;
    /// `a · b + c` rounded once (one instruction where FMA is enabled).
    fn fused(a: Self, b: Self, c: Self) -> Self;
}
impl GemmScalar for f32 {
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn fused(a: Self, b: Self, c: Self) -> Self {
        a.mul_add(b, c)
    }
}
impl GemmScalar for f64 {
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn fused(a: Self, b: Self, c: Self) -> Self {
        a.mul_add(b, c)
    }
}

/// `c = a · b` for one `m×k` by `k×n` product.
///
/// # Safety
/// The pointers and strides describe matrices inside live host buffers; `c`'s elements are
/// distinct and not read concurrently.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_one<T: GemmScalar>(
    (m, n, k): (usize, usize, usize),
    a: *const T,
    sa: Strides,
    b: *const T,
    sb: Strides,
    c: *mut T,
    sc: Strides,
    parallelism: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if m * n * k <= TINY_MATMUL {
        // SAFETY: forwarded.
        unsafe { tiny_matmul::tiny((m, n, k), a, sa, b, sb, c, sc) };
        return;
    }
    // SAFETY: forwarded; gemm reads `a`/`b` and writes `c` through the strides given
    // (`read_dst = false`: `c = 1 · a·b`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            sc.col,
            sc.row,
            false,
            a,
            sa.col,
            sa.row,
            b,
            sb.col,
            sb.row,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// `Kernel::Matmul`.
pub fn matmul(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    match lhs.dtype {
        DType::F32 => native::<f32>(lhs, rhs, out),
        DType::F64 => native::<f64>(lhs, rhs, out),
        DType::F16 => widened::<f16>(lhs, rhs, out),
        DType::BF16 => widened::<bf16>(lhs, rhs, out),
        dtype => {
            return Err(Error::unsupported(
                "matmul",
                dtype,
                Device::cpu(),
                "matmul is defined for floats",
            ));
        }
    }
    Ok(())
}

fn dims(lhs: &TensorArg, rhs: &TensorArg) -> (usize, usize, usize, usize) {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    (l[0], l[1], r[2], l[2])
}

/// How a batch runs: one product at a time with threads inside, one at a time on this thread,
/// or the batch spread over rayon with each product single-threaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    ThreadsInside,
    Serial,
    BatchOnRayon,
}

fn schedule(batch: usize, m: usize, n: usize, k: usize) -> Schedule {
    let each = m.saturating_mul(n).saturating_mul(k);
    let threads = rayon::current_num_threads();
    if threads <= 1 || !sizes_use_threads(batch, each) {
        Schedule::Serial
    } else if each > SMALL_MATMUL {
        Schedule::ThreadsInside
    } else {
        Schedule::BatchOnRayon
    }
}

/// The size rule of [`schedule`]: a product above [`SMALL_MATMUL`], or a batch of at least
/// [`BATCH_PARALLEL_MIN`] multiply-adds in all.
fn sizes_use_threads(batch: usize, each: usize) -> bool {
    each > SMALL_MATMUL || (batch > 1 && each.saturating_mul(batch) >= BATCH_PARALLEL_MIN)
}

/// True when `Kernel::Matmul` of these operands (`[B, M, K]` and `[B, K, N]`) may run on more
/// than one thread; every other product runs on the calling thread whatever the pool, so a
/// backend need not hand it to a thread pool (which costs microseconds on a busy machine: more
/// than a whole 64³ product takes).
///
/// ```
/// use cartage_core::{Backend, DType, Layout, TensorArg};
/// # let backend = cartage_cpu::open(0).unwrap();
/// let arg = |shape: &[usize]| {
///     let bytes = shape.iter().product::<usize>() * 4;
///     let buffer = backend.alloc(bytes, std::panic::Location::caller()).unwrap().slice();
///     TensorArg { buffer, layout: Layout::contiguous(shape).unwrap(), dtype: DType::F32 }
/// };
/// assert!(!cartage_cpu::matmul::may_use_threads(&arg(&[1, 128, 128]), &arg(&[1, 128, 128])));
/// assert!(cartage_cpu::matmul::may_use_threads(&arg(&[1, 256, 256]), &arg(&[1, 256, 256])));
/// ```
pub fn may_use_threads(lhs: &TensorArg, rhs: &TensorArg) -> bool {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    match (l, r) {
        ([batch, m, k], [_, _, n]) => sizes_use_threads(*batch, m.saturating_mul(*n).saturating_mul(*k)),
        _ => true,
    }
}

fn native<T: GemmScalar>(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) {
    let (batch, m, n, k) = dims(lhs, rhs);
    let (sa, sb, sc) = (strides(lhs), strides(rhs), strides(out));
    let (a, b, c): (SyncPtr<T>, SyncPtr<T>, SyncPtr<T>) = (base(lhs), base(rhs), base(out));
    let plan = schedule(batch, m, n, k);
    let one = |i: usize, parallelism: Parallelism| {
        // SAFETY: launch checked bounds and shapes; batch `i` of each operand lies inside its view
        // and output batches are disjoint (the output does not overlap itself).
        unsafe {
            gemm_one(
                (m, n, k),
                a.add(i * sa.batch),
                sa,
                b.add(i * sb.batch),
                sb,
                c.add(i * sc.batch),
                sc,
                parallelism,
            )
        }
    };
    match plan {
        Schedule::ThreadsInside => (0..batch).for_each(|i| one(i, Parallelism::Rayon(0))),
        Schedule::Serial => (0..batch).for_each(|i| one(i, Parallelism::None)),
        Schedule::BatchOnRayon => {
            let per_task = (BATCH_PARALLEL_MIN / 4 / (m * n * k).max(1)).max(1);
            (0..batch)
                .into_par_iter()
                .with_min_len(per_task)
                .for_each(|i| one(i, Parallelism::None))
        }
    }
}

/// f16/bf16: widen one batch entry at a time to f32, multiply, round once on store.
fn widened<T: Real<C = f32>>(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) {
    let (batch, m, n, k) = dims(lhs, rhs);
    let (sa, sb, sc) = (strides(lhs), strides(rhs), strides(out));
    let (a, b, c): (SyncPtr<T>, SyncPtr<T>, SyncPtr<T>) = (base(lhs), base(rhs), base(out));
    let plan = schedule(batch, m, n, k);
    let dense = |cols: usize| Strides {
        batch: 0,
        row: cols as isize,
        col: 1,
    };
    let one = |i: usize, scratch: &mut Scratch, parallelism: Parallelism| {
        scratch.resize(m * k, k * n, m * n);
        // SAFETY: launch checked bounds and shapes; batch `i` lies inside each view, and output
        // batches are disjoint.
        unsafe {
            widen(a.add(i * sa.batch), sa, m, k, &mut scratch.a);
            widen(b.add(i * sb.batch), sb, k, n, &mut scratch.b);
            gemm_one(
                (m, n, k),
                scratch.a.as_ptr(),
                dense(k),
                scratch.b.as_ptr(),
                dense(n),
                scratch.c.as_mut_ptr(),
                dense(n),
                parallelism,
            );
            let c = c.add(i * sc.batch);
            for r in 0..m {
                let row = &scratch.c[r * n..(r + 1) * n];
                let c_row = c.offset(r as isize * sc.row);
                if sc.col == 1 {
                    T::narrow(row, std::slice::from_raw_parts_mut(c_row, n));
                } else {
                    for (j, &v) in row.iter().enumerate() {
                        *c_row.offset(j as isize * sc.col) = T::store(v);
                    }
                }
            }
        }
    };
    match plan {
        Schedule::ThreadsInside => {
            let mut scratch = Scratch::default();
            (0..batch).for_each(|i| one(i, &mut scratch, Parallelism::Rayon(0)))
        }
        Schedule::Serial => {
            let mut scratch = Scratch::default();
            (0..batch).for_each(|i| one(i, &mut scratch, Parallelism::None))
        }
        Schedule::BatchOnRayon => (0..batch)
            .into_par_iter()
            .for_each_init(Scratch::default, |scratch, i| one(i, scratch, Parallelism::None)),
    }
}

/// Reused f32 buffers of the widened path.
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Scratch {
    fn resize(&mut self, a: usize, b: usize, c: usize) {
        self.a.resize(a, 0.0);
        self.b.resize(b, 0.0);
        self.c.resize(c, 0.0);
    }
}

/// Widen a strided `rows×cols` matrix into a dense row-major f32 buffer.
///
/// # Safety
/// `p` and `s` describe a matrix inside a live host buffer.
unsafe fn widen<T: Real<C = f32>>(p: *mut T, s: Strides, rows: usize, cols: usize, dst: &mut [f32]) {
    for r in 0..rows {
        let out = &mut dst[r * cols..(r + 1) * cols];
        // SAFETY: row `r` is inside the matrix; a dense row is `cols` initialised elements.
        unsafe {
            let row = p.offset(r as isize * s.row);
            if s.col == 1 {
                T::widen(std::slice::from_raw_parts(row, cols), out);
            } else {
                for (j, v) in out.iter_mut().enumerate() {
                    *v = (*row.offset(j as isize * s.col)).load();
                }
            }
        }
    }
}
