//! cuDNN convolutions with the algorithm search on and off: the forward pass and both gradients
//! against a float64 reference on the host, in f32 and bf16, for a plain 3×3 convolution and
//! with stride 2, channel groups and dilation 2; then the algorithm report
//! (`CudaBackend::conv_algorithms`) names a searched algorithm for every pass with the search
//! on and a heuristic one with it off (a legacy algorithm or a graph engine, whichever API the
//! automatic choice took).
//!
//! Without a CUDA device every test prints a SKIP line (`CARTAGE_REQUIRE=cuda` makes it fail);
//! without cuDNN (conv2d not listed) the test says so and returns.

mod common;

use cartage_core::{DType, Kernel, Op};
use cartage_cuda::{ConvAlgorithmChoice, ConvApi, ConvPass};
use common::{arg, backend, download, poisoned, upload, values};

/// One convolution: input [N, C, H, W], weight [O, C / groups, kh, kw] and its window.
#[derive(Clone, Copy, Debug)]
struct Shape {
    input: [usize; 4],
    weight: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Shape {
    fn output(&self) -> [usize; 4] {
        let [n, _, h, w] = self.input;
        let [o, _, kh, kw] = self.weight;
        let size = |x: usize, k: usize, i: usize| {
            (x + 2 * self.padding[i] - self.dilation[i] * (k - 1) - 1) / self.stride[i] + 1
        };
        [n, o, size(h, kh, 0), size(w, kw, 1)]
    }
}

fn numel(s: [usize; 4]) -> usize {
    s.iter().product()
}

/// The forward output, the input gradient and the weight gradient (for output gradient `dy`)
/// in float64, by direct summation.
fn reference(s: &Shape, x: &[f64], w: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [n, c, h, wd] = s.input;
    let [o, cg, kh, kw] = s.weight;
    let [_, _, oh, ow] = s.output();
    let og = o / s.groups;
    let (mut y, mut dx, mut dw) = (
        vec![0.0; numel(s.output())],
        vec![0.0; numel(s.input)],
        vec![0.0; numel(s.weight)],
    );
    for b in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let yi = ((b * o + oc) * oh + oy) * ow + ox;
                    for ic in 0..cg {
                        let ci = g * cg + ic;
                        for ky in 0..kh {
                            let iy = (oy * s.stride[0] + ky * s.dilation[0]) as isize - s.padding[0] as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for kx in 0..kw {
                                let ix = (ox * s.stride[1] + kx * s.dilation[1]) as isize - s.padding[1] as isize;
                                if ix < 0 || ix >= wd as isize {
                                    continue;
                                }
                                let xi = ((b * c + ci) * h + iy as usize) * wd + ix as usize;
                                let wi = ((oc * cg + ic) * kh + ky) * kw + kx;
                                y[yi] += x[xi] * w[wi];
                                dx[xi] += dy[yi] * w[wi];
                                dw[wi] += dy[yi] * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    (y, dx, dw)
}

/// Every element within `tol` of the reference, relative to the reference's largest magnitude.
fn check(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = 1.0 + want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: element {i}: got {g}, want {w} (scale {scale})"
        );
    }
}

const SHAPES: [Shape; 4] = [
    // A plain 3×3 convolution with channel counts tensor cores take.
    Shape {
        input: [2, 32, 16, 16],
        weight: [32, 32, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    },
    Shape {
        input: [2, 8, 13, 13],
        weight: [16, 8, 3, 3],
        stride: [2, 2],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    },
    Shape {
        input: [2, 16, 10, 10],
        weight: [16, 8, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 2,
    },
    Shape {
        input: [2, 8, 12, 12],
        weight: [8, 8, 3, 3],
        stride: [1, 1],
        padding: [2, 2],
        dilation: [2, 2],
        groups: 1,
    },
];

/// Run the three passes of `s` in `dtype` and compare them with the reference.
fn run_passes(b: &std::sync::Arc<dyn cartage_core::Backend>, s: &Shape, dtype: DType, setting: &str) {
    let out_shape = s.output();
    let x = values(numel(s.input), 1, dtype);
    let w: Vec<f64> = values(numel(s.weight), 2, dtype)
        .iter()
        .map(|v| common::round(v / 8.0, dtype))
        .collect();
    let dy = values(numel(out_shape), 3, dtype);
    let (want_y, want_dx, want_dw) = reference(s, &x, &w, &dy);
    let (xb, wb, dyb) = (upload(b, &x, dtype), upload(b, &w, dtype), upload(b, &dy, dtype));
    let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-4 };
    let what = |pass: &str| format!("{pass} {dtype} {s:?} with the search {setting}");

    let y = poisoned(b, numel(out_shape), dtype);
    Kernel::Conv2d {
        input: arg(&xb, &s.input, dtype),
        weight: arg(&wb, &s.weight, dtype),
        stride: s.stride,
        padding: s.padding,
        dilation: s.dilation,
        groups: s.groups,
        out: arg(&y, &out_shape, dtype),
    }
    .run(&[&xb, &wb, &y])
    .unwrap_or_else(|e| panic!("{}: {e}", what("conv2d")));
    check(&what("conv2d"), &download(&y, numel(out_shape), dtype), &want_y, tol);

    let dx = poisoned(b, numel(s.input), dtype);
    Kernel::Conv2dBackwardInput {
        grad: arg(&dyb, &out_shape, dtype),
        weight: arg(&wb, &s.weight, dtype),
        stride: s.stride,
        padding: s.padding,
        dilation: s.dilation,
        groups: s.groups,
        out: arg(&dx, &s.input, dtype),
    }
    .run(&[&dyb, &wb, &dx])
    .unwrap_or_else(|e| panic!("{}: {e}", what("conv2d_backward_input")));
    check(
        &what("conv2d_backward_input"),
        &download(&dx, numel(s.input), dtype),
        &want_dx,
        tol,
    );

    let dw = poisoned(b, numel(s.weight), dtype);
    Kernel::Conv2dBackwardWeight {
        input: arg(&xb, &s.input, dtype),
        grad: arg(&dyb, &out_shape, dtype),
        stride: s.stride,
        padding: s.padding,
        dilation: s.dilation,
        groups: s.groups,
        out: arg(&dw, &s.weight, dtype),
    }
    .run(&[&xb, &dyb, &dw])
    .unwrap_or_else(|e| panic!("{}: {e}", what("conv2d_backward_weight")));
    check(
        &what("conv2d_backward_weight"),
        &download(&dw, numel(s.weight), dtype),
        &want_dw,
        tol,
    );
}

/// The report's entries for `s` in `dtype`.
fn reported(all: &[ConvAlgorithmChoice], s: &Shape, dtype: DType) -> Vec<ConvAlgorithmChoice> {
    all.iter()
        .filter(|c| {
            c.dtype == dtype
                && c.input == s.input
                && c.weight == s.weight
                && c.stride == s.stride
                && c.groups == s.groups
        })
        .cloned()
        .collect()
}

#[test]
fn the_search_on_and_off_match_the_reference_and_are_reported() {
    let Some(b) = backend("the_search_on_and_off_match_the_reference_and_are_reported") else {
        return;
    };
    let cuda = cartage_cuda::open_cuda(0).expect("cuda:0 opened above");
    if !b.capabilities().supports(Op::Conv2dBackwardWeight, DType::F32) {
        eprintln!("SKIP cuDNN convolutions on cuda:0: conv2d and its gradients are not listed (cuDNN 9 not found)");
        return;
    }
    let initial = cuda.conv_benchmark();
    let dtypes: Vec<DType> = [DType::F32, DType::BF16]
        .into_iter()
        .filter(|&d| b.capabilities().supports(Op::Conv2d, d))
        .collect();
    for (on, setting) in [(false, "off"), (true, "on")] {
        cuda.set_conv_benchmark(on);
        assert_eq!(cuda.conv_benchmark(), on);
        for &dtype in &dtypes {
            for s in &SHAPES {
                run_passes(&b, s, dtype, setting);
                // A second round runs the cached plan (searched once, then reused).
                run_passes(&b, s, dtype, setting);
            }
        }
        let all = cuda.conv_algorithms();
        for &dtype in &dtypes {
            for s in &SHAPES {
                let entries = reported(&all, s, dtype);
                for pass in [ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter] {
                    let matching: Vec<&ConvAlgorithmChoice> =
                        entries.iter().filter(|c| c.pass == pass && c.searched == on).collect();
                    assert!(
                        !matching.is_empty(),
                        "no {pass:?} {dtype} entry with searched = {on} for {s:?} in {all:#?}"
                    );
                    for c in matching {
                        // The legacy API's algorithm, or a graph engine where the automatic
                        // choice took the graph API.
                        match c.api {
                            ConvApi::Graph => assert!(c.algorithm.starts_with("graph engine "), "{c}"),
                            _ => assert!(c.algorithm.starts_with("CUDNN_CONVOLUTION_"), "{c}"),
                        }
                        assert_eq!(c.search_ms.is_some(), on, "{c}");
                        eprintln!("{c}");
                    }
                }
            }
        }
    }
    cuda.set_conv_benchmark(initial);
}
