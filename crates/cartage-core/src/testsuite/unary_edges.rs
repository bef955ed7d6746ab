//! Fixed edge inputs of the unary ops whose semantics single them out: exact `.5` ties for the
//! rounding ops (half to even), ±0, NaN and ±inf for `sign` (whose zeros keep their sign),
//! 0 and ±inf for `rsqrt`/`recip`, `softplus` around its threshold 20, `log1p`/`expm1` near 0
//! and at their limits; and the integer edges of the ops defined on integers (rounding ops are
//! the identity, `sign` is -1/0/1, `square` wraps), compared exactly.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op, UnaryOp};

use super::buffers::{decode, decode_ints, encode_ints};
use super::elementwise::unary_tolerance;
use super::harness::Harness;
use super::reference::{self, wrap_int};

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

/// The float edge inputs of `op` (rounded to each dtype before use).
fn float_edges(op: UnaryOp) -> &'static [f64] {
    match op {
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => &[
            -3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, -0.25, 0.75, -0.0, 0.0, 1023.5, -1024.5, 0.4999, INF,
            -INF, NAN,
        ],
        UnaryOp::Sign => &[-0.0, 0.0, NAN, INF, -INF, -3.0, 2.5, 1e-3, -1e-3],
        UnaryOp::Rsqrt => &[0.0, 0.25, 1.0, 4.0, 100.0, INF],
        UnaryOp::Recip => &[0.0, 0.5, -2.0, 3.0, INF, -INF],
        UnaryOp::Square => &[0.0, -0.0, -3.0, 1.5, INF, -INF, NAN, 300.0],
        UnaryOp::Softplus => &[19.5, 19.9, 20.0, 20.125, 20.5, 21.0, 30.0, 100.0, -30.0, -100.0, 0.0],
        UnaryOp::Log1p => &[0.0, 1e-3, -1e-3, -0.5, -0.999, -1.0, 1.0, INF],
        UnaryOp::Expm1 => &[0.0, 1e-3, -1e-3, -20.0, -INF, 1.0, 10.0],
        UnaryOp::Silu => &[0.0, 1.0, -1.0, -30.0, 30.0, 100.0],
        UnaryOp::Erf => &[0.0, 0.5, -0.5, 3.0, -3.0, 6.0, INF, -INF],
        UnaryOp::Sin | UnaryOp::Cos => &[0.0, 1.0, -1.0, std::f64::consts::FRAC_PI_2, -std::f64::consts::PI],
        _ => &[],
    }
}

/// Unary ops whose edges are checked.
const EDGE_OPS: [UnaryOp; 14] = [
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
    UnaryOp::Trunc,
    UnaryOp::Sign,
    UnaryOp::Rsqrt,
    UnaryOp::Recip,
    UnaryOp::Square,
    UnaryOp::Softplus,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Silu,
    UnaryOp::Erf,
    UnaryOp::Sin,
];

/// The edges of every listed op in every float dtype the backend runs it for, and the integer
/// edges of the ops defined on integers.
pub fn unary_edges(h: &Harness) {
    for op in EDGE_OPS.into_iter().chain([UnaryOp::Cos]) {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            if h.supports(Op::Unary(op), dtype) {
                float_case(h, op, dtype);
            }
        }
        if op.integer_ok() {
            for dtype in [DType::I32, DType::I64, DType::U8] {
                if h.supports(Op::Unary(op), dtype) {
                    int_case(h, op, dtype);
                }
            }
        }
    }
}

fn float_case(h: &Harness, op: UnaryOp, dtype: DType) {
    let values: Vec<f64> = float_edges(op).iter().map(|&v| dtype.round_trip(v)).collect();
    let n = values.len();
    let (input, out) = (h.upload(dtype, &values), h.poisoned(dtype, n));
    let layout = crate::layout::Layout::contiguous(&[n]).expect("small");
    let what = format!("{} {dtype} at its edges {values:?}", op.name());
    let kernel = Kernel::Unary {
        op,
        input: input.contiguous(&[n]),
        out: out.arg(&layout),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let want: Vec<f64> = values.iter().map(|&x| reference::unary(op, dtype, x)).collect();
    h.check(&what, &out, &layout, &want, unary_tolerance(op, dtype));
    if op == UnaryOp::Sign {
        // `sign(±0)` is ±0: the value check cannot tell the zeros apart, the sign bit can.
        let Some(bytes) = h.read_bytes(&what, &out) else { return };
        h.count_check();
        let got = decode(dtype, &bytes);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if w == 0.0 && (g != 0.0 || g.is_sign_negative() != w.is_sign_negative()) {
                h.fail(format!("{what}: sign of {} gave {g:?}, want {w:?}", values[i]));
            }
        }
    }
}

fn int_case(h: &Harness, op: UnaryOp, dtype: DType) {
    let (min, max) = match dtype {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        _ => (0, 255),
    };
    let values: Vec<i64> = [
        min,
        max,
        min + 1,
        max - 1,
        -1,
        0,
        1,
        7,
        -7,
        46_341,
        3_037_000_500,
        16,
        200,
    ]
    .iter()
    .map(|&v| wrap_int(dtype, v))
    .collect();
    let n = values.len();
    let input = h.upload_bytes(dtype, &encode_ints(dtype, &values));
    let out = h.poisoned(dtype, n);
    let what = format!("{} {dtype} at the integer edges {values:?}", op.name());
    let kernel = Kernel::Unary {
        op,
        input: input.contiguous(&[n]),
        out: out.contiguous(&[n]),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let want: Vec<i64> = values
        .iter()
        .map(|&x| match op {
            UnaryOp::Square => wrap_int(dtype, x.wrapping_mul(x)),
            UnaryOp::Sign => x.signum(),
            UnaryOp::Neg => wrap_int(dtype, x.wrapping_neg()),
            UnaryOp::Abs if dtype == DType::U8 => x,
            UnaryOp::Abs => wrap_int(dtype, x.wrapping_abs()),
            UnaryOp::Relu => x.max(0),
            _ => x,
        })
        .collect();
    let Some(bytes) = h.read_bytes(&what, &out) else { return };
    h.count_check();
    let got = decode_ints(dtype, &bytes);
    if got != want {
        h.fail(format!("{what}: got {got:?}, want {want:?}"));
    }
}
