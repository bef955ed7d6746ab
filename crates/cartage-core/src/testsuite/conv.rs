//! `Conv2d`, an optional fused kernel: where the backend lists `Op::Conv2d` for a dtype, every
//! case below is compared with an f64 host reference (naive loops); every other dtype (all of
//! them on a backend without the kernel) must be refused with `Unsupported`.
//!
//! The cases cover stride, padding, dilation, groups (depthwise included), 1×1 and 5×5 windows,
//! an empty batch, and inputs read through strided views (NHWC-backed, narrowed to an odd row
//! stride, a broadcast batch, a start one element into the buffer) and a permuted weight. The allowed error is one rounding of the
//! result plus a multiple of `Σ|x·w|` over the window: `dtype`'s epsilon for f16 and bf16
//! (fast algorithms may round their transforms in the storage type), TF32's when the device's
//! matmul precision is `High`, and a few f32 roundings otherwise.

use crate::backend::MatmulPrecision;
use crate::dtype::DType;
use crate::kernel::{Kernel, Op};
use crate::layout::Layout;

use super::buffers::Spec;
use super::harness::Harness;
use super::reference::Tolerance;
use super::views::{View, ViewKind};

/// How the input [N, C, H, W] is laid out in its buffer.
#[derive(Clone, Copy, Debug)]
enum InputLayout {
    Contiguous,
    /// Channels last: a permuted view of a dense [N, H, W, C].
    Nhwc,
    /// Columns 8..8+W of a dense [N, C, H, W + 11]: an odd row stride from a 16-byte aligned
    /// start.
    Narrowed,
    /// A dense [N, C, H, W] one element into its buffer (a start no vector load can use).
    Shifted,
    /// One sample broadcast over the batch (batch stride 0).
    Broadcast,
}

/// How the weight [O, C/g, kh, kw] is laid out in its buffer.
#[derive(Clone, Copy, Debug)]
enum WeightLayout {
    Contiguous,
    /// A permuted view of a dense [O, kh, kw, C/g].
    Permuted,
}

/// One convolution: sizes, window and layouts.
#[derive(Clone, Copy, Debug)]
struct Case {
    input: [usize; 4],
    out_channels: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    x_layout: InputLayout,
    w_layout: WeightLayout,
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
}

fn cases() -> Vec<Case> {
    use InputLayout as X;
    use WeightLayout as W;
    type Row = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
        X,
        W,
    );
    // (input, out channels, kernel, stride, padding, dilation, groups, input layout, weight layout)
    #[rustfmt::skip]
    let table: [Row; 12] = [
        ([1, 1, 1, 1], 1, [1, 1], [1, 1], [0, 0], [1, 1], 1, X::Contiguous, W::Contiguous),
        ([2, 3, 7, 9], 4, [3, 3], [1, 1], [1, 1], [1, 1], 1, X::Contiguous, W::Contiguous),
        ([2, 4, 9, 8], 6, [3, 2], [2, 1], [1, 0], [1, 1], 2, X::Nhwc, W::Contiguous),
        // Depthwise, dilated, padded beyond the dilation.
        ([2, 8, 10, 10], 8, [3, 3], [1, 1], [2, 2], [2, 2], 8, X::Narrowed, W::Permuted),
        ([3, 3, 6, 7], 5, [1, 1], [1, 1], [0, 0], [1, 1], 1, X::Broadcast, W::Contiguous),
        ([2, 5, 6, 9], 3, [2, 3], [1, 2], [1, 1], [1, 1], 1, X::Shifted, W::Contiguous),
        ([1, 6, 12, 11], 6, [5, 5], [2, 3], [2, 1], [1, 2], 3, X::Contiguous, W::Permuted),
        ([0, 4, 5, 5], 2, [3, 3], [1, 1], [1, 1], [1, 1], 1, X::Contiguous, W::Contiguous),
        // ResNet-like blocks, small enough for the host reference: tensor-core algorithms.
        ([2, 64, 14, 14], 64, [3, 3], [1, 1], [1, 1], [1, 1], 1, X::Contiguous, W::Contiguous),
        ([2, 32, 15, 16], 48, [3, 3], [2, 2], [1, 1], [1, 1], 1, X::Nhwc, W::Contiguous),
        ([1, 16, 16, 16], 32, [3, 3], [1, 1], [1, 1], [1, 1], 1, X::Narrowed, W::Permuted),
        // Depthwise over channels-last memory.
        ([2, 32, 16, 16], 32, [3, 3], [1, 1], [1, 1], [1, 1], 32, X::Nhwc, W::Contiguous),
    ];
    table
        .into_iter()
        .map(
            |(input, out_channels, kernel, stride, padding, dilation, groups, x_layout, w_layout)| Case {
                input,
                out_channels,
                kernel,
                stride,
                padding,
                dilation,
                groups,
                x_layout,
                w_layout,
            },
        )
        .collect()
}

fn dense(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("suite shapes are small")
}

fn input_view(layout: InputLayout, [n, c, h, w]: [usize; 4]) -> View {
    let (kind, base_len, layout) = match layout {
        InputLayout::Contiguous => (ViewKind::Contiguous, n * c * h * w, dense(&[n, c, h, w])),
        InputLayout::Nhwc => (
            ViewKind::Permuted,
            n * h * w * c,
            dense(&[n, h, w, c]).permute(&[0, 3, 1, 2]).expect("a permutation"),
        ),
        InputLayout::Narrowed => (
            ViewKind::Narrowed,
            n * c * h * (w + 11),
            dense(&[n, c, h, w + 11]).narrow(3, 8, w).expect("fits"),
        ),
        InputLayout::Shifted => (
            ViewKind::Offset,
            n * c * h * w + 1,
            Layout::from_parts(&[n, c, h, w], dense(&[n, c, h, w]).strides(), 1).expect("small"),
        ),
        InputLayout::Broadcast => (
            ViewKind::Broadcast,
            c * h * w,
            dense(&[1, c, h, w]).broadcast_to(&[n, c, h, w]).expect("broadcastable"),
        ),
    };
    View { kind, base_len, layout }
}

fn weight_view(layout: WeightLayout, [o, cg, kh, kw]: [usize; 4]) -> View {
    let numel = o * cg * kh * kw;
    match layout {
        WeightLayout::Contiguous => View {
            kind: ViewKind::Contiguous,
            base_len: numel,
            layout: dense(&[o, cg, kh, kw]),
        },
        WeightLayout::Permuted => View {
            kind: ViewKind::Permuted,
            base_len: numel,
            layout: dense(&[o, kh, kw, cg]).permute(&[0, 3, 1, 2]).expect("a permutation"),
        },
    }
}

/// The f64 convolution of row-major `x` [N, C, H, W] and `w` [O, C/g, kh, kw], with `Σ|x·w|`
/// of each output (the scale of its rounding error).
fn reference(case: &Case, x: &[f64], w: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let [n, c, h, wd] = case.input;
    let [_, o, oh, ow] = case.output();
    let [_, cg, kh, kw] = case.weight();
    let og = o / case.groups;
    let mut want = vec![0.0; n * o * oh * ow];
    let mut scale = vec![0.0; want.len()];
    for b in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for i in 0..oh {
                for j in 0..ow {
                    let (mut sum, mut abs) = (0.0, 0.0);
                    for ci in 0..cg {
                        let channel = g * cg + ci;
                        for p in 0..kh {
                            let y = (i * case.stride[0] + p * case.dilation[0]) as isize - case.padding[0] as isize;
                            if y < 0 || y >= h as isize {
                                continue;
                            }
                            for q in 0..kw {
                                let xx =
                                    (j * case.stride[1] + q * case.dilation[1]) as isize - case.padding[1] as isize;
                                if xx < 0 || xx >= wd as isize {
                                    continue;
                                }
                                let xv = x[((b * c + channel) * h + y as usize) * wd + xx as usize];
                                let wv = w[((oc * cg + ci) * kh + p) * kw + q];
                                sum += xv * wv;
                                abs += (xv * wv).abs();
                            }
                        }
                    }
                    let at = ((b * o + oc) * oh + i) * ow + j;
                    want[at] = sum;
                    scale[at] = abs;
                }
            }
        }
    }
    (want, scale)
}

/// The allowed error per unit of `Σ|x·w|`, on top of one rounding of the result.
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

fn conv_case(h: &Harness, dtype: DType, case: &Case) {
    let spec = Spec::new((-1.0, 1.0), (-3, 3));
    let xv = input_view(case.x_layout, case.input);
    let x_base = h.random_values(dtype, xv.base_len, spec);
    let x = h.operand_from(dtype, xv, &x_base);
    let wv = weight_view(case.w_layout, case.weight());
    let w_base = h.random_values(dtype, wv.base_len, spec);
    let w = h.operand_from(dtype, wv, &w_base);
    let out_layout = dense(&case.output());
    let out = h.poisoned(dtype, out_layout.numel());
    let precision = h.backend().matmul_precision();
    let what = format!(
        "conv2d {dtype} input {:?} ({:?}) weight {:?} ({:?}) stride {:?} padding {:?} dilation {:?} groups {}, precision {}",
        case.input,
        case.x_layout,
        case.weight(),
        case.w_layout,
        case.stride,
        case.padding,
        case.dilation,
        case.groups,
        precision.name()
    );
    let kernel = Kernel::Conv2d {
        input: x.arg(),
        weight: w.arg(),
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, scale) = reference(case, &x.values, &w.values);
        let (tolerance, per_term) = (Tolerance::of(dtype), accumulation(dtype, precision));
        h.check_with(&what, &out, &out_layout, &want, |i, want| {
            tolerance.allowed(want) + per_term * scale[i]
        });
    }
}

/// `Conv2d` over the case table for every dtype the backend lists; every other dtype must be
/// refused with `Unsupported`.
pub fn conv2d(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Conv2d, dtype) {
            let (x, out) = (h.upload(dtype, &[1.0]), h.poisoned(dtype, 1));
            let kernel = Kernel::Conv2d {
                input: x.contiguous(&[1, 1, 1, 1]),
                weight: x.contiguous(&[1, 1, 1, 1]),
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 1,
                out: out.contiguous(&[1, 1, 1, 1]),
            };
            h.expect_unsupported(&format!("conv2d {dtype}"), &kernel);
            continue;
        }
        for case in cases() {
            conv_case(h, dtype, &case);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference itself, on a case worked by hand: a 2×2 all-ones window over [[1, 2], [3, 4]]
    /// with padding 1 sums each 2×2 neighbourhood.
    #[test]
    fn reference_matches_a_hand_computed_convolution() {
        let case = Case {
            input: [1, 1, 2, 2],
            out_channels: 1,
            kernel: [2, 2],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            x_layout: InputLayout::Contiguous,
            w_layout: WeightLayout::Contiguous,
        };
        let (want, scale) = reference(&case, &[1.0, 2.0, 3.0, 4.0], &[1.0; 4]);
        assert_eq!(want, vec![1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0]);
        assert_eq!(scale, want);
        // Depthwise: each output channel sees only its own input channel.
        let depthwise = Case {
            input: [1, 2, 1, 1],
            out_channels: 2,
            kernel: [1, 1],
            padding: [0, 0],
            groups: 2,
            ..case
        };
        let (want, _) = reference(&depthwise, &[3.0, 5.0], &[2.0, -1.0]);
        assert_eq!(want, vec![6.0, -5.0]);
    }

    #[test]
    fn views_have_the_case_shapes() {
        for case in cases() {
            let x = input_view(case.x_layout, case.input);
            assert_eq!(x.layout.shape(), case.input);
            let w = weight_view(case.w_layout, case.weight());
            assert_eq!(w.layout.shape(), case.weight());
        }
    }
}
