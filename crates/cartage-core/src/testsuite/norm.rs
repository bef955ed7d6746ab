//! `Norm` (layer norm, RMS norm over the last dim): every float dtype the backend lists, rows of
//! 1, 7, 4096 and 32768, strided, offset and broadcast inputs, without affine parameters, with a
//! weight, and with a weight and a bias (contiguous, strided, stride 0), several eps, into
//! strided output views; f16/bf16 are computed in f32, so their tolerance is one rounding of the
//! result on top of the row statistics' error.

use crate::dtype::DType;
use crate::kernel::{Kernel, NormKind, Op};

use super::harness::Harness;
use super::reference_model;
use super::views::{Line, ViewKind, view};
use super::{Operand, Spec};

fn line_operand(h: &Harness, dtype: DType, line: Line, n: usize, spec: Spec) -> Operand {
    let v = line.view(n);
    let base = h.random_values(dtype, v.base_len, spec);
    h.operand_from(dtype, v, &base)
}

/// Which affine parameters a norm case passes, and how they are laid out.
#[derive(Clone, Copy, Debug)]
enum Affine {
    None,
    Weight(Line),
    WeightBias(Line, Line),
}

#[allow(clippy::too_many_arguments)]
fn norm_case(
    h: &Harness,
    kind: NormKind,
    dtype: DType,
    shape: &[usize],
    input_kind: ViewKind,
    out_kind: ViewKind,
    affine: Affine,
    eps: f64,
    spec: Spec,
) {
    let n = *shape.last().expect("rank ≥ 1");
    let input = h.operand(dtype, input_kind, shape, spec);
    let weight_spec = Spec::new((0.5, 1.5), (1, 3)).signed();
    let (weight, bias) = match affine {
        Affine::None => (None, None),
        Affine::Weight(w) => (Some(line_operand(h, dtype, w, n, weight_spec)), None),
        Affine::WeightBias(w, b) => (
            Some(line_operand(h, dtype, w, n, weight_spec)),
            Some(line_operand(h, dtype, b, n, Spec::standard())),
        ),
    };
    let out_view = view(out_kind, shape);
    let (out, out_layout) = (h.poisoned(dtype, out_view.base_len), out_view.layout.clone());
    let what = format!(
        "{} {dtype} {shape:?} ({} into {}) {} eps {eps}",
        kind.name(),
        input.kind.name(),
        out_view.kind.name(),
        match affine {
            Affine::None => "without weight".to_string(),
            Affine::Weight(w) => format!("weight ({})", w.name()),
            Affine::WeightBias(w, b) => format!("weight ({}) and bias ({})", w.name(), b.name()),
        }
    );
    let kernel = Kernel::Norm {
        kind,
        input: input.arg(),
        weight: weight.as_ref().map(Operand::arg),
        bias: bias.as_ref().map(Operand::arg),
        eps,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, allowed) = reference_model::norm(
            kind,
            dtype,
            shape,
            &input.values,
            weight.as_ref().map(|w| w.values.as_slice()),
            bias.as_ref().map(|b| b.values.as_slice()),
            eps,
        );
        h.check_with(&what, &out, &out_layout, &want, |i, _| allowed[i]);
    }
}

/// `Norm`: both kinds × every dtype the backend lists over the case table, each case without
/// affine parameters, with a weight, and (layer norm) with a weight and a bias.
pub fn norm(h: &Harness) {
    use ViewKind::*;
    let standard = Spec::standard();
    // (shape, input view, output view, eps, values)
    let cases: Vec<(Vec<usize>, ViewKind, ViewKind, f64, Spec)> = vec![
        (vec![3, 7], Contiguous, Contiguous, 1e-5, standard),
        (vec![5, 1], Contiguous, Contiguous, 1e-5, standard),
        (vec![7], Contiguous, Offset, 0.1, standard),
        (vec![0, 7], Contiguous, Contiguous, 1e-5, standard),
        (vec![4, 9], Transposed, Narrowed, 1e-5, standard),
        (vec![3, 4, 5], Permuted, Transposed, 1e-5, standard),
        (vec![6, 7], Narrowed, Offset, 0.5, standard),
        (vec![5, 7], Broadcast, Contiguous, 1e-5, standard),
        (vec![2, 33], Offset, Transposed, 1e-5, standard),
        (
            vec![4, 1000],
            Contiguous,
            Contiguous,
            1e-6,
            Spec::new((10.0, 14.0), (0, 0)),
        ),
        (vec![3, 4096], Contiguous, Narrowed, 1e-5, standard),
    ];
    let lines = [
        Line::Kind(Contiguous),
        Line::Stride2,
        Line::Kind(Scalar),
        Line::Kind(Offset),
    ];
    for kind in [NormKind::Layer, NormKind::Rms] {
        for dtype in DType::ALL {
            if !h.supports(Op::Norm(kind), dtype) {
                let (input, out) = (h.upload(dtype, &[1.0; 3]), h.poisoned(dtype, 3));
                let kernel = Kernel::Norm {
                    kind,
                    input: input.contiguous(&[3]),
                    weight: None,
                    bias: None,
                    eps: 1e-5,
                    out: out.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", kind.name()), &kernel);
                continue;
            }
            for (c, (shape, input_kind, out_kind, eps, spec)) in cases.iter().enumerate() {
                let (w, b) = (lines[c % lines.len()], lines[(c + 1) % lines.len()]);
                let mut affines = vec![Affine::None, Affine::Weight(w)];
                if kind == NormKind::Layer {
                    affines.push(Affine::WeightBias(w, b));
                }
                for affine in affines {
                    norm_case(h, kind, dtype, shape, *input_kind, *out_kind, affine, *eps, *spec);
                }
            }
            // Long rows: 32768 elements.
            let affine = match kind {
                NormKind::Layer => Affine::WeightBias(Line::Kind(Contiguous), Line::Kind(Contiguous)),
                NormKind::Rms => Affine::Weight(Line::Kind(Contiguous)),
            };
            norm_case(
                h,
                kind,
                dtype,
                &[2, 32768],
                Contiguous,
                Contiguous,
                affine,
                1e-5,
                standard,
            );
        }
    }
}
