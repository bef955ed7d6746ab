//! Accuracy of the vectorisable f32 functions against f64 references (the standard library and
//! libm, rounded once to f32): a sweep of every 2^10-th bit pattern of f32 (both signs, every
//! binade, subnormals, infinities and NaNs included) plus the edges where each function changes
//! formula, under- or overflows; exact special values; and the `Unary` kernel's dense (vector)
//! and strided paths giving these very functions' bits for f32, and f16/bf16 rounding them once.

use cartage_core::{Backend, Element, Kernel, Layout, TensorArg, UnaryOp};

use super::{erf, exp, gelu, ln, sigmoid, silu, softplus, tanh};
use crate::CpuBackend;

/// A position on a line where adjacent f32 are one apart (±0 both at 0).
fn ordinal(x: f32) -> i64 {
    let b = x.to_bits();
    let magnitude = (b & 0x7fff_ffff) as i64;
    if b >> 31 == 1 { -magnitude } else { magnitude }
}

/// The distance in ulp from `got` to `want`: 0 for two NaNs, `u64::MAX` when one is NaN or
/// infinite and the other not the same.
fn ulps(got: f32, want: f32) -> u64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() { 0 } else { u64::MAX };
    }
    if got.is_infinite() || want.is_infinite() {
        return if got == want { 0 } else { u64::MAX };
    }
    (ordinal(got) - ordinal(want)).unsigned_abs()
}

/// A function under test and its f64 reference.
struct Case {
    name: &'static str,
    ours: fn(f32) -> f32,
    reference: fn(f64) -> f64,
    /// Inputs where the function changes formula, under- or overflows.
    edges: &'static [f32],
}

fn sigmoid_f64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu_f64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu_f64(x: f64) -> f64 {
    x * 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

fn softplus_f64(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

const CASES: [Case; 8] = [
    Case {
        name: "exp",
        ours: exp,
        reference: f64::exp,
        edges: &[
            88.72283, 88.7228, 88.72284, 88.8, -87.33654, -87.5, -100.0, -103.2, -103.97, -103.98, 1e-30,
        ],
    },
    Case {
        name: "ln",
        ours: ln,
        reference: f64::ln,
        edges: &[
            1.0,
            0.99999994,
            1.0000001,
            std::f32::consts::FRAC_1_SQRT_2,
            std::f32::consts::SQRT_2,
            f32::MIN_POSITIVE,
            1.1754942e-38,
            1e-45,
            f32::MAX,
        ],
    },
    Case {
        name: "tanh",
        ours: tanh,
        reference: f64::tanh,
        edges: &[0.99999994, 1.0, 1.0000001, 8.6, 9.01, 1e-30, -1e-40],
    },
    Case {
        name: "sigmoid",
        ours: sigmoid,
        reference: sigmoid_f64,
        edges: &[
            -87.3, -88.0, -100.0, -103.9, -104.0, -119.0, -121.0, 16.6, 17.4, 1e-7, -1e-7,
        ],
    },
    Case {
        name: "silu",
        ours: silu,
        reference: silu_f64,
        edges: &[
            -83.0, -87.3, -88.0, -100.0, -104.0, -108.0, -109.0, -110.0, -119.9, -120.1, -1e-40,
        ],
    },
    Case {
        name: "erf",
        ours: erf,
        reference: libm::erf,
        edges: &[0.99999994, 1.0, 1.0000001, 3.91, 3.92, 3.93, 11.0, 1e-40, -1e-40],
    },
    Case {
        name: "gelu",
        ours: gelu,
        reference: gelu_f64,
        edges: &[
            std::f32::consts::SQRT_2,
            -5.0,
            -10.0,
            -13.0,
            -14.0,
            -14.5,
            -15.0,
            -15.6,
            5.3,
            5.5,
            1e-40,
        ],
    },
    Case {
        name: "softplus",
        ours: softplus,
        reference: softplus_f64,
        edges: &[
            19.999998, 20.0, 20.000002, -87.3, -100.0, -103.97, -104.0, -745.0, 1e-30, -1e-30,
        ],
    },
];

/// Every 2^10-th bit pattern (4 million values over both signs and every binade), then the
/// edges: each function within 2 ulp of its reference rounded to f32.
#[test]
fn every_function_is_within_two_ulp_over_the_whole_range() {
    let mut report = Vec::new();
    for case in &CASES {
        let mut worst = (0u64, 0f32);
        let mut check = |x: f32| {
            let want = (case.reference)(x as f64) as f32;
            let d = ulps((case.ours)(x), want);
            if d > worst.0 {
                worst = (d, x);
            }
        };
        // An odd offset, so the sweep meets mantissas of every low-bit pattern, not only zeros.
        for bits in (0x155..=u32::MAX).step_by(1 << 10) {
            check(f32::from_bits(bits));
        }
        for &x in case.edges {
            for x in [x, -x, f32::from_bits(x.to_bits() + 1), f32::from_bits(x.to_bits() - 1)] {
                check(x);
            }
        }
        report.push((case.name, worst));
    }
    let bad: Vec<_> = report.iter().filter(|(_, (d, _))| *d > 2).collect();
    assert!(bad.is_empty(), "over 2 ulp (function, (ulp, at x)): {bad:?}");
}

fn same(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

/// A function's name, the function, and (input, exact output) pairs.
type Specials<'a> = (&'static str, fn(f32) -> f32, &'a [(f32, f32)]);

/// The special values, exactly (signed zeros by their bits).
#[test]
fn special_values_are_exact() {
    let (inf, nan, tiny) = (f32::INFINITY, f32::NAN, f32::from_bits(1));
    #[rustfmt::skip]
    let table: [Specials<'_>; 8] = [
        ("exp", exp, &[(nan, nan), (inf, inf), (-inf, 0.0), (0.0, 1.0), (-0.0, 1.0), (88.8, inf),
            (f32::MAX, inf), (-104.0, 0.0), (f32::MIN, 0.0), (tiny, 1.0), (-tiny, 1.0)]),
        ("ln", ln, &[(nan, nan), (inf, inf), (0.0, -inf), (-0.0, -inf), (-1.0, nan), (-inf, nan),
            (-tiny, nan), (1.0, 0.0)]),
        ("tanh", tanh, &[(nan, nan), (inf, 1.0), (-inf, -1.0), (0.0, 0.0), (-0.0, -0.0), (10.0, 1.0),
            (-10.0, -1.0), (tiny, tiny), (-tiny, -tiny)]),
        ("sigmoid", sigmoid, &[(nan, nan), (inf, 1.0), (-inf, 0.0), (0.0, 0.5), (-0.0, 0.5),
            (20.0, 1.0), (-104.0, 0.0), (f32::MIN, 0.0)]),
        ("silu", silu, &[(nan, nan), (inf, inf), (-inf, nan), (0.0, 0.0), (-0.0, -0.0),
            (f32::MIN, -0.0), (-200.0, -0.0), (100.0, 100.0)]),
        ("erf", erf, &[(nan, nan), (inf, 1.0), (-inf, -1.0), (0.0, 0.0), (-0.0, -0.0), (4.0, 1.0),
            (-4.0, -1.0), (f32::MAX, 1.0)]),
        ("gelu", gelu, &[(nan, nan), (inf, inf), (-inf, nan), (0.0, 0.0), (-0.0, -0.0), (-20.0, -0.0),
            (f32::MIN, -0.0), (10.0, 10.0), (f32::MAX, f32::MAX)]),
        ("softplus", softplus, &[(nan, nan), (inf, inf), (-inf, 0.0), (20.5, 20.5), (f32::MAX, f32::MAX),
            (-200.0, 0.0)]),
    ];
    for (name, f, cases) in table {
        for &(x, want) in cases {
            let got = f(x);
            assert!(same(got, want), "{name}({x:e}) = {got:e}, want {want:e}");
        }
    }
    // The subnormal range is kept, not flushed: e^-100, sigmoid(-100) and silu(-100) are
    // subnormal and nonzero, and ln reads subnormal inputs (2^-149 gives a finite value).
    for (name, v) in [
        ("exp", exp(-100.0)),
        ("sigmoid", sigmoid(-100.0)),
        ("silu", -silu(-100.0)),
    ] {
        assert!(v > 0.0 && !v.is_normal(), "{name}(-100) = {v:e}");
    }
    assert!(ln(tiny).is_finite());
}

/// Upload `data` as a contiguous 1-D tensor.
fn upload<T: Element>(backend: &CpuBackend, data: &[T]) -> TensorArg {
    let bytes = T::to_le_bytes_vec(data);
    let buffer = backend
        .alloc(bytes.len(), std::panic::Location::caller())
        .unwrap()
        .slice();
    // SAFETY: `buffer` is a block of this backend, never freed while the backend lives.
    unsafe { backend.write(buffer, &bytes) }.unwrap();
    TensorArg {
        buffer,
        layout: Layout::contiguous(&[data.len()]).unwrap(),
        dtype: T::DTYPE,
    }
}

/// Run `op` on `input` (through the view `layout`, if given) into a fresh output of `n`
/// elements, and read it back.
fn run<T: Element>(backend: &CpuBackend, op: UnaryOp, input: &TensorArg, layout: Option<Layout>) -> Vec<T> {
    let input = TensorArg {
        layout: layout.unwrap_or_else(|| input.layout.clone()),
        ..input.clone()
    };
    let out = upload(backend, &vec![T::from_f64(0.0); input.layout.numel()]);
    let kernel = Kernel::Unary {
        op,
        input,
        out: out.clone(),
    };
    // SAFETY: both operands are blocks of `backend`, never freed while it lives.
    unsafe { backend.launch(&kernel) }.unwrap();
    let mut bytes = vec![0u8; out.buffer.len()];
    // SAFETY: as above.
    unsafe { backend.read(out.buffer, &mut bytes) }.unwrap();
    T::from_le_bytes_slice(&bytes)
}

/// The unary kernel calls these functions: its dense (vectorised) path, its strided path and an
/// in-place launch give their bits for f32, and f16/bf16 round their f32 result once.
#[test]
fn unary_kernels_give_these_functions_bits() {
    let backend = CpuBackend::new();
    // A dense sample of the interesting range, and the edge values, 20001 elements in all.
    let mut data: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0123).collect();
    data.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-40].iter());
    let n = data.len();
    let x = upload(&backend, &data);
    // The same values at every other element, read through a view of stride 2.
    let spread: Vec<f32> = data.iter().flat_map(|&v| [7.0, v]).collect();
    let spread = upload(&backend, &spread);
    let every_other = Layout::from_parts(&[n], &[2], 1).unwrap();
    let ops = [
        (UnaryOp::Exp, exp as fn(f32) -> f32),
        (UnaryOp::Log, ln),
        (UnaryOp::Tanh, tanh),
        (UnaryOp::Sigmoid, sigmoid),
        (UnaryOp::Silu, silu),
        (UnaryOp::Erf, erf),
        (UnaryOp::Gelu, gelu),
        (UnaryOp::Softplus, softplus),
    ];
    for (op, f) in ops {
        let want: Vec<f32> = data.iter().map(|&v| f(v)).collect();
        let dense = run::<f32>(&backend, op, &x, None);
        let strided = run::<f32>(&backend, op, &spread, Some(every_other.clone()));
        for i in 0..n {
            assert!(
                same(dense[i], want[i]),
                "{op:?}({:e}) dense: {:e}, want {:e}",
                data[i],
                dense[i],
                want[i]
            );
            assert!(
                same(strided[i], want[i]),
                "{op:?}({:e}) strided: {:e}",
                data[i],
                strided[i]
            );
        }
        // In place: the output is the input.
        let inplace = upload(&backend, &data);
        let kernel = Kernel::Unary {
            op,
            input: inplace.clone(),
            out: inplace.clone(),
        };
        // SAFETY: the operand is a block of `backend`, never freed while it lives.
        unsafe { backend.launch(&kernel) }.unwrap();
        let mut bytes = vec![0u8; inplace.buffer.len()];
        // SAFETY: as above.
        unsafe { backend.read(inplace.buffer, &mut bytes) }.unwrap();
        let got = f32::from_le_bytes_slice(&bytes);
        assert!(got.iter().zip(&want).all(|(&g, &w)| same(g, w)), "{op:?} in place");
        // f16 and bf16: widened exactly, computed in f32, rounded once.
        let halves: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
        let got = run::<half::f16>(&backend, op, &upload(&backend, &halves), None);
        for (h, g) in halves.iter().zip(&got) {
            let w = half::f16::from_f32(f(h.to_f32()));
            assert!(same(g.to_f32(), w.to_f32()), "{op:?} f16({h})");
        }
        let brains: Vec<half::bf16> = data.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let got = run::<half::bf16>(&backend, op, &upload(&backend, &brains), None);
        for (h, g) in brains.iter().zip(&got) {
            let w = half::bf16::from_f32(f(h.to_f32()));
            assert!(same(g.to_f32(), w.to_f32()), "{op:?} bf16({h})");
        }
    }
}
