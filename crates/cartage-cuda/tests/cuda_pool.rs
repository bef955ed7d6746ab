//! The pooling kernels (`Pool2d`, `Pool2dBackward`) on cuda:0 against a float64 host loop on the
//! same rounded inputs, in f32 and bf16: max pooling with its indices and average pooling with
//! either divisor, forward and backward, on a ResNet-like 3×3 stride-2 padding-1 window, on
//! overlapping windows (stride below the kernel, a tall kernel, dilation), with the input read
//! through NHWC strides and the gradient and indices through transposed ones; plus max pooling's
//! NaN and tie rules and a backward fed indices that name no tap of their window.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use common::{arg, download, poisoned, upload, values};

use cartage_core::{Backend, DType, DeviceBuffer, Kernel, Layout, Op, PoolKind, PoolMode, PoolWindow};

/// `cuda:0` with the pooling kernels listed, or `None` after a SKIP line.
fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    let b = common::backend(test)?;
    if b.capabilities().supports(Op::Pool2d(PoolKind::Max), DType::F32) {
        return Some(b);
    }
    panic!("cuda/{test}: the pooling kernels are not listed on cuda:0, which builds them for every float dtype");
}

/// An input plane `[N, C, H, W]` and its window.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: [usize; 4],
    window: PoolWindow,
}

impl Case {
    fn pooled(&self) -> [usize; 4] {
        let [n, c, h, w] = self.shape;
        let [oh, ow] = self.window.output_size([h, w]).expect("a window fits");
        [n, c, oh, ow]
    }
}

/// The cases every mode runs: ResNet's stem pooling (smaller planes, one odd side), overlapping
/// windows of stride 1, and a tall kernel with unequal strides.
fn cases() -> Vec<Case> {
    vec![
        Case {
            shape: [2, 8, 28, 27],
            window: PoolWindow::new([3, 3], [2, 2], [1, 1]),
        },
        Case {
            shape: [3, 5, 11, 9],
            window: PoolWindow::new([3, 3], [1, 1], [1, 1]),
        },
        Case {
            shape: [2, 3, 17, 12],
            window: PoolWindow::new([5, 2], [2, 1], [2, 1]),
        },
    ]
}

/// Max pooling only: a dilated window (average pooling takes dilation 1).
fn dilated() -> Case {
    Case {
        shape: [2, 4, 15, 13],
        window: PoolWindow {
            kernel: [3, 2],
            stride: [1, 2],
            padding: [1, 1],
            dilation: [2, 3],
        },
    }
}

/// The taps of window `(i, j)` inside the plane `[h, w]`, in row-major window order.
fn taps(window: &PoolWindow, [h, w]: [usize; 2], (i, j): (usize, usize)) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for a in 0..window.kernel[0] {
        let y = (i * window.stride[0] + a * window.dilation[0]) as isize - window.padding[0] as isize;
        for b in 0..window.kernel[1] {
            let x = (j * window.stride[1] + b * window.dilation[1]) as isize - window.padding[1] as isize;
            if y >= 0 && (y as usize) < h && x >= 0 && (x as usize) < w {
                out.push((y as usize, x as usize));
            }
        }
    }
    out
}

/// The forward on the host: values in f64 (before rounding to the dtype) and, for max, the
/// indices (first NaN tap, else first largest).
fn forward_ref(x: &[f64], case: &Case, mode: PoolMode) -> (Vec<f64>, Vec<i64>) {
    let [n, c, h, w] = case.shape;
    let [_, _, oh, ow] = case.pooled();
    let (mut out, mut indices) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        for i in 0..oh {
            for j in 0..ow {
                let taps = taps(&case.window, [h, w], (i, j));
                match mode {
                    PoolMode::Max => {
                        let mut best: Option<(f64, usize)> = None;
                        for &(y, xx) in &taps {
                            let v = xp[y * w + xx];
                            let better = match best {
                                None => true,
                                Some((b, _)) => v > b || (v.is_nan() && !b.is_nan()),
                            };
                            if better {
                                best = Some((v, y * w + xx));
                            }
                        }
                        let (v, at) = best.expect("every window has a tap inside");
                        out.push(v);
                        indices.push(at as i64);
                    }
                    PoolMode::Avg { count_include_pad } => {
                        let sum: f64 = taps.iter().map(|&(y, xx)| xp[y * w + xx]).sum();
                        let divisor = if count_include_pad {
                            case.window.kernel[0] * case.window.kernel[1]
                        } else {
                            taps.len()
                        };
                        out.push(sum / divisor as f64);
                    }
                }
            }
        }
    }
    (out, indices)
}

/// The backward on the host, by the spec's definition: each window's gradient goes to its taps
/// (max: only to the tap its index names).
fn backward_ref(g: &[f64], indices: &[i64], case: &Case, mode: PoolMode) -> Vec<f64> {
    let [n, c, h, w] = case.shape;
    let [_, _, oh, ow] = case.pooled();
    let mut out = vec![0.0; n * c * h * w];
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let at = (plane * oh + i) * ow + j;
                let taps = taps(&case.window, [h, w], (i, j));
                for &(y, x) in &taps {
                    let p = plane * h * w + y * w + x;
                    match mode {
                        PoolMode::Max if indices[at] == (y * w + x) as i64 => out[p] += g[at],
                        PoolMode::Max => {}
                        PoolMode::Avg { count_include_pad } => {
                            let divisor = if count_include_pad {
                                case.window.kernel[0] * case.window.kernel[1]
                            } else {
                                taps.len()
                            };
                            out[p] += g[at] / divisor as f64;
                        }
                    }
                }
            }
        }
    }
    out
}

/// `v` (row-major `[N, C, H, W]`) stored channels-last and viewed as `[N, C, H, W]`: a
/// non-contiguous input.
fn upload_nhwc(b: &Arc<dyn Backend>, v: &[f64], shape: [usize; 4], dtype: DType) -> (DeviceBuffer, Layout) {
    let [_, c, h, w] = shape;
    let mut stored = vec![0.0; v.len()];
    for (i, &value) in v.iter().enumerate() {
        let (x, y, ch, nn) = (i % w, i / w % h, i / (w * h) % c, i / (w * h * c));
        stored[((nn * h + y) * w + x) * c + ch] = value;
    }
    let layout = Layout::from_parts(&shape, &[h * w * c, 1, w * c, c], 0).expect("layout");
    (upload(b, &stored, dtype), layout)
}

/// `v` (row-major `[N, C, OH, OW]`) stored as `[N, C, OW, OH]` and viewed transposed back.
fn upload_transposed(b: &Arc<dyn Backend>, v: &[f64], shape: [usize; 4], dtype: DType) -> (DeviceBuffer, Layout) {
    let [_, c, oh, ow] = shape;
    let mut stored = vec![0.0; v.len()];
    for (i, &value) in v.iter().enumerate() {
        let (j, row, plane) = (i % ow, i / ow % oh, i / (ow * oh));
        stored[(plane * ow + j) * oh + row] = value;
    }
    let layout = Layout::from_parts(&shape, &[c * oh * ow, oh * ow, 1, oh], 0).expect("layout");
    (upload(b, &stored, dtype), layout)
}

fn download_i64(buf: &DeviceBuffer, n: usize) -> Vec<i64> {
    let mut bytes = vec![0u8; n * 8];
    buf.read(0, &mut bytes).expect("read");
    bytes
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::BF16 { 1e-2 } else { 2e-6 }
}

/// Run the forward of `mode` on `x` (NHWC-strided when `strided`); returns the values and, for
/// max, the device's indices.
fn run_forward(
    b: &Arc<dyn Backend>,
    x: &[f64],
    case: &Case,
    mode: PoolMode,
    dtype: DType,
    strided: bool,
) -> (Vec<f64>, Vec<i64>) {
    let pooled = case.pooled();
    let total: usize = pooled.iter().product();
    let (xb, layout) = if strided {
        upload_nhwc(b, x, case.shape, dtype)
    } else {
        (upload(b, x, dtype), Layout::contiguous(&case.shape).expect("layout"))
    };
    let out = poisoned(b, total, dtype);
    let max = matches!(mode, PoolMode::Max);
    let ib = upload(b, &vec![-7.0; if max { total } else { 1 }], DType::I64);
    Kernel::Pool2d {
        mode,
        window: case.window,
        input: xb.arg(layout, dtype),
        out: arg(&out, &pooled, dtype),
        indices: max.then(|| arg(&ib, &pooled, DType::I64)),
    }
    .run(&[&xb, &out, &ib])
    .unwrap_or_else(|e| panic!("pool2d {mode:?} {dtype} {case:?}: {e}"));
    let indices = if max { download_i64(&ib, total) } else { Vec::new() };
    (download(&out, total, dtype), indices)
}

/// Run the backward of `mode` from `g` (and `indices`), both read through transposed strides.
fn run_backward(
    b: &Arc<dyn Backend>,
    g: &[f64],
    indices: &[i64],
    case: &Case,
    mode: PoolMode,
    dtype: DType,
) -> Vec<f64> {
    let pooled = case.pooled();
    let numel: usize = case.shape.iter().product();
    let (gb, g_layout) = upload_transposed(b, g, pooled, dtype);
    let max = matches!(mode, PoolMode::Max);
    let (ib, i_layout) = if max {
        let as_f64: Vec<f64> = indices.iter().map(|&i| i as f64).collect();
        upload_transposed(b, &as_f64, pooled, DType::I64)
    } else {
        (upload(b, &[0.0], DType::I64), Layout::contiguous(&[1]).expect("layout"))
    };
    let out = poisoned(b, numel, dtype);
    Kernel::Pool2dBackward {
        mode,
        window: case.window,
        grad: gb.arg(g_layout, dtype),
        indices: max.then(|| ib.arg(i_layout, DType::I64)),
        out: arg(&out, &case.shape, dtype),
    }
    .run(&[&gb, &ib, &out])
    .unwrap_or_else(|e| panic!("pool2d_backward {mode:?} {dtype} {case:?}: {e}"));
    download(&out, numel, dtype)
}

#[test]
fn max_pool_forward_and_backward_match_the_reference() {
    let Some(b) = backend("max_pool_forward_and_backward_match_the_reference") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for (k, case) in cases().into_iter().chain([dilated()]).enumerate() {
            let x = values(case.shape.iter().product(), 40 + k as u64, dtype);
            let (want, want_idx) = forward_ref(&x, &case, PoolMode::Max);
            for strided in [false, true] {
                let (got, idx) = run_forward(&b, &x, &case, PoolMode::Max, dtype, strided);
                let what = format!("max_pool2d {dtype} {case:?} strided={strided}");
                // The maximum is one of the inputs: exact.
                common::check_within(&what, &got, &want, 0.0);
                assert_eq!(idx, want_idx, "{what}: indices");
            }
            let g = values(case.pooled().iter().product(), 50 + k as u64, dtype);
            let got = run_backward(&b, &g, &want_idx, &case, PoolMode::Max, dtype);
            let want = backward_ref(&g, &want_idx, &case, PoolMode::Max);
            let what = format!("max_pool2d_backward {dtype} {case:?}");
            common::check_within(&what, &got, &want, tolerance(dtype));
        }
    }
}

#[test]
fn avg_pool_forward_and_backward_match_the_reference() {
    let Some(b) = backend("avg_pool_forward_and_backward_match_the_reference") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for (k, case) in cases().into_iter().enumerate() {
            let x = values(case.shape.iter().product(), 60 + k as u64, dtype);
            let g = values(case.pooled().iter().product(), 70 + k as u64, dtype);
            for count_include_pad in [true, false] {
                let mode = PoolMode::Avg { count_include_pad };
                let (want, _) = forward_ref(&x, &case, mode);
                for strided in [false, true] {
                    let (got, _) = run_forward(&b, &x, &case, mode, dtype, strided);
                    let what = format!("avg_pool2d {mode:?} {dtype} {case:?} strided={strided}");
                    common::check_within(&what, &got, &want, tolerance(dtype));
                }
                let got = run_backward(&b, &g, &[], &case, mode, dtype);
                let want = backward_ref(&g, &[], &case, mode);
                let what = format!("avg_pool2d_backward {mode:?} {dtype} {case:?}");
                common::check_within(&what, &got, &want, tolerance(dtype));
            }
        }
    }
}

/// Integer inputs tie often: the first largest tap wins; a NaN tap wins over every number, the
/// first NaN over later ones, and the output is NaN.
#[test]
fn max_pool_takes_the_first_nan_else_the_first_largest_tap() {
    let Some(b) = backend("max_pool_takes_the_first_nan_else_the_first_largest_tap") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for case in [cases()[0], cases()[1], dilated()] {
            let numel: usize = case.shape.iter().product();
            let mut x: Vec<f64> = values(numel, 80, dtype).iter().map(|v| v.floor()).collect();
            for i in (0..numel).step_by(37) {
                x[i] = f64::NAN;
            }
            let (want, want_idx) = forward_ref(&x, &case, PoolMode::Max);
            assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| !v.is_nan()));
            let (got, idx) = run_forward(&b, &x, &case, PoolMode::Max, dtype, true);
            let what = format!("max_pool2d ties and NaN {dtype} {case:?}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "{what}: element {i}: got {g}, want {w}"
                );
            }
            assert_eq!(idx, want_idx, "{what}: indices");
        }
    }
}

/// Indices that name no tap of their window (out of the plane, negative, another window's tap)
/// add nothing: they are compared, never followed.
#[test]
fn max_pool_backward_ignores_indices_outside_their_window() {
    let Some(b) = backend("max_pool_backward_ignores_indices_outside_their_window") else {
        return;
    };
    let case = cases()[0];
    let [_, _, h, w] = case.shape;
    let dtype = DType::F32;
    let x = values(case.shape.iter().product(), 90, dtype);
    let (_, mut indices) = forward_ref(&x, &case, PoolMode::Max);
    for (k, index) in indices.iter_mut().enumerate() {
        match k % 5 {
            0 => *index = -1,
            1 => *index = (h * w) as i64 + 3,
            2 => *index = i64::MAX,
            3 => *index = (*index + 2 * w as i64) % (h * w) as i64,
            _ => {}
        }
    }
    let g = values(case.pooled().iter().product(), 91, dtype);
    let got = run_backward(&b, &g, &indices, &case, PoolMode::Max, dtype);
    let want = backward_ref(&g, &indices, &case, PoolMode::Max);
    assert!(want.iter().any(|&v| v != 0.0));
    common::check_within(
        "max_pool2d_backward with foreign indices",
        &got,
        &want,
        tolerance(dtype),
    );
}
