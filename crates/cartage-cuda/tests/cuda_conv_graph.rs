//! cuDNN's graph (backend) API for the convolution and its two gradients: forced through it
//! (`CudaBackend::set_conv_engine_api(ConvApi::Graph)`), f32, f16 and bf16 on a plain 3×3
//! convolution (the ResNet [32, 64, 56, 56] shape with a batch of one), stride 2, dilation 2,
//! channel groups and a 1×1 convolution, with the algorithm search off and on, each compared
//! with the legacy API and with a float64 reference summed on the host (the CPU backend has no
//! fused convolution: its frontend composes one, so the host sum is the CPU's answer without
//! the rounding of a composition); the report names a graph engine for each; f32
//! at precision `Highest` never runs a tensor-core engine; and the automatic choice runs the
//! full-size ResNet shape in bf16 and prints each API's time.
//!
//! Without a CUDA device every test prints a SKIP line (`CARTAGE_REQUIRE=cuda` makes it fail);
//! without cuDNN (conv2d not listed) the test says so and returns.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{Backend, DType, DeviceBuffer, Kernel, MatmulPrecision, Op};
use cartage_cuda::{ConvAlgorithmChoice, ConvApi, ConvPass, GRAPH_NO_TENSOR_CORES};
use common::{arg, backend, download, poisoned, upload, values};

/// The tests switch the backend's API and precision, which every test on `cuda:0` shares: one
/// at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

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

const fn shape(input: [usize; 4], weight: [usize; 4], stride: usize, padding: usize, dilation: usize) -> Shape {
    Shape {
        input,
        weight,
        stride: [stride, stride],
        padding: [padding, padding],
        dilation: [dilation, dilation],
        groups: input[1] / weight[1],
    }
}

const SHAPES: [Shape; 5] = [
    // ResNet's [32, 64, 56, 56] 3×3 padding 1, with a batch of one.
    shape([1, 64, 56, 56], [64, 64, 3, 3], 1, 1, 1),
    shape([2, 16, 15, 15], [32, 16, 3, 3], 2, 1, 1),
    shape([2, 16, 12, 12], [16, 16, 3, 3], 1, 2, 2),
    // Two channel groups.
    shape([2, 32, 10, 10], [32, 16, 3, 3], 1, 1, 1),
    shape([2, 64, 14, 14], [128, 64, 1, 1], 1, 0, 1),
];

/// The forward output, the input gradient and the weight gradient, read back as f64.
struct Passes {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
}

/// Run the three passes of `s` in `dtype` on `b` from the inputs `(x, w, dy)`.
fn run_passes(
    b: &Arc<dyn Backend>,
    s: &Shape,
    dtype: DType,
    (x, w, dy): (&[f64], &[f64], &[f64]),
    what: &str,
) -> Passes {
    let out_shape = s.output();
    let (xb, wb, dyb) = (upload(b, x, dtype), upload(b, w, dtype), upload(b, dy, dtype));
    let fail = |pass: &str, e: cartage_core::Error| -> ! { panic!("{pass} {dtype} {s:?} ({what}): {e}") };

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
    .unwrap_or_else(|e| fail("conv2d", e));

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
    .unwrap_or_else(|e| fail("conv2d_backward_input", e));

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
    .unwrap_or_else(|e| fail("conv2d_backward_weight", e));

    Passes {
        y: download(&y, numel(out_shape), dtype),
        dx: download(&dx, numel(s.input), dtype),
        dw: download(&dw, numel(s.weight), dtype),
    }
}

/// Deterministic inputs of `s` rounded to `dtype`: `x`, `w` (scaled down) and `dy`.
fn inputs(s: &Shape, dtype: DType) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let x = values(numel(s.input), 1, dtype);
    let w = values(numel(s.weight), 2, dtype)
        .iter()
        .map(|v| common::round(v / 8.0, dtype))
        .collect();
    let dy = values(numel(s.output()), 3, dtype);
    (x, w, dy)
}

/// The three passes in float64 by direct summation on the host, for output gradient `dy`.
fn reference(s: &Shape, (x, w, dy): (&[f64], &[f64], &[f64])) -> Passes {
    let [n, c, h, wd] = s.input;
    let [o, cg, kh, kw] = s.weight;
    let [_, _, oh, ow] = s.output();
    let og = o / s.groups;
    let mut out = Passes {
        y: vec![0.0; numel(s.output())],
        dx: vec![0.0; numel(s.input)],
        dw: vec![0.0; numel(s.weight)],
    };
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
                                out.y[yi] += x[xi] * w[wi];
                                out.dx[xi] += dy[yi] * w[wi];
                                out.dw[wi] += dy[yi] * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Elementwise agreement relative to the reference's largest magnitude.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1.5e-2,
        DType::F16 => 3e-3,
        _ => 1e-4,
    }
}

/// Every element of `got` within `tol` of `want`, relative to `want`'s largest magnitude.
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

fn check_passes(what: &str, got: &Passes, want: &Passes, dtype: DType) {
    let tol = tolerance(dtype);
    check(&format!("conv2d {what}"), &got.y, &want.y, tol);
    check(&format!("conv2d_backward_input {what}"), &got.dx, &want.dx, tol);
    check(&format!("conv2d_backward_weight {what}"), &got.dw, &want.dw, tol);
}

/// The report's entries for `s` in `dtype`.
fn reported(all: &[ConvAlgorithmChoice], s: &Shape, dtype: DType) -> Vec<ConvAlgorithmChoice> {
    all.iter()
        .filter(|c| {
            c.dtype == dtype
                && c.input == s.input
                && c.weight == s.weight
                && c.stride == s.stride
                && c.dilation == s.dilation
                && c.groups == s.groups
        })
        .cloned()
        .collect()
}

/// The CUDA backend behind `b`, with the dtypes of `wanted` it convolves (forward and
/// backward), or `None` after a SKIP line when cuDNN is missing.
fn cudnn(b: &Arc<dyn Backend>, wanted: &[DType]) -> Option<(Arc<cartage_cuda::CudaBackend>, Vec<DType>)> {
    if !b.capabilities().supports(Op::Conv2dBackwardWeight, DType::F32) {
        eprintln!(
            "SKIP cuDNN graph convolutions on cuda:0: conv2d and its gradients are not listed (cuDNN 9 not found)"
        );
        return None;
    }
    let cuda = cartage_cuda::open_cuda(0).expect("cuda:0 opened above");
    let dtypes = wanted
        .iter()
        .copied()
        .filter(|&d| b.capabilities().supports(Op::Conv2dBackwardWeight, d))
        .collect();
    Some((cuda, dtypes))
}

#[test]
fn the_graph_api_matches_the_legacy_api_and_the_host() {
    let _serial = serial();
    let Some(b) = backend("the_graph_api_matches_the_legacy_api_and_the_host") else {
        return;
    };
    let Some((cuda, dtypes)) = cudnn(&b, &[DType::F32, DType::F16, DType::BF16]) else {
        return;
    };
    let (api, search, precision) = (cuda.conv_engine_api(), cuda.conv_benchmark(), b.matmul_precision());
    b.set_matmul_precision(MatmulPrecision::Highest).expect("precision");
    for &dtype in &dtypes {
        for s in &SHAPES {
            let operands = inputs(s, dtype);
            let refs = (&operands.0[..], &operands.1[..], &operands.2[..]);
            let want = reference(s, refs);
            for on in [false, true] {
                cuda.set_conv_benchmark(on);
                let what = format!("{dtype} {s:?}, search {on}");
                cuda.set_conv_engine_api(ConvApi::Graph);
                let graph = run_passes(&b, s, dtype, refs, "graph API");
                // Once more from the cached plan.
                let again = run_passes(&b, s, dtype, refs, "graph API, cached plan");
                let entries = reported(&cuda.conv_algorithms(), s, dtype);
                for pass in [ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter] {
                    let graph_entries: Vec<&ConvAlgorithmChoice> = entries
                        .iter()
                        .filter(|c| c.pass == pass && c.api == ConvApi::Graph && c.searched == on)
                        .collect();
                    assert!(
                        !graph_entries.is_empty(),
                        "{what}: no {pass:?} entry ran through the graph API: {entries:#?}"
                    );
                    for c in graph_entries {
                        assert!(c.algorithm.starts_with("graph engine "), "{c}");
                        assert_eq!(c.search_ms.is_some(), on, "{c}");
                        if dtype == DType::F32 {
                            assert_eq!(c.math, GRAPH_NO_TENSOR_CORES, "f32 at Highest on tensor cores: {c}");
                        }
                        eprintln!("{c}");
                    }
                }
                cuda.set_conv_engine_api(ConvApi::Legacy);
                let legacy = run_passes(&b, s, dtype, refs, "legacy API");
                check_passes(&format!("graph against legacy, {what}"), &graph, &legacy, dtype);
                check_passes(&format!("graph twice, {what}"), &again, &graph, dtype);
                check_passes(&format!("graph against the host, {what}"), &graph, &want, dtype);
                check_passes(&format!("legacy against the host, {what}"), &legacy, &want, dtype);
            }
        }
    }
    cuda.set_conv_engine_api(api);
    cuda.set_conv_benchmark(search);
    b.set_matmul_precision(precision).expect("precision");
}

#[test]
fn f32_at_highest_never_runs_a_tensor_core_engine() {
    let _serial = serial();
    let Some(b) = backend("f32_at_highest_never_runs_a_tensor_core_engine") else {
        return;
    };
    let Some((cuda, dtypes)) = cudnn(&b, &[DType::F32]) else {
        return;
    };
    if dtypes.is_empty() {
        return;
    }
    let (api, search, precision) = (cuda.conv_engine_api(), cuda.conv_benchmark(), b.matmul_precision());
    b.set_matmul_precision(MatmulPrecision::Highest).expect("precision");
    // Under Auto the search may choose either API; under Graph only graph engines run.
    for api_setting in [ConvApi::Graph, ConvApi::Auto] {
        cuda.set_conv_engine_api(api_setting);
        for on in [false, true] {
            cuda.set_conv_benchmark(on);
            for s in &SHAPES {
                let operands = inputs(s, DType::F32);
                let refs = (&operands.0[..], &operands.1[..], &operands.2[..]);
                run_passes(&b, s, DType::F32, refs, "f32 at Highest");
            }
        }
    }
    let all = cuda.conv_algorithms();
    let mut graph_entries = 0;
    for c in all.iter().filter(|c| c.dtype == DType::F32) {
        match c.api {
            ConvApi::Graph => {
                graph_entries += 1;
                assert_eq!(
                    c.math, GRAPH_NO_TENSOR_CORES,
                    "f32 at Highest ran a tensor-core engine: {c}"
                );
            }
            _ => assert_eq!(c.math, "CUDNN_FMA_MATH", "f32 at Highest ran under {}: {c}", c.math),
        }
    }
    assert!(
        graph_entries > 0,
        "no f32 convolution ran through the graph API: {all:#?}"
    );
    cuda.set_conv_engine_api(api);
    cuda.set_conv_benchmark(search);
    b.set_matmul_precision(precision).expect("precision");
}

/// Device time per call of `run`, in microseconds (after two warm-up calls).
fn time_us(b: &Arc<dyn Backend>, mut run: impl FnMut()) -> f64 {
    const CALLS: u32 = 20;
    run();
    run();
    let start = b.record_event().expect("event");
    for _ in 0..CALLS {
        run();
    }
    let end = b.record_event().expect("event");
    b.elapsed(&start, &end).expect("elapsed").as_secs_f64() * 1e6 / f64::from(CALLS)
}

#[test]
fn each_api_runs_the_resnet_shape_and_reports_its_time() {
    let _serial = serial();
    let Some(b) = backend("each_api_runs_the_resnet_shape_and_reports_its_time") else {
        return;
    };
    let Some((cuda, dtypes)) = cudnn(&b, &[DType::BF16]) else {
        return;
    };
    if dtypes.is_empty() {
        eprintln!("SKIP the bf16 ResNet timing: cuda:0 does not convolve bf16");
        return;
    }
    let dtype = DType::BF16;
    let s = shape([32, 64, 56, 56], [64, 64, 3, 3], 1, 1, 1);
    let (api, search) = (cuda.conv_engine_api(), cuda.conv_benchmark());
    cuda.set_conv_benchmark(true);
    let out_shape = s.output();
    let (x, w, dy) = inputs(&s, dtype);
    let (xb, wb, dyb) = (upload(&b, &x, dtype), upload(&b, &w, dtype), upload(&b, &dy, dtype));
    let (y, dx, dw): (DeviceBuffer, DeviceBuffer, DeviceBuffer) = (
        poisoned(&b, numel(out_shape), dtype),
        poisoned(&b, numel(s.input), dtype),
        poisoned(&b, numel(s.weight), dtype),
    );
    let forward = || {
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
        .expect("conv2d")
    };
    let backward = || {
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
        .expect("conv2d_backward_input");
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
        .expect("conv2d_backward_weight");
    };
    let mut times = Vec::new();
    // Legacy first (its search), then Auto (the graph search and the comparison), then Graph.
    for api_setting in [ConvApi::Legacy, ConvApi::Auto, ConvApi::Graph] {
        cuda.set_conv_engine_api(api_setting);
        let f = time_us(&b, forward);
        let fb = time_us(&b, || {
            forward();
            backward();
        });
        let entries = reported(&cuda.conv_algorithms(), &s, dtype);
        for c in &entries {
            eprintln!("{api_setting:?}: {c} [{:?}]", c.api);
        }
        if api_setting == ConvApi::Graph {
            assert!(
                entries.iter().all(|c| c.api == ConvApi::Graph),
                "a pass of the ResNet shape did not run through the graph API: {entries:#?}"
            );
        }
        eprintln!(
            "{api_setting:?}: bf16 {:?} 3x3 forward {f:.1} us, forward+backward {fb:.1} us",
            s.input
        );
        times.push((api_setting, f, fb));
    }
    cuda.set_conv_engine_api(api);
    cuda.set_conv_benchmark(search);
    assert_eq!(times.len(), 3);
}
