//! `Linear` (the optional fused kernel): where a backend lists it for a dtype, `act(input ·
//! weightᵀ + bias)` against an f64 reference for every [`Epilogue`], with and without a bias;
//! contiguous, transposed, narrowed and offset inputs and weights (the weight contiguous [N, K]
//! as `nn.Linear` stores it, or a transposed [K, N] buffer); a bias that is dense, strided
//! (stride 2) or broadcast (stride 0); one row (a GEMV), odd sizes and `K = 0` (the bias alone).
//! Dtypes not listed are refused with `Unsupported`.

use crate::backend::MatmulPrecision;
use crate::dtype::DType;
use crate::epilogue::Epilogue;
use crate::kernel::{Kernel, Op};
use crate::layout::Layout;

use super::buffers::Spec;
use super::harness::Harness;
use super::reference::{Tolerance, accumulation_eps, erf};
use super::views::{Line, ViewKind};

/// One case: sizes, the input's and weight's views, the bias's layout (`None`: no bias).
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    input: ViewKind,
    weight: ViewKind,
    bias: Option<Line>,
}

/// The activation of `x` in f64.
pub fn activate(activation: Epilogue, x: f64) -> f64 {
    match activation {
        Epilogue::Identity => x,
        Epilogue::Relu if x.is_nan() => x,
        Epilogue::Relu => x.max(0.0),
        Epilogue::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        Epilogue::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// Relative error of one accumulation step at the device's precision (TF32 for f32 under
/// `High`, as `Matmul`).
fn accumulation(dtype: DType, precision: MatmulPrecision) -> f64 {
    match (dtype, precision) {
        (DType::F32, MatmulPrecision::High) => 2e-3,
        _ => accumulation_eps(dtype),
    }
}

/// Unit roundoff of `dtype`'s storage (the product may be rounded once before the epilogue).
fn roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

fn linear_case(h: &Harness, dtype: DType, activation: Epilogue, c: Case) {
    let spec = Spec::new((-1.0, 1.0), (-3, 3));
    let input = h.operand(dtype, c.input, &[c.m, c.k], spec);
    let weight = h.operand(dtype, c.weight, &[c.n, c.k], spec);
    let bias = c.bias.map(|line| {
        let v = line.view(c.n);
        let base = h.random_values(dtype, v.base_len, spec);
        h.operand_from(dtype, v, &base)
    });
    let out_layout = Layout::contiguous(&[c.m, c.n]).expect("small");
    let out = h.poisoned(dtype, out_layout.numel());
    let precision = h.backend().matmul_precision();
    let what = format!(
        "linear {dtype} {} [{}, {}] ({}) × [{}, {}]ᵀ ({}), bias {}, precision {}",
        activation.name(),
        c.m,
        c.k,
        input.kind.name(),
        c.n,
        c.k,
        weight.kind.name(),
        match c.bias {
            None => "none".to_string(),
            Some(Line::Kind(kind)) => kind.name().to_string(),
            Some(Line::Stride2) => "stride 2".to_string(),
        },
        precision.name()
    );
    let kernel = Kernel::Linear {
        input: input.arg(),
        weight: weight.arg(),
        bias: bias.as_ref().map(|b| b.arg()),
        activation,
        out: out.arg(&out_layout),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let (eps, u) = (accumulation(dtype, precision), roundoff(dtype));
    let mut want = vec![0.0; c.m * c.n];
    let mut allowed = vec![0.0; c.m * c.n];
    for i in 0..c.m {
        for j in 0..c.n {
            let (mut sum, mut squares) = (0.0, 0.0);
            for p in 0..c.k {
                let prod = input.values[i * c.k + p] * weight.values[j * c.k + p];
                sum += prod;
                squares += prod * prod;
            }
            let b = bias.as_ref().map_or(0.0, |b| b.values[j]);
            let pre = sum + b;
            let y = activate(activation, pre);
            // The product's accumulation error, one rounding of the product and of the bias sum
            // before the epilogue, carried through an activation whose slope is at most 1.13;
            // a fused tanh may be the hardware approximation (relative 2^-11).
            let before = 4.0 * eps * (c.k as f64).sqrt() * squares.sqrt() + u * (sum.abs() + pre.abs());
            let tanh = if activation == Epilogue::GeluTanh {
                2f64.powi(-11) * 0.5 * pre.abs()
            } else {
                0.0
            };
            want[i * c.n + j] = y;
            allowed[i * c.n + j] = Tolerance::transcendental(dtype).allowed(y) + 1.13 * before + tanh;
        }
    }
    h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
}

/// `Linear`: every listed dtype over the case table and every activation; the others refused.
pub fn linear(h: &Harness) {
    use ViewKind::*;
    let dense = Some(Line::Kind(Contiguous));
    let case = |m, k, n, input, weight, bias| Case {
        m,
        k,
        n,
        input,
        weight,
        bias,
    };
    let cases = [
        case(1, 1, 1, Contiguous, Contiguous, dense),
        case(1, 64, 48, Contiguous, Contiguous, dense),
        case(7, 33, 5, Contiguous, Contiguous, dense),
        case(16, 17, 9, Contiguous, Contiguous, None),
        case(16, 17, 9, Transposed, Contiguous, dense),
        case(16, 17, 9, Contiguous, Transposed, dense),
        case(16, 17, 9, Transposed, Transposed, Some(Line::Stride2)),
        case(9, 8, 7, Narrowed, Offset, Some(Line::Kind(Offset))),
        case(5, 6, 7, Offset, Narrowed, Some(Line::Kind(Scalar))),
        case(4, 0, 3, Contiguous, Contiguous, dense),
        case(0, 4, 3, Contiguous, Contiguous, dense),
        case(65, 128, 96, Contiguous, Contiguous, dense),
    ];
    for dtype in DType::ALL {
        if !h.supports(Op::Linear, dtype) {
            let (a, out) = (h.upload(dtype, &[1.0; 4]), h.poisoned(dtype, 4));
            let kernel = Kernel::Linear {
                input: a.contiguous(&[2, 2]),
                weight: a.contiguous(&[2, 2]),
                bias: None,
                activation: Epilogue::Identity,
                out: out.contiguous(&[2, 2]),
            };
            h.expect_unsupported(&format!("linear {dtype}"), &kernel);
            continue;
        }
        for activation in Epilogue::ALL {
            for c in cases {
                linear_case(h, dtype, activation, c);
            }
        }
    }
}
