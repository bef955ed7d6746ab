//! `Unary`, `Binary`, `Compare` and `Where` over the element-wise table (every dtype the backend
//! lists, empty to large, strided and broadcast operands), plus exact integer wrapping at the
//! edges of i32, i64 and u8. Float maximum/minimum get operands holding NaN and ±inf (NaN
//! propagates); integer powers get bases and exponents whose powers overflow (they wrap).

use crate::dtype::DType;
use crate::kernel::{BinaryOp, CompareOp, Kernel, Op, ReduceOp, UnaryOp};
use crate::layout::Layout;

use super::buffers::{Spec, decode_ints, encode_ints, operand_with_specials};
use super::harness::Harness;
use super::reference::{self, Tolerance, int_pow, wrap_int};
use super::views::{Case, ViewKind, elementwise_cases, large_cases};

fn contiguous(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("suite shapes are small")
}

/// Inputs valid for `op`: rounding ops on a 0.5 grid (exact ties, checked half to even), sign
/// on a grid that holds zeros, log1p above -1, rsqrt/recip away from 0 (zero, where they give
/// +inf, is in `unary_edges`), softplus on both sides of its threshold 20, integer squares that
/// overflow.
fn unary_spec(op: UnaryOp) -> Spec {
    match op {
        UnaryOp::Exp => Spec::new((-5.0, 5.0), (-100, 100)),
        UnaryOp::Log => Spec::new((0.05, 10.0), (1, 100)),
        UnaryOp::Sqrt => Spec::new((0.0, 10.0), (0, 100)),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => {
            Spec::new((-6.0, 6.0), (-100, 100)).grid(0.5)
        }
        UnaryOp::Sign => Spec::new((-2.0, 2.0), (-3, 3)).grid(0.5),
        UnaryOp::Rsqrt => Spec::new((0.05, 10.0), (1, 100)),
        UnaryOp::Recip => Spec::new((0.25, 4.0), (1, 100)).signed(),
        UnaryOp::Square => Spec::new((-8.0, 8.0), (-(1 << 40), 1 << 40)),
        UnaryOp::Log1p => Spec::new((-0.95, 5.0), (0, 100)),
        UnaryOp::Sin | UnaryOp::Cos => Spec::new((-6.0, 6.0), (-100, 100)),
        UnaryOp::Silu => Spec::new((-10.0, 10.0), (-100, 100)),
        UnaryOp::Softplus => Spec::new((-10.0, 30.0), (-100, 100)),
        _ => Spec::standard(),
    }
}

/// Exact for ops that move, round or compare values; one or two roundings for `square` and the
/// transcendental tolerance (a few ulps for GPU math libraries) for the rest.
pub(super) fn unary_tolerance(op: UnaryOp, dtype: DType) -> Tolerance {
    match op {
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Relu
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Trunc
        | UnaryOp::Sign => Tolerance::EXACT,
        UnaryOp::Square => Tolerance::of(dtype),
        _ => Tolerance::transcendental(dtype),
    }
}

/// `Unary`: every op × dtype the backend lists, every case; a few large ones.
pub fn unary(h: &Harness) {
    for op in UnaryOp::ALL {
        for dtype in DType::ALL {
            if !h.supports(Op::Unary(op), dtype) {
                let (input, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(dtype, 3));
                let kernel = Kernel::Unary {
                    op,
                    input: input.contiguous(&[3]),
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            for case in elementwise_cases() {
                unary_case(h, op, dtype, &case);
            }
        }
    }
    let large = large_cases();
    for (op, dtype, case) in [
        (UnaryOp::Neg, DType::F32, &large[0]),
        (UnaryOp::Exp, DType::F32, &large[0]),
        (UnaryOp::Relu, DType::F16, &large[1]),
        (UnaryOp::Abs, DType::I32, &large[1]),
    ] {
        if h.supports(Op::Unary(op), dtype) {
            unary_case(h, op, dtype, case);
        }
    }
}

fn unary_case(h: &Harness, op: UnaryOp, dtype: DType, case: &Case) {
    let input = h.operand(dtype, case.kinds[0], &case.shape, unary_spec(op));
    let layout = contiguous(&case.shape);
    let out = h.poisoned(dtype, layout.numel());
    let what = format!("{} {dtype}, {}", op.name(), case.describe(1));
    let kernel = Kernel::Unary {
        op,
        input: input.arg(),
        out: out.arg(&layout),
    };
    if h.launch(&what, &kernel) {
        let want: Vec<f64> = input.values.iter().map(|&x| reference::unary(op, dtype, x)).collect();
        h.check(&what, &out, &layout, &want, unary_tolerance(op, dtype));
    }
}

fn binary_specs(op: BinaryOp) -> (Spec, Spec) {
    match op {
        BinaryOp::Div => (Spec::standard(), Spec::new((0.5, 4.0), (-20, 20)).signed()),
        // Integer powers overflow most of the time (300^4 > 2^32, 2^80 > 2^64) and must wrap;
        // negative exponents follow the kernel rules.
        BinaryOp::Pow => (Spec::new((0.1, 4.0), (-300, 300)), Spec::new((-2.0, 2.0), (-3, 80))),
        _ => (Spec::standard(), Spec::standard()),
    }
}

/// One float operand value in this many is NaN, +inf or −inf, for the ops whose semantics single
/// them out (0: none).
fn binary_specials(op: BinaryOp) -> usize {
    match op {
        BinaryOp::Maximum | BinaryOp::Minimum => 4,
        _ => 0,
    }
}

fn binary_tolerance(op: BinaryOp, dtype: DType) -> Tolerance {
    match op {
        BinaryOp::Maximum | BinaryOp::Minimum => Tolerance::EXACT,
        BinaryOp::Pow => Tolerance::transcendental(dtype),
        _ => Tolerance::of(dtype),
    }
}

/// `Binary`: every op × dtype the backend lists (integers wrap, `x / 0` is 0, negative integer
/// powers follow the kernel rules), every case with mixed operand views; a few large ones.
pub fn binary(h: &Harness) {
    for op in BinaryOp::ALL {
        for dtype in DType::ALL {
            if !h.supports(Op::Binary(op), dtype) {
                let (a, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(dtype, 3));
                let kernel = Kernel::Binary {
                    op,
                    lhs: a.contiguous(&[3]),
                    rhs: a.contiguous(&[3]),
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            for case in elementwise_cases() {
                binary_case(h, op, dtype, &case);
            }
        }
    }
    let large = large_cases();
    for (op, dtype, case) in [
        (BinaryOp::Add, DType::F32, &large[0]),
        (BinaryOp::Mul, DType::I32, &large[1]),
        (BinaryOp::Maximum, DType::BF16, &large[1]),
    ] {
        if h.supports(Op::Binary(op), dtype) {
            binary_case(h, op, dtype, case);
        }
    }
}

fn binary_case(h: &Harness, op: BinaryOp, dtype: DType, case: &Case) {
    let (lspec, rspec) = binary_specs(op);
    let specials = binary_specials(op);
    let lhs = operand_with_specials(h, dtype, case.kinds[0], &case.shape, lspec, specials);
    let rhs = operand_with_specials(h, dtype, case.kinds[1], &case.shape, rspec, specials);
    let layout = contiguous(&case.shape);
    let out = h.poisoned(dtype, layout.numel());
    let what = format!("{} {dtype}, {}", op.name(), case.describe(2));
    let kernel = Kernel::Binary {
        op,
        lhs: lhs.arg(),
        rhs: rhs.arg(),
        out: out.arg(&layout),
    };
    if h.launch(&what, &kernel) {
        let want: Vec<f64> = lhs
            .values
            .iter()
            .zip(&rhs.values)
            .map(|(&a, &b)| reference::binary(op, dtype, a, b))
            .collect();
        h.check(&what, &out, &layout, &want, binary_tolerance(op, dtype));
    }
}

/// The exact result of an integer op at full i64 precision, stored as `dtype` (wrapping).
fn exact(dtype: DType, v: i64) -> i64 {
    wrap_int(dtype, v)
}

/// Bases and exponents of integer powers for `dtype` (the dtype's `min` and `max`): every base
/// against every exponent, so most powers overflow — by a little, by a lot, and with exponents
/// up to the dtype's maximum (a backend must not loop `exp` times, nor clamp the exponent).
fn pow_pairs(dtype: DType, min: i64, max: i64) -> (Vec<i64>, Vec<i64>) {
    let bases = [max, min, max - 1, min + 1, 2, -2, 3, -3, 7, 12_345, -1, 0, 1, 255, 16];
    let exps: Vec<i64> = match dtype {
        DType::I32 => vec![max, max - 1, (1 << 20) + 3, 31, 32, 33, 63, 64, 2, 0, -1, -2, min],
        DType::I64 => vec![
            max,
            max - 1,
            (1 << 40) + 5,
            1 << 32,
            (1 << 32) + 1,
            u32::MAX as i64,
            63,
            64,
            65,
            2,
            0,
            -1,
            -2,
            min,
        ],
        _ => vec![255, 254, 128, 9, 8, 7, 2, 1, 0],
    };
    let mut lhs = Vec::new();
    let mut rhs = Vec::new();
    for &b in &bases {
        for &e in &exps {
            lhs.push(exact(dtype, b));
            rhs.push(exact(dtype, e));
        }
    }
    (lhs, rhs)
}

fn exact_binary(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => 0,
        BinaryOp::Div => a.wrapping_div(b),
        BinaryOp::Pow => int_pow(a, b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

/// Run `kernel` (output `out` of `dtype`) and compare its integers exactly with `want`.
fn check_ints(h: &Harness, what: &str, kernel: &Kernel, out: &super::DeviceBuffer, want: &[i64]) {
    if !h.launch(what, kernel) {
        return;
    }
    let Some(bytes) = h.read_bytes(what, out) else { return };
    h.count_check();
    let got = decode_ints(out.dtype, &bytes);
    if got != want {
        h.fail(format!("{what}: got {got:?}, want {want:?}"));
    }
}

/// Integer arithmetic at the edges of each type wraps (add, sub, mul, neg, abs, pow, `MIN / -1`,
/// sums), `x / 0` is 0, negative powers follow the kernel rules — compared exactly in i64.
pub fn integer_wrapping(h: &Harness) {
    for dtype in [DType::I32, DType::I64, DType::U8] {
        let (min, max) = match dtype {
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::I64 => (i64::MIN, i64::MAX),
            _ => (0, 255),
        };
        let lhs = [max, min, max, min, -1, 0, 7, -7, 65_536, 3, 2, -1, 1, 200, 16];
        let rhs = [1, -1, max, min, min, 0, 0, 2, 65_536, 40, -1, -3, -7, 100, 16];
        let lhs: Vec<i64> = lhs.iter().map(|&v| exact(dtype, v)).collect();
        let rhs: Vec<i64> = rhs.iter().map(|&v| exact(dtype, v)).collect();
        let n = lhs.len();
        let (a, b) = (
            h.upload_bytes(dtype, &encode_ints(dtype, &lhs)),
            h.upload_bytes(dtype, &encode_ints(dtype, &rhs)),
        );
        let (pow_lhs, pow_rhs) = pow_pairs(dtype, min, max);
        let (pa, pb) = (
            h.upload_bytes(dtype, &encode_ints(dtype, &pow_lhs)),
            h.upload_bytes(dtype, &encode_ints(dtype, &pow_rhs)),
        );
        for op in BinaryOp::ALL {
            if !h.supports(Op::Binary(op), dtype) {
                continue;
            }
            let (x, y, bx, by) = if op == BinaryOp::Pow {
                (&pow_lhs, &pow_rhs, &pa, &pb)
            } else {
                (&lhs, &rhs, &a, &b)
            };
            let n = x.len();
            let out = h.poisoned(dtype, n);
            let want: Vec<i64> = x
                .iter()
                .zip(y)
                .map(|(&x, &y)| exact(dtype, exact_binary(op, x, y)))
                .collect();
            let kernel = Kernel::Binary {
                op,
                lhs: bx.contiguous(&[n]),
                rhs: by.contiguous(&[n]),
                out: out.contiguous(&[n]),
            };
            check_ints(h, &format!("{} {dtype} at the edges", op.name()), &kernel, &out, &want);
        }
        for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu] {
            if !h.supports(Op::Unary(op), dtype) {
                continue;
            }
            let out = h.poisoned(dtype, n);
            let want: Vec<i64> = lhs
                .iter()
                .map(|&x| {
                    exact(
                        dtype,
                        match op {
                            UnaryOp::Neg => x.wrapping_neg(),
                            UnaryOp::Abs if dtype == DType::U8 => x,
                            UnaryOp::Abs => x.wrapping_abs(),
                            _ => x.max(0),
                        },
                    )
                })
                .collect();
            let kernel = Kernel::Unary {
                op,
                input: a.contiguous(&[n]),
                out: out.contiguous(&[n]),
            };
            check_ints(h, &format!("{} {dtype} at the edges", op.name()), &kernel, &out, &want);
        }
        if h.supports(Op::Reduce(ReduceOp::Sum), dtype) {
            let out = h.poisoned(dtype, 1);
            let want = [exact(dtype, lhs.iter().fold(0i64, |s, &x| s.wrapping_add(x)))];
            let kernel = Kernel::Reduce {
                op: ReduceOp::Sum,
                input: a.contiguous(&[n]),
                dims: [0].into_iter().collect(),
                out: out.contiguous(&[1]),
            };
            check_ints(h, &format!("sum {dtype} wrapping"), &kernel, &out, &want);
        }
    }
}

/// `Compare`: every comparison × dtype, operands on a coarse grid so ties occur; output bool.
pub fn compare(h: &Harness) {
    let spec = Spec::new((-2.0, 2.0), (-3, 3)).grid(0.5);
    for op in CompareOp::ALL {
        for dtype in DType::ALL {
            if !h.supports(Op::Compare(op), dtype) {
                let (a, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(DType::Bool, 3));
                let kernel = Kernel::Compare {
                    op,
                    lhs: a.contiguous(&[3]),
                    rhs: a.contiguous(&[3]),
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
                continue;
            }
            let mut cases = elementwise_cases();
            if op == CompareOp::Lt && dtype == DType::F32 {
                cases.extend(large_cases());
            }
            for case in cases {
                let lhs = h.operand(dtype, case.kinds[0], &case.shape, spec);
                let rhs = h.operand(dtype, case.kinds[1], &case.shape, spec);
                let layout = contiguous(&case.shape);
                let out = h.poisoned(DType::Bool, layout.numel());
                let what = format!("{} {dtype}, {}", op.name(), case.describe(2));
                let kernel = Kernel::Compare {
                    op,
                    lhs: lhs.arg(),
                    rhs: rhs.arg(),
                    out: out.arg(&layout),
                };
                if h.launch(&what, &kernel) {
                    let want: Vec<f64> = lhs
                        .values
                        .iter()
                        .zip(&rhs.values)
                        .map(|(&a, &b)| reference::compare(op, a, b))
                        .collect();
                    h.check(&what, &out, &layout, &want, Tolerance::EXACT);
                }
            }
        }
    }
}

/// `Where`: every value dtype, condition and values each with their own view (broadcast
/// included); a large case.
pub fn where_select(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Where, dtype) {
            let (c, a, out) = (
                h.upload(DType::Bool, &[1.0; 3]),
                h.upload(dtype, &[1.0; 3]),
                h.poisoned(dtype, 3),
            );
            let kernel = Kernel::Where {
                cond: c.contiguous(&[3]),
                on_true: a.contiguous(&[3]),
                on_false: a.contiguous(&[3]),
                out: out.contiguous(&[3]),
            };
            h.expect_unsupported(&format!("where {dtype}"), &kernel);
            continue;
        }
        let mut cases = elementwise_cases();
        if dtype == DType::F32 {
            cases.push(large_cases().swap_remove(0));
            cases.push(Case::new(
                "large-broadcast-cond",
                &[1025, 1024],
                [ViewKind::Broadcast, ViewKind::Transposed, ViewKind::Scalar],
            ));
        }
        for case in cases {
            let cond = h.operand(DType::Bool, case.kinds[0], &case.shape, Spec::standard());
            let on_true = h.operand(dtype, case.kinds[1], &case.shape, Spec::standard());
            let on_false = h.operand(dtype, case.kinds[2], &case.shape, Spec::standard());
            let layout = contiguous(&case.shape);
            let out = h.poisoned(dtype, layout.numel());
            let what = format!("where {dtype}, {}", case.describe(3));
            let kernel = Kernel::Where {
                cond: cond.arg(),
                on_true: on_true.arg(),
                on_false: on_false.arg(),
                out: out.arg(&layout),
            };
            if h.launch(&what, &kernel) {
                let want: Vec<f64> = (0..layout.numel())
                    .map(|i| {
                        if cond.values[i] != 0.0 {
                            on_true.values[i]
                        } else {
                            on_false.values[i]
                        }
                    })
                    .collect();
                h.check(&what, &out, &layout, &want, Tolerance::EXACT);
            }
        }
    }
}
