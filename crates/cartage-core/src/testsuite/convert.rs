//! `Cast` (every source × target pair, with saturation, NaN, infinities and wrapping) and `Copy`
//! (bit-exact, from strided and broadcast views, into contiguous, transposed and narrowed views).

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};

use super::buffers::{Operand, Spec, decode};
use super::harness::Harness;
use super::reference::{Tolerance, cast as cast_reference, wrap};
use super::views::{Case, LARGE, ViewKind, elementwise_cases, offsets, view};

/// Values every cast must handle, kept to those `src` can hold.
fn special_values(src: DType) -> Vec<f64> {
    if src == DType::Bool {
        return vec![0.0, 1.0];
    }
    if src.is_float() {
        return [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.7,
            127.9,
            128.5,
            255.9,
            256.5,
            -129.3,
            3e9,
            -3e9,
            1e20,
            -1e20,
            65504.0,
            70000.0,
            1e-8,
        ]
        .into_iter()
        .map(|v| src.round_trip(v))
        .collect();
    }
    [
        0.0,
        1.0,
        -1.0,
        127.0,
        128.0,
        255.0,
        256.0,
        -129.0,
        65535.0,
        70000.0,
        i32::MAX as f64,
        i32::MIN as f64,
        (1u64 << 40) as f64 + 3.0,
    ]
    .into_iter()
    .filter(|&v| wrap(src, v) == v)
    .collect()
}

/// An operand of random values with the special values mixed in.
fn cast_input(h: &Harness, src: DType, kind: ViewKind, shape: &[usize]) -> Operand {
    let v = view(kind, shape);
    let mut base = h.random_values(src, v.base_len, Spec::new((-300.0, 300.0), (-300, 300)));
    let specials = special_values(src);
    for (slot, special) in base.iter_mut().step_by(3).zip(specials.iter().cycle()) {
        *slot = *special;
    }
    h.operand_from(src, v, &base)
}

/// `Cast`: `as` semantics for every pair the backend lists; every other pair is Unsupported.
pub fn cast(h: &Harness) {
    let mut cases = elementwise_cases();
    cases.retain(|c| c.label != "odd-1023");
    for src in DType::ALL {
        for dst in DType::ALL {
            if !h.supports(Op::Cast(dst), src) {
                let (input, out) = (h.upload(src, &[0.0; 3]), h.poisoned(dst, 3));
                let kernel = Kernel::Cast {
                    input: input.contiguous(&[3]),
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("cast {src} to {dst}"), &kernel);
                continue;
            }
            for case in &cases {
                cast_case(h, src, dst, case);
            }
        }
    }
    for (src, dst, case) in [
        (
            DType::F32,
            DType::F16,
            Case::one("large", &[LARGE], ViewKind::Contiguous),
        ),
        (
            DType::F32,
            DType::I32,
            Case::one("large", &[LARGE], ViewKind::Contiguous),
        ),
        (
            DType::F32,
            DType::BF16,
            Case::one("large-transposed", &[1025, 1024], ViewKind::Transposed),
        ),
    ] {
        if h.supports(Op::Cast(dst), src) {
            cast_case(h, src, dst, &case);
        }
    }
}

fn cast_case(h: &Harness, src: DType, dst: DType, case: &Case) {
    let input = cast_input(h, src, case.kinds[0], &case.shape);
    let out = h.poisoned(dst, input.values.len());
    let layout = input.layout.clone();
    let out_layout = crate::layout::Layout::contiguous(layout.shape()).expect("small");
    let what = format!("cast {src} to {dst}, {}", case.describe(1));
    let kernel = Kernel::Cast {
        input: input.arg(),
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let want: Vec<f64> = input.values.iter().map(|&v| cast_reference(src, dst, v)).collect();
        h.check(&what, &out, &out_layout, &want, Tolerance::of(dst));
    }
}

/// `Copy`: bit-exact from every input view into contiguous, transposed and narrowed outputs
/// (bytes outside the output view untouched).
pub fn copy(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Copy, dtype) {
            let (input, out) = (h.upload(dtype, &[0.0; 3]), h.poisoned(dtype, 3));
            let kernel = Kernel::Copy {
                input: input.contiguous(&[3]),
                out: out.contiguous(&[3]),
            };
            h.expect_unsupported(&format!("copy {dtype}"), &kernel);
            continue;
        }
        for case in elementwise_cases() {
            for out_kind in [ViewKind::Contiguous, ViewKind::Transposed, ViewKind::Narrowed] {
                if out_kind != ViewKind::Contiguous && view(out_kind, &case.shape).kind == ViewKind::Contiguous {
                    continue;
                }
                copy_case(h, dtype, case.kinds[0], out_kind, &case.shape);
            }
        }
    }
    let large = [
        (DType::U8, ViewKind::Contiguous, ViewKind::Contiguous, vec![LARGE]),
        (DType::F32, ViewKind::Transposed, ViewKind::Contiguous, vec![1025, 1024]),
        (DType::F32, ViewKind::Contiguous, ViewKind::Transposed, vec![1025, 1024]),
        (DType::F16, ViewKind::Broadcast, ViewKind::Contiguous, vec![1025, 1024]),
    ];
    for (dtype, in_kind, out_kind, shape) in large {
        if h.supports(Op::Copy, dtype) {
            copy_case(h, dtype, in_kind, out_kind, &shape);
        }
    }
}

fn copy_case(h: &Harness, dtype: DType, in_kind: ViewKind, out_kind: ViewKind, shape: &[usize]) {
    let size = dtype.size_in_bytes();
    let v = view(in_kind, shape);
    let base = h.random_bits(dtype, v.base_len);
    let input = Operand {
        buf: h.upload_bytes(dtype, &base),
        values: decode(dtype, &base),
        layout: v.layout.clone(),
        kind: v.kind,
    };
    let want: Vec<u8> = offsets(&v.layout)
        .flat_map(|o| base[o * size..(o + 1) * size].iter().copied())
        .collect();
    let (out, out_layout) = h.poisoned_view(dtype, out_kind, shape);
    let what = format!(
        "copy {dtype} {shape:?} from {} into {}",
        v.kind.name(),
        view(out_kind, shape).kind.name()
    );
    let kernel = Kernel::Copy {
        input: input.arg(),
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        h.check_bytes(&what, &out, &out_layout, &want);
    }
}
