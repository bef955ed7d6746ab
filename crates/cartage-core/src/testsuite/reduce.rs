//! `Reduce` (every op × dtype over one, several, all or no dimensions of contiguous, strided and
//! broadcast inputs; products of magnitudes near 1, wrapping for integers, 1 when empty;
//! first-index ties; float max/min/argmax/argmin again over inputs holding NaN
//! and ±inf: NaN propagates, and the arg-reductions pick the first NaN) and `Softmax` /
//! log-softmax (any dimension, max-subtracted so large inputs do not overflow). The large
//! reductions use integer-valued inputs, whose sums are exact in any order, so one lost element
//! shows.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op, ReduceOp};
use crate::layout::{Dims, Layout};

use super::buffers::{Operand, Spec, operand_with_specials};
use super::harness::Harness;
use super::reference::{self, Tolerance, accumulation_eps, reduced_shape};
use super::scan::product_values;
use super::views::{LARGE, ViewKind, view};

fn dims_of(dims: &[usize]) -> Dims {
    dims.iter().copied().collect()
}

fn reduce_spec(op: ReduceOp) -> Spec {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => Spec::standard(),
        ReduceOp::LogSumExp => Spec::new((-10.0, 10.0), (-100, 100)),
        _ => Spec::new((-4.0, 4.0), (-20, 20)).grid(0.5),
    }
}

/// The reduction cases: shape, dims, input view.
fn reduce_cases() -> Vec<(Vec<usize>, Vec<usize>, ViewKind)> {
    use ViewKind::*;
    [
        (vec![7], vec![0], Contiguous),
        (vec![1], vec![0], Contiguous),
        (vec![], vec![], Contiguous),
        (vec![0], vec![0], Contiguous),
        (vec![3, 0], vec![1], Contiguous),
        (vec![3, 0], vec![0], Contiguous),
        (vec![33, 5], vec![0], Contiguous),
        (vec![33, 5], vec![1], Transposed),
        (vec![33, 5], vec![0, 1], Offset),
        (vec![3, 4, 5], vec![1], Permuted),
        (vec![3, 4, 5], vec![0, 2], Contiguous),
        (vec![3, 4, 5], vec![0, 1, 2], Narrowed),
        (vec![7, 5], vec![0], Broadcast),
        (vec![2, 3, 4, 5], vec![1, 3], Contiguous),
        (vec![65, 1023], vec![1], Contiguous),
        (vec![1023, 65], vec![0], Contiguous),
        // Outer dimensions into a few dozen outputs (a bias gradient's shape): backends may
        // split each column into chunks combined by a second pass.
        (vec![2000, 40], vec![0], Contiguous),
        (vec![9, 70, 33], vec![0, 1], Contiguous),
        (vec![40, 300], vec![1], Transposed),
    ]
    .into_iter()
    .collect()
}

/// Whether the kernel defines `op` over this case (arg-reductions reduce exactly one dimension;
/// extremes and log-sum-exp of zero elements are refused by the frontend before launch).
fn applies(op: ReduceOp, shape: &[usize], dims: &[usize]) -> bool {
    let per_output: usize = dims.iter().map(|&d| shape[d]).product();
    let outputs: usize = reduced_shape(shape, dims).iter().product();
    match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin if dims.len() != 1 => false,
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod => true,
        _ => per_output > 0 || outputs == 0,
    }
}

/// Launch a reduction of `input` and check it against the reference (exactly, when
/// `exact_sums` says the inputs are integer-valued).
fn reduce_case(
    h: &Harness,
    op: ReduceOp,
    dtype: DType,
    input: &Operand,
    dims: &[usize],
    exact_sums: bool,
    label: &str,
) {
    let shape = input.layout.shape().to_vec();
    let out_layout = Layout::contiguous(&reduced_shape(&shape, dims)).expect("small");
    let out = h.poisoned(op.output_dtype(dtype), out_layout.numel());
    let what = format!(
        "{} {dtype} {shape:?} over {dims:?} ({}){label}",
        op.name(),
        input.kind.name()
    );
    let kernel = Kernel::Reduce {
        op,
        input: input.arg(),
        dims: dims_of(dims),
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, allowed) = reference::reduce(op, dtype, &shape, &input.values, dims);
        if exact_sums {
            // Exact in any summation order: only the final rounding of a mean is allowed.
            h.check_with(&what, &out, &out_layout, &want, |_, w| {
                if op == ReduceOp::Mean {
                    Tolerance::of(dtype).allowed(w)
                } else {
                    0.0
                }
            });
        } else {
            h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
        }
    }
}

/// True for the reductions whose semantics single out NaN and ±inf (NaN propagates through
/// max/min; argmax/argmin pick the first NaN; infinities are ordinary extremes).
fn nan_sensitive(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
}

/// `Reduce`: every op × dtype the backend lists over the case table; for float max, min,
/// argmax and argmin the table again with NaN and ±inf in the input, plus NaN in chosen rows.
pub fn reduce(h: &Harness) {
    for op in ReduceOp::ALL {
        for dtype in DType::ALL {
            if !h.supports(Op::Reduce(op), dtype) {
                let (input, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(op.output_dtype(dtype), 1));
                let kernel = Kernel::Reduce {
                    op,
                    input: input.contiguous(&[3]),
                    dims: dims_of(&[0]),
                    out: out.contiguous(&[1]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            let specials = dtype.is_float() && nan_sensitive(op);
            for (shape, dims, kind) in reduce_cases() {
                if applies(op, &shape, &dims) {
                    let input = if op == ReduceOp::Prod {
                        // Magnitudes near 1 keep long products finite; integers ±1..=3 wrap.
                        let v = view(kind, &shape);
                        let base = product_values(h, dtype, v.base_len);
                        h.operand_from(dtype, v, &base)
                    } else {
                        h.operand(dtype, kind, &shape, reduce_spec(op))
                    };
                    reduce_case(h, op, dtype, &input, &dims, false, "");
                    if specials {
                        // About one special per reduced slice: some slices hold a NaN, some an
                        // infinity, some both, some neither.
                        let per_output: usize = dims.iter().map(|&d| shape[d]).product();
                        let input = operand_with_specials(h, dtype, kind, &shape, reduce_spec(op), per_output.max(4));
                        reduce_case(h, op, dtype, &input, &dims, false, " with NaN and ±inf");
                    }
                }
            }
            if specials {
                // Rows 1 and 3 hold one or two NaNs (argmax/argmin: the first of them), row 2
                // +inf in its first half and −inf in its second.
                let v = view(ViewKind::Contiguous, &[4, 6]);
                let mut base = h.random_values(dtype, 24, Spec::standard());
                for row in [1, 3] {
                    let (a, b) = (h.below(6), h.below(6));
                    base[row * 6 + a] = f64::NAN;
                    base[row * 6 + b] = f64::NAN;
                }
                base[12 + h.below(3)] = f64::INFINITY;
                base[15 + h.below(3)] = f64::NEG_INFINITY;
                let input = h.operand_from(dtype, v, &base);
                reduce_case(h, op, dtype, &input, &[1], false, " with NaN in rows 1 and 3");
                let input = h.operand_from(dtype, view(ViewKind::Transposed, &[6, 4]), &base);
                reduce_case(h, op, dtype, &input, &[0], false, " with NaN in columns 1 and 3");
            }
        }
    }
}

/// Large reductions (≥ 2^20 + 1 elements) whose exact answers do not depend on summation order:
/// sums of every dtype, max, first-index argmax with ties and with one late maximum, and column
/// and row sums of a 1025 × 1024 matrix, contiguous and transposed.
pub fn reduce_large(h: &Harness) {
    let integral = Spec::new((-2.0, 2.0), (-2, 2)).grid(1.0);
    for dtype in DType::ALL {
        if h.supports(Op::Reduce(ReduceOp::Sum), dtype) {
            let input = h.operand(dtype, ViewKind::Contiguous, &[LARGE], integral);
            reduce_case(h, ReduceOp::Sum, dtype, &input, &[0], true, " (integer-valued)");
        }
    }
    let f32 = DType::F32;
    if h.supports(Op::Reduce(ReduceOp::Sum), f32) {
        for (kind, dims) in [(ViewKind::Contiguous, [0]), (ViewKind::Transposed, [1])] {
            let input = h.operand(f32, kind, &[1025, 1024], integral);
            reduce_case(h, ReduceOp::Sum, f32, &input, &dims, true, " (integer-valued)");
        }
    }
    for op in [ReduceOp::Max, ReduceOp::ArgMax] {
        if h.supports(Op::Reduce(op), f32) {
            let input = h.operand(f32, ViewKind::Contiguous, &[LARGE], integral);
            reduce_case(h, op, f32, &input, &[0], true, " (integer-valued, ties)");
        }
    }
    // Products of ±1: exact in any order, and a dropped or repeated −1 flips the sign.
    for dtype in [DType::F32, DType::I32] {
        if h.supports(Op::Reduce(ReduceOp::Prod), dtype) {
            let v = view(ViewKind::Contiguous, &[LARGE]);
            let base: Vec<f64> = (0..LARGE).map(|_| if h.below(2) == 1 { -1.0 } else { 1.0 }).collect();
            let input = h.operand_from(dtype, v, &base);
            reduce_case(h, ReduceOp::Prod, dtype, &input, &[0], true, " (±1)");
        }
    }
    // A unique maximum late in the vector: a parallel argmax must combine partial results.
    if h.supports(Op::Reduce(ReduceOp::ArgMax), f32) {
        let v = view(ViewKind::Contiguous, &[LARGE]);
        let mut base = h.random_values(f32, LARGE, Spec::new((-4.0, 4.0), (-1000, 1000)));
        base[LARGE - 1 - h.below(LARGE / 10)] = 5000.0;
        let input = h.operand_from(f32, v, &base);
        reduce_case(h, ReduceOp::ArgMax, f32, &input, &[0], true, " (one late maximum)");
    }
    // Infinities early and two NaNs late, in different parts of a split reduction: max and min
    // are NaN, argmax and argmin the first NaN, whatever order the partial results combine in.
    let v = view(ViewKind::Contiguous, &[LARGE]);
    let mut base = h.random_values(f32, LARGE, integral);
    base[h.below(LARGE / 8)] = f64::INFINITY;
    base[LARGE / 8 + h.below(LARGE / 8)] = f64::NEG_INFINITY;
    let first_nan = LARGE / 2 + h.below(LARGE / 4);
    base[first_nan] = f64::NAN;
    base[first_nan + 1 + h.below(LARGE - first_nan - 1)] = f64::NAN;
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin] {
        if h.supports(Op::Reduce(op), f32) {
            let input = h.operand_from(f32, v.clone(), &base);
            reduce_case(h, op, f32, &input, &[0], true, " (±inf early, NaN late)");
        }
    }
}

/// `Softmax` and log-softmax: every float dtype the backend lists, along any dimension, from
/// strided and broadcast inputs, with inputs large enough that exp would overflow without the
/// max subtraction.
pub fn softmax(h: &Harness) {
    use ViewKind::*;
    let cases: Vec<(Vec<usize>, usize, ViewKind, Spec)> = vec![
        (vec![7], 0, Contiguous, Spec::standard()),
        (vec![1], 0, Contiguous, Spec::standard()),
        (vec![0], 0, Contiguous, Spec::standard()),
        (vec![3, 0], 1, Contiguous, Spec::standard()),
        (vec![3, 0], 0, Contiguous, Spec::standard()),
        (vec![33, 5], 0, Contiguous, Spec::standard()),
        (vec![33, 5], 1, Transposed, Spec::standard()),
        (vec![3, 4, 5], 1, Permuted, Spec::standard()),
        (vec![6, 7], 1, Narrowed, Spec::standard()),
        (vec![5, 7], 0, Broadcast, Spec::standard()),
        (vec![4, 33], 1, Contiguous, Spec::new((50.0, 100.0), (0, 0))),
        (vec![8, 8193], 1, Contiguous, Spec::new((-10.0, 10.0), (0, 0))),
        (vec![2, 3, 1025], 2, Offset, Spec::standard()),
    ];
    for log in [false, true] {
        let op = if log { Op::LogSoftmax } else { Op::Softmax };
        for dtype in DType::ALL {
            if !h.supports(op, dtype) {
                let (input, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(dtype, 3));
                let kernel = Kernel::Softmax {
                    input: input.contiguous(&[3]),
                    dim: 0,
                    log,
                    causal: false,
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            for (shape, dim, kind, spec) in &cases {
                let input = h.operand(dtype, *kind, shape, *spec);
                let layout = Layout::contiguous(shape).expect("small");
                let out = h.poisoned(dtype, layout.numel());
                let what = format!("{} {dtype} {shape:?} dim {dim} ({})", op.name(), input.kind.name());
                let kernel = Kernel::Softmax {
                    input: input.arg(),
                    dim: *dim,
                    log,
                    causal: false,
                    out: out.arg(&layout),
                };
                if h.launch(&what, &kernel) {
                    let want = reference::softmax(shape, &input.values, *dim, log);
                    let n = shape[*dim] as f64;
                    let accumulated = 4.0 * accumulation_eps(dtype) * n.sqrt();
                    let tol = Tolerance::transcendental(dtype);
                    h.check_with(&what, &out, &layout, &want, |_, w| tol.allowed(w) + accumulated);
                }
            }
            causal_softmax(h, dtype, log);
        }
    }
}

/// The causal softmax over `[.., L, S]` with L below, above and equal to S, rows long enough
/// for a block per row, and a transposed input: against the reference with the elements above
/// the diagonal set to −inf. Masked outputs must be exactly 0 (−inf for log-softmax).
fn causal_softmax(h: &Harness, dtype: DType, log: bool) {
    use ViewKind::*;
    let op = if log { Op::LogSoftmax } else { Op::Softmax };
    let cases: [(Vec<usize>, ViewKind); 5] = [
        (vec![2, 5, 7], Contiguous),
        (vec![3, 9, 4], Contiguous),
        (vec![2, 3, 33, 33], Contiguous),
        (vec![2, 1100], Contiguous),
        (vec![6, 4], Transposed),
    ];
    for (shape, kind) in cases {
        let input = h.operand(dtype, kind, &shape, Spec::standard());
        let layout = Layout::contiguous(&shape).expect("small");
        let out = h.poisoned(dtype, layout.numel());
        let dim = shape.len() - 1;
        let what = format!("causal {} {dtype} {shape:?} ({})", op.name(), input.kind.name());
        let kernel = Kernel::Softmax {
            input: input.arg(),
            dim,
            log,
            causal: true,
            out: out.arg(&layout),
        };
        if h.launch(&what, &kernel) {
            let (l, s) = (shape[dim - 1], shape[dim]);
            let masked: Vec<f64> = input
                .values
                .iter()
                .enumerate()
                .map(|(at, &v)| if at % s > (at / s) % l { f64::NEG_INFINITY } else { v })
                .collect();
            let want = reference::softmax(&shape, &masked, dim, log);
            let accumulated = 4.0 * accumulation_eps(dtype) * (s as f64).sqrt();
            let tol = Tolerance::transcendental(dtype);
            h.check_with(&what, &out, &layout, &want, |_, w| tol.allowed(w) + accumulated);
        }
    }
    // A causal softmax over another dimension, or over a rank-1 input, is malformed.
    for (shape, dim) in [(vec![4, 5], 0), (vec![5], 0)] {
        let (input, out) = (h.upload(dtype, &[1.0; 20]), h.poisoned(dtype, 20));
        let kernel = Kernel::Softmax {
            input: input.contiguous(&shape),
            dim,
            log,
            causal: true,
            out: out.contiguous(&shape),
        };
        h.count_check();
        if h.run(&kernel).is_ok() {
            h.fail(format!(
                "causal {} {dtype} {shape:?} over dim {dim}: accepted, must be refused",
                op.name()
            ));
        }
    }
}
