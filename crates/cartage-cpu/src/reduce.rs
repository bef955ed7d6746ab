//! `Kernel::Reduce`: sum, mean, max, min, argmax, argmin, logsumexp and prod over any set of
//! dims.
//!
//! Each output element folds the reduced positions of the input (a [`Walk`] over the reduced
//! dims, read in place whatever the strides) with one fixed tree: positions are cut into blocks
//! of [`BLOCK`], a block folds into [`LANES`] independent accumulators (the compiler vectorises
//! them) combined pairwise, and blocks combine pairwise by halving the block range. The tree
//! depends only on the number of reduced positions, never on the thread count, so results are
//! bit-identical run to run and with any number of threads. Large reductions split the same
//! tree across rayon (`rayon::join` on its halves) or spread output elements over rayon.

use cartage_core::{DType, Device, Error, ReduceOp, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Arith, Bool8, Float, Pod, Real, fmax, fmin};
use crate::map::base;
use crate::reduce_outer as outer;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, SyncPtr, Walk, for_ranges_with, is_non_overlapping};

/// Independent accumulators per block.
pub const LANES: usize = 32;

/// Positions per leaf of the reduction tree.
pub const BLOCK: usize = 2048;

/// A fold: an accumulator type, its identity, one step per element and an associative merge.
pub trait Fold: Sync {
    /// The element read.
    type In: Pod;
    /// The accumulator.
    type Acc: Copy + Send + Sync;
    /// The identity of `merge`.
    fn identity(&self) -> Self::Acc;
    /// Accumulate one element.
    fn step(&self, acc: Self::Acc, x: Self::In) -> Self::Acc;
    /// Combine two accumulators.
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Fold a dense run into the lanes: element `k` goes to lane `k % LANES`.
    #[inline(always)]
    fn fold_run(&self, lanes: &mut [Self::Acc; LANES], xs: &[Self::In])
    where
        Self: Sized,
    {
        fold_dense(self, lanes, xs)
    }
}

/// The reduced positions of one reduction, read from the input in place.
pub struct Reduction<T> {
    input: SyncPtr<T>,
    walk: Walk<1>,
    count: usize,
}

impl<T: Pod> Reduction<T> {
    /// Call `f` on each reduced element at element offset `offset`, in row-major order.
    pub fn for_each(&self, offset: usize, mut f: impl FnMut(T)) {
        let [stride] = self.walk.inner_strides();
        self.walk.runs(0, self.count, |[o], len| {
            for k in 0..len {
                // SAFETY: the walk stays inside the input view; `offset` is an output's base.
                f(unsafe { *self.input.add(offset + o + k * stride) });
            }
        });
    }

    /// Fold the reduced positions starting at element offset `offset` of the input.
    pub fn fold<F: Fold<In = T>>(&self, fold: &F, offset: usize, parallel: bool) -> F::Acc {
        self.tree(fold, offset, 0, self.count, parallel)
    }

    fn tree<F: Fold<In = T>>(&self, fold: &F, offset: usize, start: usize, end: usize, parallel: bool) -> F::Acc {
        let len = end - start;
        if len <= BLOCK {
            return self.block(fold, offset, start, end);
        }
        let mid = start + len.div_ceil(BLOCK) / 2 * BLOCK;
        let (a, b) = if parallel && len >= 2 * CHUNK_MIN_ELEMENTS {
            rayon::join(
                || self.tree(fold, offset, start, mid, true),
                || self.tree(fold, offset, mid, end, true),
            )
        } else {
            (
                self.tree(fold, offset, start, mid, false),
                self.tree(fold, offset, mid, end, false),
            )
        };
        fold.merge(a, b)
    }

    fn block<F: Fold<In = T>>(&self, fold: &F, offset: usize, start: usize, end: usize) -> F::Acc {
        let mut lanes = [fold.identity(); LANES];
        let [stride] = self.walk.inner_strides();
        self.walk.runs(start, end, |[o], len| {
            // SAFETY: the walk stays inside the input view; `offset` is an output's base.
            let p = unsafe { self.input.add(offset + o) } as *const T;
            if stride == 1 {
                // SAFETY: the run's `len` elements are dense and initialised host memory.
                fold.fold_run(&mut lanes, unsafe { std::slice::from_raw_parts(p, len) });
            } else {
                for k in 0..len {
                    let lane = &mut lanes[k % LANES];
                    // SAFETY: `k < len`, `k * stride` is inside the run.
                    *lane = fold.step(*lane, unsafe { *p.add(k * stride) });
                }
            }
        });
        let mut width = LANES;
        while width > 1 {
            width /= 2;
            for j in 0..width {
                lanes[j] = fold.merge(lanes[j], lanes[j + width]);
            }
        }
        lanes[0]
    }
}

/// Fold dense elements into the lanes: element `j` of every `LANES`-chunk goes to lane `j`.
/// The lanes are copied into a local array so they live in registers and the loop vectorises.
#[inline(always)]
fn fold_dense<F: Fold>(fold: &F, lanes: &mut [F::Acc; LANES], xs: &[F::In]) {
    let mut acc = *lanes;
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for j in 0..LANES {
            acc[j] = fold.step(acc[j], chunk[j]);
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] = fold.step(acc[j], x);
    }
    *lanes = acc;
}

/// [`Fold::fold_run`] for a float storage type that converts faster in blocks
/// ([`Real::BLOCKED`]): widen 256 elements at a time, then fold the compute-type values with
/// `step` (element `k` still goes to lane `k % LANES`).
#[inline(always)]
fn fold_widened<T: Real>(lanes: &mut [T::C; LANES], xs: &[T], step: impl Fn(T::C, T::C) -> T::C) {
    const WIDE: usize = 8 * LANES;
    let mut buf = [T::C::ZERO; WIDE];
    let mut acc = *lanes;
    for chunk in xs.chunks(WIDE) {
        let wide = &mut buf[..chunk.len()];
        T::widen(chunk, wide);
        let mut parts = wide.chunks_exact(LANES);
        for part in &mut parts {
            for j in 0..LANES {
                acc[j] = step(acc[j], part[j]);
            }
        }
        for (j, &v) in parts.remainder().iter().enumerate() {
            acc[j] = step(acc[j], v);
        }
    }
    *lanes = acc;
}

/// The two walks of a reduction: over the reduced positions of one output (input strides) and
/// over the outputs (input and output strides of the kept dims).
pub struct Walks {
    /// Reduced positions, with the input's strides.
    pub reduced: Walk<1>,
    /// Number of reduced positions per output.
    pub count: usize,
    /// Output positions: `[input offset, output offset]`.
    pub kept: Walk<2>,
}

impl Walks {
    /// The walks of reducing `dims` of `input` into `out`.
    pub fn new(input: &TensorArg, dims: &[usize], out: &TensorArg) -> Self {
        let shape = input.layout.shape();
        let red_shape: cartage_core::Dims = (0..shape.len())
            .map(|d| if dims.contains(&d) { shape[d] } else { 1 })
            .collect();
        Walks {
            reduced: Walk::new(&red_shape, [input.layout.strides()]),
            count: cartage_core::checked_numel(&red_shape).unwrap_or(0),
            kept: Walk::new(out.layout.shape(), [input.layout.strides(), out.layout.strides()]),
        }
    }
}

/// Visit every output element of a reduction: `per_output(reduction, input offset, parallel)`
/// computes it from the reduced positions at that input offset.
///
/// # Safety
/// `launch` checked the kernel; `T` and `O` are the input's and output's storage types.
pub unsafe fn for_each_output<T: Pod, O: Pod>(
    input: &TensorArg,
    walks: &Walks,
    out: &TensorArg,
    per_output: impl Fn(&Reduction<T>, usize, bool) -> O + Sync,
) {
    let (count, kept) = (walks.count, &walks.kept);
    let reduction = Reduction {
        input: base::<T>(input),
        walk: walks.reduced.clone(),
        count,
    };
    let [si, so] = kept.inner_strides();
    let outputs = out.layout.numel();
    let o = base::<O>(out);
    let work = outputs.saturating_mul(count.max(1));
    let threads = rayon::current_num_threads();
    let big = work >= PARALLEL_MIN_ELEMENTS && threads > 1;
    let spread_outputs = big && outputs >= 4 * threads && is_non_overlapping(out.layout.shape(), out.layout.strides());
    let inner_parallel = big && !spread_outputs;
    let body = |s: usize, e: usize| {
        kept.runs(s, e, |[io, oo], len| {
            for k in 0..len {
                let v = per_output(&reduction, io + k * si, inner_parallel);
                // SAFETY: the kept walk stays inside the output view.
                unsafe { *o.add(oo + k * so) = v };
            }
        })
    };
    if spread_outputs {
        for_ranges_with(outputs, 1, (CHUNK_MIN_ELEMENTS / count.max(1)).max(1), body);
    } else if outputs > 0 {
        body(0, outputs);
    }
}

struct Sum<T>(std::marker::PhantomData<T>);
impl<T: Real> Fold for Sum<T> {
    type In = T;
    type Acc = T::C;
    #[inline(always)]
    fn identity(&self) -> T::C {
        T::C::ZERO
    }
    #[inline(always)]
    fn step(&self, acc: T::C, x: T) -> T::C {
        acc + x.load()
    }
    #[inline(always)]
    fn merge(&self, a: T::C, b: T::C) -> T::C {
        a + b
    }
    #[inline(always)]
    fn fold_run(&self, lanes: &mut [T::C; LANES], xs: &[T]) {
        if T::BLOCKED {
            fold_widened(lanes, xs, |a, v| a + v)
        } else {
            fold_dense(self, lanes, xs)
        }
    }
}

struct Prod<T>(std::marker::PhantomData<T>);
impl<T: Real> Fold for Prod<T> {
    type In = T;
    type Acc = T::C;
    #[inline(always)]
    fn identity(&self) -> T::C {
        T::C::ONE
    }
    #[inline(always)]
    fn step(&self, acc: T::C, x: T) -> T::C {
        acc * x.load()
    }
    #[inline(always)]
    fn merge(&self, a: T::C, b: T::C) -> T::C {
        a * b
    }
    #[inline(always)]
    fn fold_run(&self, lanes: &mut [T::C; LANES], xs: &[T]) {
        if T::BLOCKED {
            fold_widened(lanes, xs, |a, v| a * v)
        } else {
            fold_dense(self, lanes, xs)
        }
    }
}

/// A wrapping integer product; the field is the type's 1.
struct IntProd<T>(T);
impl<T: Arith> Fold for IntProd<T> {
    type In = T;
    type Acc = T;
    #[inline(always)]
    fn identity(&self) -> T {
        self.0
    }
    #[inline(always)]
    fn step(&self, acc: T, x: T) -> T {
        T::mul(acc, x)
    }
    #[inline(always)]
    fn merge(&self, a: T, b: T) -> T {
        T::mul(a, b)
    }
}

struct IntSum<T>(std::marker::PhantomData<T>);
impl<T: Arith + Default> Fold for IntSum<T> {
    type In = T;
    type Acc = T;
    #[inline(always)]
    fn identity(&self) -> T {
        T::default()
    }
    #[inline(always)]
    fn step(&self, acc: T, x: T) -> T {
        T::add(acc, x)
    }
    #[inline(always)]
    fn merge(&self, a: T, b: T) -> T {
        T::add(a, b)
    }
}

/// NaN-propagating max (`MAX = true`) or min of floats, in the compute type.
struct Extreme<T, const MAX: bool>(std::marker::PhantomData<T>);
impl<T: Real, const MAX: bool> Fold for Extreme<T, MAX> {
    type In = T;
    type Acc = T::C;
    #[inline(always)]
    fn identity(&self) -> T::C {
        if MAX { T::C::NEG_INFINITY } else { T::C::INFINITY }
    }
    #[inline(always)]
    fn step(&self, acc: T::C, x: T) -> T::C {
        self.merge(acc, x.load())
    }
    #[inline(always)]
    fn merge(&self, a: T::C, b: T::C) -> T::C {
        if MAX { fmax(a, b) } else { fmin(a, b) }
    }
    #[inline(always)]
    fn fold_run(&self, lanes: &mut [T::C; LANES], xs: &[T]) {
        if T::BLOCKED {
            fold_widened(lanes, xs, |a, v| self.merge(a, v))
        } else {
            fold_dense(self, lanes, xs)
        }
    }
}

/// Max or min of an ordered integer type (bool included: or / and).
struct OrdExtreme<T, const MAX: bool>(T);
impl<T: Pod + Ord, const MAX: bool> Fold for OrdExtreme<T, MAX> {
    type In = T;
    type Acc = T;
    #[inline(always)]
    fn identity(&self) -> T {
        self.0
    }
    #[inline(always)]
    fn step(&self, acc: T, x: T) -> T {
        self.merge(acc, x)
    }
    #[inline(always)]
    fn merge(&self, a: T, b: T) -> T {
        if MAX { a.max(b) } else { a.min(b) }
    }
}

/// `Σ exp(x − max)` in the compute type.
struct ExpSum<T: Real>(T::C);
impl<T: Real> Fold for ExpSum<T> {
    type In = T;
    type Acc = T::C;
    #[inline(always)]
    fn identity(&self) -> T::C {
        T::C::ZERO
    }
    #[inline(always)]
    fn step(&self, acc: T::C, x: T) -> T::C {
        acc + (x.load() - self.0).exp()
    }
    #[inline(always)]
    fn merge(&self, a: T::C, b: T::C) -> T::C {
        a + b
    }
    #[inline(always)]
    fn fold_run(&self, lanes: &mut [T::C; LANES], xs: &[T]) {
        if T::BLOCKED {
            fold_widened(lanes, xs, |a, v| a + (v - self.0).exp())
        } else {
            fold_dense(self, lanes, xs)
        }
    }
}

/// `max + ln Σ exp(x − max)`, with the infinities and NaN of `max` passed through.
fn logsumexp<T: Real>(r: &Reduction<T>, offset: usize, parallel: bool) -> T::C {
    let max = r.fold(&Extreme::<T, true>(Default::default()), offset, parallel);
    if max.is_nan() || max == T::C::INFINITY || max == T::C::NEG_INFINITY {
        return max;
    }
    max + r.fold(&ExpSum::<T>(max), offset, parallel).ln()
}

/// `Kernel::Reduce`.
pub fn reduce(op: ReduceOp, input: &TensorArg, dims: &[usize], out: &TensorArg) -> Result<()> {
    match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => return crate::argreduce::arg_reduce(op, input, dims[0], out),
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod if !input.dtype.is_float() => {
            return int_reduce(op, input, dims, out);
        }
        _ => {}
    }
    with_float!(input.dtype, T => float_reduce::<T>(op, input, dims, out),
        else Err(Error::unsupported(op.name(), input.dtype, Device::cpu(), "the op is not defined for this dtype")))
}

fn float_reduce<T: Real>(op: ReduceOp, input: &TensorArg, dims: &[usize], out: &TensorArg) -> Result<()> {
    let sum = Sum::<T>(Default::default());
    let max = Extreme::<T, true>(Default::default());
    let min = Extreme::<T, false>(Default::default());
    let prod = Prod::<T>(Default::default());
    let walks = Walks::new(input, dims, out);
    let count = walks.count;
    // SAFETY: launch checked the kernel; input and output are both `T`.
    unsafe {
        if outer::applies(&walks) {
            let wide = outer::WideSum::<T>(Default::default());
            let n = count as f64;
            let done = match op {
                ReduceOp::Sum => outer::tiled(input, out, &walks, &wide, |s| T::store(T::C::from_f64(s))),
                ReduceOp::Mean => outer::tiled(input, out, &walks, &wide, |s| T::store(T::C::from_f64(s / n))),
                ReduceOp::Max => outer::tiled(input, out, &walks, &max, T::store),
                ReduceOp::Min => outer::tiled(input, out, &walks, &min, T::store),
                ReduceOp::Prod => outer::tiled(input, out, &walks, &prod, T::store),
                _ => false,
            };
            if done {
                return Ok(());
            }
        }
        match op {
            ReduceOp::Sum => for_each_output(input, &walks, out, |r, at, par| T::store(r.fold(&sum, at, par))),
            ReduceOp::Mean => for_each_output(input, &walks, out, |r: &Reduction<T>, at, par| {
                T::store(r.fold(&sum, at, par) / T::C::from_usize(r.count))
            }),
            ReduceOp::Max => for_each_output(input, &walks, out, |r, at, par| T::store(r.fold(&max, at, par))),
            ReduceOp::Min => for_each_output(input, &walks, out, |r, at, par| T::store(r.fold(&min, at, par))),
            ReduceOp::LogSumExp => {
                for_each_output(input, &walks, out, |r, at, par| T::store(logsumexp::<T>(r, at, par)))
            }
            ReduceOp::Prod => for_each_output(input, &walks, out, |r, at, par| T::store(r.fold(&prod, at, par))),
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                return Err(Error::invalid(op.name(), "handled by the arg reduction"));
            }
        }
    }
    Ok(())
}

fn int_reduce(op: ReduceOp, input: &TensorArg, dims: &[usize], out: &TensorArg) -> Result<()> {
    fn typed<T: Arith + Ord + Default>(
        op: ReduceOp,
        input: &TensorArg,
        dims: &[usize],
        out: &TensorArg,
        lowest: T,
        highest: T,
        one: T,
    ) -> Result<()> {
        let walks = Walks::new(input, dims, out);
        // SAFETY: launch checked the kernel; input and output are both `T`.
        unsafe {
            match op {
                ReduceOp::Sum => int_fold(input, &walks, out, &IntSum::<T>(Default::default())),
                ReduceOp::Max => int_fold(input, &walks, out, &OrdExtreme::<T, true>(lowest)),
                ReduceOp::Min => int_fold(input, &walks, out, &OrdExtreme::<T, false>(highest)),
                ReduceOp::Prod => int_fold(input, &walks, out, &IntProd(one)),
                _ => {
                    return Err(Error::unsupported(
                        op.name(),
                        input.dtype,
                        Device::cpu(),
                        "not defined for integers",
                    ));
                }
            }
        }
        Ok(())
    }
    match input.dtype {
        DType::I32 => typed::<i32>(op, input, dims, out, i32::MIN, i32::MAX, 1),
        DType::I64 => typed::<i64>(op, input, dims, out, i64::MIN, i64::MAX, 1),
        DType::U8 => typed::<u8>(op, input, dims, out, u8::MIN, u8::MAX, 1),
        DType::Bool => {
            // Bool max is "any", min is "all".
            let walks = Walks::new(input, dims, out);
            // SAFETY: launch checked the kernel; input and output are bool.
            unsafe {
                match op {
                    ReduceOp::Max => bool_fold(input, &walks, out, &BoolFold::<true>),
                    ReduceOp::Min => bool_fold(input, &walks, out, &BoolFold::<false>),
                    _ => {
                        return Err(Error::unsupported(
                            op.name(),
                            DType::Bool,
                            Device::cpu(),
                            "not defined for bool",
                        ));
                    }
                }
            }
            Ok(())
        }
        dtype => Err(Error::unsupported(
            op.name(),
            dtype,
            Device::cpu(),
            "not an integer dtype",
        )),
    }
}

/// An integer fold whose accumulator is the output value, tiled where the kept dims are dense.
///
/// # Safety
/// `launch` checked the kernel; input and output are both `T`.
unsafe fn int_fold<T: Pod, F: Fold<In = T, Acc = T>>(input: &TensorArg, walks: &Walks, out: &TensorArg, fold: &F) {
    // SAFETY: forwarded.
    unsafe {
        if outer::applies(walks) {
            outer::tiled(input, out, walks, fold, |v| v);
        } else {
            for_each_output(input, walks, out, |r, at, par| r.fold(fold, at, par))
        }
    }
}

/// [`int_fold`] for bool (the accumulator is a `bool`).
///
/// # Safety
/// `launch` checked the kernel; input and output are bool.
unsafe fn bool_fold<F: Fold<In = Bool8, Acc = bool>>(input: &TensorArg, walks: &Walks, out: &TensorArg, fold: &F) {
    // SAFETY: forwarded.
    unsafe {
        if outer::applies(walks) {
            outer::tiled(input, out, walks, fold, Bool8::new);
        } else {
            for_each_output(input, walks, out, |r, at, par| Bool8::new(r.fold(fold, at, par)))
        }
    }
}

/// Any (`MAX = true`) or all of bool elements.
struct BoolFold<const MAX: bool>;
impl<const MAX: bool> Fold for BoolFold<MAX> {
    type In = Bool8;
    type Acc = bool;
    #[inline(always)]
    fn identity(&self) -> bool {
        !MAX
    }
    #[inline(always)]
    fn step(&self, acc: bool, x: Bool8) -> bool {
        self.merge(acc, x.get())
    }
    #[inline(always)]
    fn merge(&self, a: bool, b: bool) -> bool {
        if MAX { a | b } else { a & b }
    }
}
