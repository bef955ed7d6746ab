//! `Fill` and `Arange`: every dtype, every output shape of the element-wise table written through
//! contiguous, offset, narrowed, transposed and permuted output views, and the large case.

use crate::dtype::{DType, Scalar};
use crate::kernel::{Kernel, Op};

use super::buffers::decode_ints;
use super::harness::Harness;
use super::reference::{Tolerance, cast};
use super::views::{Case, ViewKind, elementwise_cases, large_cases};

/// The view kind an output may take: a broadcast (stride 0) output makes no sense, so those
/// cases write a contiguous output instead.
pub fn output_kind(kind: ViewKind) -> ViewKind {
    match kind {
        ViewKind::Broadcast | ViewKind::Scalar => ViewKind::Contiguous,
        other => other,
    }
}

/// Output cases of creation ops: the element-wise table plus the large vector.
fn creation_cases() -> Vec<Case> {
    let mut cases = elementwise_cases();
    cases.extend(large_cases().into_iter().filter(|c| c.shape.len() == 1));
    cases
}

/// The dtype a fill value is given in, for the cast reference.
fn scalar_dtype(value: Scalar) -> DType {
    match value {
        Scalar::Float(_) => DType::F64,
        Scalar::Int(_) => DType::I64,
        Scalar::Bool(_) => DType::Bool,
    }
}

fn random_scalar(h: &Harness) -> Scalar {
    match h.below(4) {
        0 | 1 => Scalar::Float(h.uniform(-300.0, 300.0)),
        2 => Scalar::Int(h.int(-300, 300)),
        _ => Scalar::Bool(h.below(2) == 1),
    }
}

/// `Fill`: the value cast to the output dtype (`as` semantics) in every element of the view.
pub fn fill(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Fill, dtype) {
            let out = h.poisoned(dtype, 3);
            let kernel = Kernel::Fill {
                out: out.contiguous(&[3]),
                value: Scalar::Int(1),
            };
            h.expect_unsupported(&format!("fill {dtype}"), &kernel);
            continue;
        }
        for case in creation_cases() {
            // The large fill runs once per element size.
            let large = case.shape.iter().product::<usize>() > 100_000;
            if large && !matches!(dtype, DType::F32 | DType::F16 | DType::I64 | DType::U8) {
                continue;
            }
            fill_case(h, dtype, output_kind(case.kinds[0]), &case.shape, random_scalar(h));
        }
        // Values that must saturate, wrap, or turn NaN into 0 or true.
        let edges = [
            Scalar::Float(3e9),
            Scalar::Float(-3e9),
            Scalar::Float(1e10),
            Scalar::Float(f64::NAN),
            Scalar::Float(-0.9),
            Scalar::Float(258.6),
            Scalar::Float(-79.8),
            Scalar::Int(-5),
            Scalar::Int(300),
            Scalar::Int(1 << 40),
            Scalar::Bool(true),
        ];
        for value in edges {
            fill_case(h, dtype, ViewKind::Contiguous, &[7], value);
        }
    }
    // Integers beyond 2^53 must arrive exactly.
    if h.supports(Op::Fill, DType::I64) {
        let value = Scalar::Int(i64::MAX - 12_345);
        let out = h.poisoned(DType::I64, 33);
        let what = "fill i64 with i64::MAX - 12345";
        if h.launch(
            what,
            &Kernel::Fill {
                out: out.contiguous(&[33]),
                value,
            },
        ) && let Some(bytes) = h.read_bytes(what, &out)
        {
            h.count_check();
            if decode_ints(DType::I64, &bytes).iter().any(|&v| v != i64::MAX - 12_345) {
                h.fail(format!("{what}: values are not exact"));
            }
        }
    }
}

fn fill_case(h: &Harness, dtype: DType, kind: ViewKind, shape: &[usize], value: Scalar) {
    let (out, layout) = h.poisoned_view(dtype, kind, shape);
    let what = format!("fill {dtype} with {value:?} into {} {shape:?}", kind.name());
    if h.launch(
        &what,
        &Kernel::Fill {
            out: out.arg(&layout),
            value,
        },
    ) {
        let want = vec![cast(scalar_dtype(value), dtype, value.as_f64()); layout.numel()];
        h.check(&what, &out, &layout, &want, Tolerance::of(dtype));
    }
}

/// `Arange`: `out[i] = start + i * step` evaluated in f64, then cast, `i` being the row-major
/// position in the (possibly strided) output view.
pub fn arange(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Arange, dtype) {
            let out = h.poisoned(dtype, 3);
            let kernel = Kernel::Arange {
                out: out.contiguous(&[3]),
                start: 0.0,
                step: 1.0,
            };
            h.expect_unsupported(&format!("arange {dtype}"), &kernel);
            continue;
        }
        for case in creation_cases() {
            let large = case.shape.iter().product::<usize>() > 100_000;
            if large && !matches!(dtype, DType::F32 | DType::I64) {
                continue;
            }
            let kind = output_kind(case.kinds[0]);
            let (start, step) = arange_params(h, dtype, large);
            arange_case(h, dtype, kind, &case.shape, start, step);
        }
        // Fractional steps into integers truncate each value toward zero.
        if dtype.is_int() {
            arange_case(h, dtype, ViewKind::Contiguous, &[17], 0.5, 0.25);
        }
        if dtype == DType::U8 {
            arange_case(h, dtype, ViewKind::Contiguous, &[9], -3.0, 100.0);
        }
    }
}

fn arange_params(h: &Harness, dtype: DType, large: bool) -> (f64, f64) {
    match dtype {
        _ if large && dtype == DType::F32 => (0.0, 1.0),
        _ if large => (-500_000.0, 3.0),
        DType::Bool => (-2.0, 1.0),
        DType::U8 => (h.int(0, 20) as f64, h.int(0, 3) as f64),
        d if d.is_int() => (h.int(-50, 50) as f64, h.int(-3, 3) as f64),
        _ => (h.uniform(-10.0, 10.0), h.uniform(-2.0, 2.0)),
    }
}

fn arange_case(h: &Harness, dtype: DType, kind: ViewKind, shape: &[usize], start: f64, step: f64) {
    let (out, layout) = h.poisoned_view(dtype, kind, shape);
    let what = format!(
        "arange {dtype} start {start} step {step} into {} {shape:?}",
        kind.name()
    );
    if !h.launch(
        &what,
        &Kernel::Arange {
            out: out.arg(&layout),
            start,
            step,
        },
    ) {
        return;
    }
    let want: Vec<f64> = (0..layout.numel())
        .map(|i| cast(DType::F64, dtype, start + i as f64 * step))
        .collect();
    // Devices without f64 may evaluate `start + i * step` in f32: allow its rounding.
    let low_precision = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
    h.check_with(&what, &out, &layout, &want, |i, w| {
        let f32_error = if low_precision {
            2.0 * f32::EPSILON as f64 * (start.abs() + i as f64 * step.abs())
        } else {
            0.0
        };
        Tolerance::of(dtype).allowed(w) + f32_error
    });
}
