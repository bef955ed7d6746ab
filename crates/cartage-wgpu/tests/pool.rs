//! The wgpu pooling kernels against a host loop written from the spec: max pooling's value and
//! index (first NaN, else first largest, padding never wins, an all −inf window), both average
//! divisors, dilation, overlapping windows, and an input, gradient and indices read through
//! channels-last strides at odd offsets, in every float dtype the adapter runs; the backward's
//! indices that name no tap of their window add nothing; a window past the kernels' 32-bit
//! sizes is a typed error.

mod common;

use cartage_core::{Backend, DType, DeviceBuffer, Element, Kernel, Layout, PoolMode, PoolWindow, TensorArg};
use common::{backend, download, empty, upload};
use half::{bf16, f16};

type Wgpu = std::sync::Arc<cartage_wgpu::WgpuBackend>;

/// A case: input plane [N, C, H, W], window, mode.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: [usize; 4],
    window: PoolWindow,
    mode: PoolMode,
}

fn cases() -> Vec<Case> {
    let dilated = PoolWindow {
        kernel: [3, 2],
        stride: [2, 1],
        padding: [1, 1],
        dilation: [2, 1],
    };
    let overlapping = PoolWindow::new([3, 3], [1, 1], [1, 1]);
    let strided = PoolWindow::new([3, 3], [2, 2], [1, 1]);
    let uneven = PoolWindow::new([2, 3], [2, 3], [0, 1]);
    let mut out = Vec::new();
    for window in [dilated, overlapping, strided, uneven] {
        out.push(Case {
            shape: [2, 3, 7, 6],
            window,
            mode: PoolMode::Max,
        });
    }
    for window in [overlapping, strided, uneven] {
        for count_include_pad in [true, false] {
            out.push(Case {
                shape: [2, 3, 7, 6],
                window,
                mode: PoolMode::Avg { count_include_pad },
            });
        }
    }
    out
}

/// Logical [N, C, H, W] input values: many ties, a NaN, a channel of −inf.
fn input_values(shape: [usize; 4]) -> Vec<f64> {
    let [n, c, h, w] = shape;
    let mut v: Vec<f64> = (0..n * c * h * w).map(|k| ((k * 7) % 5) as f64 - 2.0).collect();
    // Channel (0, 1) is all −inf: the first tap inside wins.
    for k in 0..h * w {
        v[h * w + k] = f64::NEG_INFINITY;
    }
    // One NaN in plane (1, 2), two rows down.
    v[(c + 2) * h * w + 2 * w + 3] = f64::NAN;
    v
}

/// The taps of window (i, j) inside the plane, row-major: (y, x).
fn taps(window: &PoolWindow, plane: [usize; 2], i: usize, j: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for a in 0..window.kernel[0] {
        let y = (i * window.stride[0] + a * window.dilation[0]) as isize - window.padding[0] as isize;
        for b in 0..window.kernel[1] {
            let x = (j * window.stride[1] + b * window.dilation[1]) as isize - window.padding[1] as isize;
            if y >= 0 && x >= 0 && (y as usize) < plane[0] && (x as usize) < plane[1] {
                out.push((y as usize, x as usize));
            }
        }
    }
    out
}

/// The forward from the spec, in f64: values and flat indices.
fn forward_reference(case: &Case, x: &[f64]) -> (Vec<f64>, Vec<i64>) {
    let [n, c, h, w] = case.shape;
    let [oh, ow] = case.window.output_size([h, w]).unwrap();
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let t = taps(&case.window, [h, w], i, j);
                let at = |(y, xx): (usize, usize)| x[plane * h * w + y * w + xx];
                match case.mode {
                    PoolMode::Max => {
                        let pick = t.iter().copied().find(|&p| at(p).is_nan()).unwrap_or_else(|| {
                            let mut best = t[0];
                            for &p in &t[1..] {
                                if at(p) > at(best) {
                                    best = p;
                                }
                            }
                            best
                        });
                        values.push(at(pick));
                        indices.push((pick.0 * w + pick.1) as i64);
                    }
                    PoolMode::Avg { count_include_pad } => {
                        let sum: f64 = t.iter().map(|&p| at(p)).sum();
                        let divisor = if count_include_pad {
                            case.window.kernel[0] * case.window.kernel[1]
                        } else {
                            t.len()
                        };
                        values.push(sum / divisor as f64);
                    }
                }
            }
        }
    }
    (values, indices)
}

/// The backward from the spec, in f64, from logical `grad` and `indices` [N, C, OH, OW].
fn backward_reference(case: &Case, grad: &[f64], indices: &[i64]) -> Vec<f64> {
    let [n, c, h, w] = case.shape;
    let [oh, ow] = case.window.output_size([h, w]).unwrap();
    let mut out = vec![0.0; n * c * h * w];
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let o = (plane * oh + i) * ow + j;
                let t = taps(&case.window, [h, w], i, j);
                match case.mode {
                    PoolMode::Max => {
                        if let Some(&(y, x)) = t.iter().find(|&&(y, x)| (y * w + x) as i64 == indices[o]) {
                            out[plane * h * w + y * w + x] += grad[o];
                        }
                    }
                    PoolMode::Avg { count_include_pad } => {
                        let divisor = if count_include_pad {
                            case.window.kernel[0] * case.window.kernel[1]
                        } else {
                            t.len()
                        };
                        for (y, x) in t {
                            out[plane * h * w + y * w + x] += grad[o] / divisor as f64;
                        }
                    }
                }
            }
        }
    }
    out
}

/// A channels-last copy of logical [N, C, H, W] `values` behind `lead` unused elements: its
/// buffer and the strided [N, C, H, W] view of it.
fn upload_channels_last<T: Element>(
    b: &Wgpu,
    values: &[T],
    shape: [usize; 4],
    lead: usize,
) -> (DeviceBuffer, TensorArg) {
    let [_, c, h, w] = shape;
    let mut physical = vec![values[0]; lead + values.len()];
    for (k, &v) in values.iter().enumerate() {
        let (nn, cc, y, x) = (k / (c * h * w), k / (h * w) % c, k / w % h, k % w);
        physical[lead + ((nn * h + y) * w + x) * c + cc] = v;
    }
    let (buffer, _) = upload(b, &physical, &[physical.len()]);
    let layout = Layout::from_parts(&shape, &[h * w * c, 1, w * c, c], lead).unwrap();
    let arg = buffer.arg(layout, T::DTYPE);
    (buffer, arg)
}

/// The largest relative error allowed for `dtype` (one rounding of an f32 sum, plus the
/// reference's own rounding into the dtype).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2.0 / 1024.0,
        DType::BF16 => 2.0 / 128.0,
        DType::F64 => 1e-12,
        _ => 1e-6,
    }
}

fn close(got: f64, want: f64, dtype: DType) -> bool {
    (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= tolerance(dtype) * want.abs().max(1.0)
}

/// Forward and backward of every case in `T`.
fn check<T: Element>(b: &Wgpu) {
    let dtype = T::DTYPE;
    for case in cases() {
        let [n, c, h, w] = case.shape;
        let [oh, ow] = case.window.output_size([h, w]).unwrap();
        let pooled = [n, c, oh, ow];
        let x: Vec<f64> = input_values(case.shape);
        let typed: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
        let (xb, input) = upload_channels_last(b, &typed, case.shape, 3);
        let (ob, out) = empty::<T>(b, &pooled);
        let max = case.mode == PoolMode::Max;
        let (ib, indices) = empty::<i64>(b, &pooled);
        Kernel::Pool2d {
            mode: case.mode,
            window: case.window,
            input,
            out: out.clone(),
            indices: max.then(|| indices.clone()),
        }
        .run(&[&xb, &ob, &ib])
        .unwrap_or_else(|e| panic!("{dtype} {case:?}: {e}"));
        let (want, want_indices) = forward_reference(&case, &x);
        let got: Vec<f64> = download::<T>(&ob, &out).iter().map(|v| v.to_f64()).collect();
        for (k, (&g, &r)) in got.iter().zip(&want).enumerate() {
            assert!(close(g, r, dtype), "{dtype} {case:?} forward [{k}]: got {g}, want {r}");
        }
        if max {
            assert_eq!(download::<i64>(&ib, &indices), want_indices, "{dtype} {case:?} indices");
        }

        // The backward, with the gradient and the indices channels-last at odd offsets; two
        // indices name no tap of their window (one past the plane, one with a high word).
        let grad: Vec<f64> = (0..n * c * oh * ow)
            .map(|k| ((k * 3) % 7) as f64 * 0.25 - 0.5)
            .collect();
        let typed: Vec<T> = grad.iter().map(|&v| T::from_f64(v)).collect();
        let (gb, grad_arg) = upload_channels_last(b, &typed, pooled, 1);
        let mut recorded = if max { want_indices.clone() } else { vec![0; grad.len()] };
        if max {
            recorded[0] = (h * w) as i64;
            recorded[1] += 1 << 32;
        }
        let (jb, recorded_arg) = upload_channels_last(b, &recorded, pooled, 1);
        let (db, dx) = empty::<T>(b, &case.shape);
        Kernel::Pool2dBackward {
            mode: case.mode,
            window: case.window,
            grad: grad_arg,
            indices: max.then(|| recorded_arg.clone()),
            out: dx.clone(),
        }
        .run(&[&gb, &jb, &db])
        .unwrap_or_else(|e| panic!("{dtype} {case:?} backward: {e}"));
        let want = backward_reference(&case, &grad, &recorded);
        let got: Vec<f64> = download::<T>(&db, &dx).iter().map(|v| v.to_f64()).collect();
        for (k, (&g, &r)) in got.iter().zip(&want).enumerate() {
            assert!(close(g, r, dtype), "{dtype} {case:?} backward [{k}]: got {g}, want {r}");
        }
    }
}

#[test]
fn pooling_matches_the_spec_in_every_float_dtype() {
    let Some(b) = backend("pooling_matches_the_spec_in_every_float_dtype") else {
        return;
    };
    check::<f32>(&b);
    check::<f16>(&b);
    check::<bf16>(&b);
    if b.features().contains(wgpu::Features::SHADER_F64) {
        check::<f64>(&b);
    } else {
        eprintln!("SKIP wgpu/pool f64: the adapter lacks SHADER_F64");
    }
    b.synchronize().unwrap();
}

#[test]
fn a_window_past_32_bits_is_a_typed_error() {
    let Some(b) = backend("a_window_past_32_bits_is_a_typed_error") else {
        return;
    };
    // Padding half of each kernel side lets windows over a single element fit; their 2³³ taps
    // are past the kernel's 32-bit window size.
    let window = PoolWindow::new([1 << 17, 1 << 16], [1, 1], [1 << 16, 1 << 15]);
    let [oh, ow] = window.output_size([1, 1]).unwrap();
    let (xb, input) = upload(&b, &[2.0f32], &[1, 1, 1, 1]);
    let (ob, out) = empty::<f32>(&b, &[1, 1, oh, ow]);
    let result = Kernel::Pool2d {
        mode: PoolMode::Avg {
            count_include_pad: true,
        },
        window,
        input,
        out,
        indices: None,
    }
    .run(&[&xb, &ob]);
    match result {
        Err(cartage_core::Error::InvalidArgument { reason, .. }) => assert!(reason.contains("kh·kw"), "{reason}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
