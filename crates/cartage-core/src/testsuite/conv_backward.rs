//! `Conv2dBackwardInput` and `Conv2dBackwardWeight`, optional fused kernels: where the backend
//! lists one for a dtype, every case below is compared with an f64 host reference (the sums of
//! the module docs of `kernel.rs`, in naive loops); every other dtype (all of them on a backend
//! without the kernel) must be refused with `Unsupported`. Malformed kernels give the typed error
//! `Kernel::validate` assigns, on every backend.
//!
//! The cases cover stride (with a remainder: rows no window reads get a zero gradient), padding,
//! dilation, groups (depthwise included), 1×1 and 5×5 windows, an empty batch (a zero weight
//! gradient), and operands read through strided views: channels-last and narrowed inputs and
//! gradients, a gradient one element into its buffer, a gradient broadcast from one value (as
//! `sum().backward()` gives), a broadcast batch, and a permuted weight. The allowed error is one
//! rounding of the result plus a multiple of the sum of `|term|` over the terms of each output,
//! as `Conv2d`'s.

use crate::backend::MatmulPrecision;
use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::kernel::{Kernel, Op, TensorArg};
use crate::layout::Layout;

use super::buffers::{DeviceBuffer, Spec};
use super::harness::Harness;
use super::reference::Tolerance;
use super::views::{View, ViewKind, view};

/// How a 4-D operand (the input or the output gradient) is laid out in its buffer.
#[derive(Clone, Copy, Debug)]
enum Lay {
    Contiguous,
    /// Channels last: a permuted view of a dense `[N, H, W, C]`.
    ChannelsLast,
    /// The last dim cut out of a wider one (an odd row stride).
    Narrowed,
    /// Dense, starting 3 elements into the buffer.
    Offset,
    /// One sample broadcast over the batch (batch stride 0).
    Broadcast,
    /// One value broadcast to the whole shape (every stride 0).
    Scalar,
}

/// One convolution whose two gradients are checked: sizes, window and layouts.
#[derive(Clone, Copy, Debug)]
struct Case {
    input: [usize; 4],
    out_channels: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    /// The input's layout (read by the weight gradient).
    x: Lay,
    /// The output gradient's layout (read by both).
    g: Lay,
    /// The weight as a permuted view of a dense `[O, kh, kw, C/g]` (read by the input gradient).
    w_permuted: bool,
}

impl Case {
    fn output(&self) -> [usize; 4] {
        let size = |i: usize| {
            (self.input[2 + i] + 2 * self.padding[i] - self.dilation[i] * (self.kernel[i] - 1) - 1) / self.stride[i] + 1
        };
        [self.input[0], self.out_channels, size(0), size(1)]
    }

    fn weight(&self) -> [usize; 4] {
        [
            self.out_channels,
            self.input[1] / self.groups,
            self.kernel[0],
            self.kernel[1],
        ]
    }

    fn describe(&self, op: &str, dtype: DType, precision: MatmulPrecision) -> String {
        format!(
            "{op} {dtype} input {:?} ({:?}) weight {:?} (permuted: {}) grad {:?} ({:?}) stride {:?} padding {:?} \
             dilation {:?} groups {}, precision {}",
            self.input,
            self.x,
            self.weight(),
            self.w_permuted,
            self.output(),
            self.g,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            precision.name()
        )
    }
}

fn cases() -> Vec<Case> {
    use Lay::*;
    type Row = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
        Lay,
        Lay,
        bool,
    );
    // (input, out channels, kernel, stride, padding, dilation, groups, input layout, gradient
    // layout, permuted weight)
    #[rustfmt::skip]
    let table: [Row; 13] = [
        ([1, 1, 1, 1], 1, [1, 1], [1, 1], [0, 0], [1, 1], 1, Contiguous, Contiguous, false),
        ([2, 3, 7, 9], 4, [3, 3], [1, 1], [1, 1], [1, 1], 1, Contiguous, Contiguous, false),
        // Stride 2 over an even size: the last row and column are read by no window.
        ([2, 4, 8, 9], 6, [3, 2], [2, 3], [0, 0], [1, 1], 2, ChannelsLast, Narrowed, false),
        // Depthwise, dilated, padded beyond the dilation.
        ([2, 8, 10, 10], 8, [3, 3], [1, 1], [2, 2], [2, 2], 8, Narrowed, ChannelsLast, true),
        ([3, 3, 6, 7], 5, [1, 1], [1, 1], [0, 0], [1, 1], 1, Broadcast, Offset, false),
        // The gradient of `sum()`: one value everywhere.
        ([2, 5, 6, 9], 3, [2, 3], [1, 2], [1, 1], [1, 1], 1, Offset, Scalar, false),
        ([1, 6, 12, 11], 6, [5, 5], [2, 3], [2, 1], [1, 2], 3, Contiguous, Broadcast, true),
        ([0, 4, 5, 5], 2, [3, 3], [1, 1], [1, 1], [1, 1], 1, Contiguous, Contiguous, false),
        // A 1×1 window over a wide plane.
        ([2, 16, 9, 33], 8, [1, 1], [1, 1], [0, 0], [1, 1], 1, ChannelsLast, ChannelsLast, false),
        // ResNet-like blocks, small enough for the host reference: tensor-core algorithms.
        ([2, 64, 14, 14], 64, [3, 3], [1, 1], [1, 1], [1, 1], 1, Contiguous, Contiguous, false),
        ([2, 32, 15, 16], 48, [3, 3], [2, 2], [1, 1], [1, 1], 1, ChannelsLast, ChannelsLast, false),
        ([1, 16, 16, 16], 32, [3, 3], [1, 1], [1, 1], [1, 1], 1, Narrowed, Contiguous, true),
        // Depthwise over channels-last memory.
        ([2, 32, 16, 16], 32, [3, 3], [1, 1], [1, 1], [1, 1], 32, ChannelsLast, ChannelsLast, false),
    ];
    table
        .into_iter()
        .map(
            |(input, out_channels, kernel, stride, padding, dilation, groups, x, g, w_permuted)| Case {
                input,
                out_channels,
                kernel,
                stride,
                padding,
                dilation,
                groups,
                x,
                g,
                w_permuted,
            },
        )
        .collect()
}

fn dense(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("suite shapes are small")
}

/// A view of the 4-D `shape` laid out as `lay`.
fn view4(lay: Lay, shape: [usize; 4]) -> View {
    let [n, c, h, w] = shape;
    match lay {
        Lay::Contiguous => view(ViewKind::Contiguous, &shape),
        Lay::ChannelsLast => View {
            kind: ViewKind::Permuted,
            base_len: n * h * w * c,
            layout: dense(&[n, h, w, c]).permute(&[0, 3, 1, 2]).expect("a permutation"),
        },
        Lay::Narrowed => view(ViewKind::Narrowed, &shape),
        Lay::Offset => view(ViewKind::Offset, &shape),
        Lay::Broadcast => view(ViewKind::Broadcast, &shape),
        Lay::Scalar => view(ViewKind::Scalar, &shape),
    }
}

fn weight_view(permuted: bool, [o, cg, kh, kw]: [usize; 4]) -> View {
    if permuted {
        View {
            kind: ViewKind::Permuted,
            base_len: o * cg * kh * kw,
            layout: dense(&[o, kh, kw, cg]).permute(&[0, 3, 1, 2]).expect("a permutation"),
        }
    } else {
        view(ViewKind::Contiguous, &[o, cg, kh, kw])
    }
}

/// Every term of the convolution: `f(x index, w index, y index)` for each (input position,
/// weight position, output position) that one window tap pairs, all row-major.
fn for_each_term(case: &Case, mut f: impl FnMut(usize, usize, usize)) {
    let [n, c, h, wd] = case.input;
    let [_, o, oh, ow] = case.output();
    let [_, cg, kh, kw] = case.weight();
    let og = o / case.groups;
    for b in 0..n {
        for oc in 0..o {
            let group = oc / og;
            for i in 0..oh {
                for j in 0..ow {
                    let at_y = ((b * o + oc) * oh + i) * ow + j;
                    for ci in 0..cg {
                        let channel = group * cg + ci;
                        for p in 0..kh {
                            let y = (i * case.stride[0] + p * case.dilation[0]) as isize - case.padding[0] as isize;
                            if y < 0 || y >= h as isize {
                                continue;
                            }
                            for q in 0..kw {
                                let x = (j * case.stride[1] + q * case.dilation[1]) as isize - case.padding[1] as isize;
                                if x < 0 || x >= wd as isize {
                                    continue;
                                }
                                let at_x = ((b * c + channel) * h + y as usize) * wd + x as usize;
                                let at_w = ((oc * cg + ci) * kh + p) * kw + q;
                                f(at_x, at_w, at_y);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The f64 input gradient from row-major `g` and `w`, with `Σ|term|` of each element.
fn input_reference(case: &Case, g: &[f64], w: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let len = case.input.iter().product();
    let (mut want, mut scale) = (vec![0.0; len], vec![0.0; len]);
    for_each_term(case, |x, wi, y| {
        let term = g[y] * w[wi];
        want[x] += term;
        scale[x] += term.abs();
    });
    (want, scale)
}

/// The f64 weight gradient from row-major `x` and `g`, with `Σ|term|` of each element.
fn weight_reference(case: &Case, x: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let len = case.weight().iter().product();
    let (mut want, mut scale) = (vec![0.0; len], vec![0.0; len]);
    for_each_term(case, |xi, w, y| {
        let term = g[y] * x[xi];
        want[w] += term;
        scale[w] += term.abs();
    });
    (want, scale)
}

/// The allowed error per unit of `Σ|term|`, on top of one rounding of the result (as
/// `Conv2d`'s).
fn accumulation(dtype: DType, precision: MatmulPrecision) -> f64 {
    match (dtype, precision) {
        (DType::F64, _) => 1e-13,
        // TF32 rounds each input to 10 mantissa bits: a product is off by up to 2·2⁻¹¹.
        (DType::F32, MatmulPrecision::High) => 2e-3,
        (DType::F32, _) => 2e-5,
        (DType::F16, _) => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    }
}

fn input_case(h: &Harness, dtype: DType, case: &Case) {
    let spec = Spec::new((-1.0, 1.0), (-3, 3));
    let gv = view4(case.g, case.output());
    let g = h.operand_from(dtype, gv.clone(), &h.random_values(dtype, gv.base_len, spec));
    let wv = weight_view(case.w_permuted, case.weight());
    let w = h.operand_from(dtype, wv.clone(), &h.random_values(dtype, wv.base_len, spec));
    let out_layout = dense(&case.input);
    let out = h.poisoned(dtype, out_layout.numel());
    let precision = h.backend().matmul_precision();
    let what = case.describe("conv2d_backward_input", dtype, precision);
    let kernel = Kernel::Conv2dBackwardInput {
        grad: g.arg(),
        weight: w.arg(),
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, scale) = input_reference(case, &g.values, &w.values);
        let (tolerance, per_term) = (Tolerance::of(dtype), accumulation(dtype, precision));
        h.check_with(&what, &out, &out_layout, &want, |i, want| {
            tolerance.allowed(want) + per_term * scale[i]
        });
    }
}

fn weight_case(h: &Harness, dtype: DType, case: &Case) {
    let spec = Spec::new((-1.0, 1.0), (-3, 3));
    let xv = view4(case.x, case.input);
    let x = h.operand_from(dtype, xv.clone(), &h.random_values(dtype, xv.base_len, spec));
    let gv = view4(case.g, case.output());
    let g = h.operand_from(dtype, gv.clone(), &h.random_values(dtype, gv.base_len, spec));
    let out_layout = dense(&case.weight());
    let out = h.poisoned(dtype, out_layout.numel());
    let precision = h.backend().matmul_precision();
    let what = case.describe("conv2d_backward_weight", dtype, precision);
    let kernel = Kernel::Conv2dBackwardWeight {
        input: x.arg(),
        grad: g.arg(),
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, scale) = weight_reference(case, &x.values, &g.values);
        let (tolerance, per_term) = (Tolerance::of(dtype), accumulation(dtype, precision));
        h.check_with(&what, &out, &out_layout, &want, |i, want| {
            tolerance.allowed(want) + per_term * scale[i]
        });
    }
}

/// A 1×1 convolution of one element over `a`, `b` and `out` (one element each): the smallest
/// well-formed kernel of each op, to check that an unlisted dtype is refused.
fn tiny(op: Op, a: &DeviceBuffer, b: &DeviceBuffer, out: &DeviceBuffer) -> Kernel {
    let one = [1, 1, 1, 1];
    if op == Op::Conv2dBackwardInput {
        Kernel::Conv2dBackwardInput {
            grad: a.contiguous(&one),
            weight: b.contiguous(&one),
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            out: out.contiguous(&one),
        }
    } else {
        Kernel::Conv2dBackwardWeight {
            input: a.contiguous(&one),
            grad: b.contiguous(&one),
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            out: out.contiguous(&one),
        }
    }
}

/// Both conv2d backward kernels over the case table for every dtype the backend lists; every
/// other dtype must be refused with `Unsupported`; then the malformed kernels.
pub fn conv2d_backward(h: &Harness) {
    for op in [Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight] {
        for dtype in DType::ALL {
            if !h.supports(op, dtype) {
                let (a, b, out) = (h.upload(dtype, &[1.0]), h.upload(dtype, &[1.0]), h.poisoned(dtype, 1));
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &tiny(op, &a, &b, &out));
                continue;
            }
            for case in cases() {
                if op == Op::Conv2dBackwardInput {
                    input_case(h, dtype, &case);
                } else {
                    weight_case(h, dtype, &case);
                }
            }
        }
    }
    malformed(h);
}

/// Malformed conv2d backward kernels over a [2, 4, 5, 5] input, a [6, 2, 3, 3] weight with
/// groups 2, stride 2: the gradient is [2, 6, 2, 2].
fn malformed(h: &Harness) {
    use ErrorKind::*;
    let f = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::Conv2dBackwardInput, d) && h.supports(Op::Conv2dBackwardWeight, d))
        .unwrap_or(DType::F32);
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let (x, w, g) = ([2, 4, 5, 5], [6, 2, 3, 3], [2, 6, 2, 2]);
    let zeros = |dtype, shape: [usize; 4]| h.upload(dtype, &vec![0.0; shape.iter().product()]);
    let (xb, wb, gb) = (zeros(f, x), zeros(f, w), zeros(f, g));
    let (x_out, w_out) = (zeros(f, x), zeros(f, w));
    let (ints, int_out) = (zeros(DType::I32, x), zeros(DType::I32, x));
    let (wide, wrong) = (zeros(other, w), zeros(f, [2, 6, 3, 2]));
    let data = |grad: TensorArg, weight: TensorArg, groups, out: TensorArg| Kernel::Conv2dBackwardInput {
        grad,
        weight,
        stride: [2, 2],
        padding: [0, 0],
        dilation: [1, 1],
        groups,
        out,
    };
    let filter = |input: TensorArg, grad: TensorArg, groups, out: TensorArg| Kernel::Conv2dBackwardWeight {
        input,
        grad,
        stride: [2, 2],
        padding: [0, 0],
        dilation: [1, 1],
        groups,
        out,
    };
    let transposed = dense(&[2, 4, 5, 5]).transpose(2, 3).expect("rank 4");
    let cases = [
        (
            "input gradient from a gradient with 3 rows where the window gives 2",
            data(
                wrong.contiguous(&[2, 6, 3, 2]),
                wb.contiguous(&w),
                2,
                x_out.contiguous(&x),
            ),
            ShapeMismatch,
        ),
        (
            "input gradient with groups 4 for a weight of 2 channels per group",
            data(gb.contiguous(&g), wb.contiguous(&w), 4, x_out.contiguous(&x)),
            ShapeMismatch,
        ),
        (
            "input gradient into a transposed output",
            data(gb.contiguous(&g), wb.contiguous(&w), 2, x_out.arg(&transposed)),
            InvalidArgument,
        ),
        (
            "input gradient written over the weight it reads",
            data(gb.contiguous(&g), xb.contiguous(&w), 2, xb.contiguous(&x)),
            InvalidArgument,
        ),
        (
            "input gradient with groups 0",
            data(gb.contiguous(&g), wb.contiguous(&w), 0, x_out.contiguous(&x)),
            InvalidArgument,
        ),
        (
            "input gradient in i32",
            data(
                ints.contiguous(&g),
                ints.contiguous(&[6, 2, 1, 1]),
                2,
                int_out.contiguous(&[2, 4, 3, 3]),
            ),
            WrongDType,
        ),
        (
            "weight gradient into another dtype",
            filter(xb.contiguous(&x), gb.contiguous(&g), 2, wide.contiguous(&w)),
            InvalidArgument,
        ),
        (
            "weight gradient into a [6, 2, 1, 3] output (a 1-row window gives 3 output rows)",
            filter(xb.contiguous(&x), gb.contiguous(&g), 2, w_out.contiguous(&[6, 2, 1, 3])),
            ShapeMismatch,
        ),
        (
            "weight gradient written over the input it reads",
            filter(xb.contiguous(&x), gb.contiguous(&g), 2, xb.contiguous(&w)),
            InvalidArgument,
        ),
        (
            "weight gradient with stride 0",
            Kernel::Conv2dBackwardWeight {
                input: xb.contiguous(&x),
                grad: gb.contiguous(&g),
                stride: [0, 2],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 2,
                out: w_out.contiguous(&w),
            },
            InvalidArgument,
        ),
    ];
    for (what, kernel, kind) in cases {
        h.expect_refused(what, &kernel, kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_channel(input: [usize; 4], kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Case {
        Case {
            input,
            out_channels: 1,
            kernel,
            stride,
            padding,
            dilation: [1, 1],
            groups: 1,
            x: Lay::Contiguous,
            g: Lay::Contiguous,
            w_permuted: false,
        }
    }

    /// The references on cases worked by hand.
    #[test]
    fn references_match_hand_computed_gradients() {
        // A 2×2 all-ones window over a 2×2 plane with padding 1 gives a 3×3 output; with a
        // gradient of ones every input element is read by 4 windows, and each tap sums the
        // input elements it ever read: here all four, 1 + 2 + 3 + 4.
        let case = one_channel([1, 1, 2, 2], [2, 2], [1, 1], [1, 1]);
        let (gx, scale) = input_reference(&case, &[1.0; 9], &[1.0; 4]);
        assert_eq!(gx, vec![4.0; 4]);
        assert_eq!(scale, gx);
        let (gw, _) = weight_reference(&case, &[1.0, 2.0, 3.0, 4.0], &[1.0; 9]);
        assert_eq!(gw, vec![10.0; 4]);
        // Stride 2 over a 1×3 row with a 1×1 window reads columns 0 and 2: column 1 gets 0.
        let strided = one_channel([1, 1, 1, 3], [1, 1], [1, 2], [0, 0]);
        let (gx, _) = input_reference(&strided, &[5.0, 7.0], &[2.0]);
        assert_eq!(gx, vec![10.0, 0.0, 14.0]);
        let (gw, _) = weight_reference(&strided, &[1.0, 100.0, 3.0], &[5.0, 7.0]);
        assert_eq!(gw, vec![5.0 + 21.0]);
        // Depthwise: each channel's weight sees only its own input channel.
        let depthwise = Case {
            input: [1, 2, 1, 1],
            out_channels: 2,
            groups: 2,
            ..one_channel([1, 2, 1, 1], [1, 1], [1, 1], [0, 0])
        };
        let (gx, _) = input_reference(&depthwise, &[3.0, 5.0], &[2.0, -1.0]);
        assert_eq!(gx, vec![6.0, -5.0]);
        let (gw, _) = weight_reference(&depthwise, &[3.0, 5.0], &[2.0, -1.0]);
        assert_eq!(gw, vec![6.0, -5.0]);
    }

    #[test]
    fn views_have_the_case_shapes_and_every_case_is_valid() {
        for case in cases() {
            assert_eq!(view4(case.x, case.input).layout.shape(), case.input);
            assert_eq!(view4(case.g, case.output()).layout.shape(), case.output());
            assert_eq!(
                weight_view(case.w_permuted, case.weight()).layout.shape(),
                case.weight()
            );
            let size = |i: usize| {
                crate::conv_out_size(
                    case.input[2 + i],
                    case.kernel[i],
                    case.stride[i],
                    case.padding[i],
                    case.dilation[i],
                )
            };
            assert_eq!(
                [Some(case.output()[2]), Some(case.output()[3])],
                [size(0), size(1)],
                "{case:?}"
            );
        }
    }
}
