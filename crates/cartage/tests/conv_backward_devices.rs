//! conv2d's gradients (input, weight, bias) on `cuda:0`, where cuDNN's backward kernels run
//! them (`Op::Conv2dBackwardInput`, `Op::Conv2dBackwardWeight`), against the CPU's composed
//! gradients (im2col and matmuls) on the same inputs: groups (depthwise included), stride,
//! padding, dilation, an unbatched input, an input read through a channels-last view and an
//! output gradient that arrives strided; f32 to f32 round-off, bf16 within bf16's precision
//! (the CPU computing in f32 from the same bf16-rounded inputs).
//!
//! Without `cuda:0` every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes that a failure.
//! Where cuDNN does not load, no conv2d kernel is listed and the comparison runs the composed
//! formula on both devices (a SKIP line says so for the listing test).

mod common;

use cartage::{Conv2dOptions, DType, Device, DeviceKind, Op, Result, Tensor, Var};

/// One convolution and how its operands reach it.
struct Case {
    name: &'static str,
    /// The input, `[N, C, H, W]` (`[C, H, W]` when `unbatched`).
    x: &'static [usize],
    w: [usize; 4],
    bias: bool,
    opts: Conv2dOptions,
    /// The input is a permuted view of a dense `[N, H, W, C]` variable.
    channels_last: bool,
    /// The loss reads the output through a permutation, so its gradient arrives strided.
    strided_grad: bool,
}

fn opts(stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], groups: usize) -> Conv2dOptions {
    Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "3x3 padded, bias",
            x: &[2, 3, 9, 8],
            w: [4, 3, 3, 3],
            bias: true,
            opts: opts([1, 1], [1, 1], [1, 1], 1),
            channels_last: false,
            strided_grad: false,
        },
        Case {
            name: "stride 2 with a remainder, groups 2, channels-last input",
            x: &[2, 4, 10, 9],
            w: [6, 2, 3, 2],
            bias: true,
            opts: opts([2, 3], [1, 0], [1, 1], 2),
            channels_last: true,
            strided_grad: true,
        },
        Case {
            name: "dilated depthwise",
            x: &[2, 8, 11, 11],
            w: [8, 1, 3, 3],
            bias: false,
            opts: opts([1, 1], [2, 2], [2, 2], 8),
            channels_last: false,
            strided_grad: true,
        },
        Case {
            name: "unbatched 5x5, groups 3",
            x: &[6, 12, 11],
            w: [6, 2, 5, 5],
            bias: true,
            opts: opts([2, 1], [2, 1], [1, 2], 3),
            channels_last: false,
            strided_grad: false,
        },
        Case {
            name: "ResNet-like 3x3, 64 channels",
            x: &[2, 64, 14, 14],
            w: [64, 64, 3, 3],
            bias: true,
            opts: opts([1, 1], [1, 1], [1, 1], 1),
            channels_last: true,
            strided_grad: false,
        },
    ]
}

/// `n` deterministic values in [-1, 1) (an LCG).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
        })
        .collect()
}

/// A tensor of `shape` on `device` in `compute`, from values rounded to `dtype` first (so the
/// CPU in f32 and the GPU in bf16 see the same numbers).
fn operand(shape: &[usize], seed: u64, dtype: DType, compute: DType, device: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed), shape, &Device::cpu())?
        .to_dtype(dtype)?
        .to_dtype(compute)?
        .to(device)
}

/// The gradients of `Σ y·r` (input, weight, then bias when the case has one) as f64, computed on
/// `device` in `compute` from inputs rounded to `dtype`.
fn gradients(case: &Case, dtype: DType, compute: DType, device: &Device) -> Result<Vec<Vec<f64>>> {
    let stored: Vec<usize> = match (case.channels_last, case.x) {
        (true, &[n, c, h, w]) => vec![n, h, w, c],
        _ => case.x.to_vec(),
    };
    let x = Var::new(operand(&stored, 1, dtype, compute, device)?)?;
    let w = Var::new(operand(&case.w, 2, dtype, compute, device)?)?;
    let b = if case.bias {
        Some(Var::new(operand(&[case.w[0]], 3, dtype, compute, device)?)?)
    } else {
        None
    };
    let input = if case.channels_last {
        x.tensor().permute(&[0, 3, 1, 2])?
    } else {
        x.tensor()
    };
    let y = input.conv2d(&w.tensor(), b.as_ref().map(Var::tensor).as_ref(), case.opts)?;
    // Weights on the output make every gradient element different.
    let read = if case.strided_grad { y.transpose(-1, -2)? } else { y };
    let r = operand(read.shape(), 4, dtype, compute, device)?;
    read.mul(&r)?.sum_all()?.backward()?;
    [Some(&x), Some(&w), b.as_ref()]
        .into_iter()
        .flatten()
        .map(|v| match v.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>(),
            None => Ok(vec![]),
        })
        .collect()
}

/// The largest difference, relative to the largest reference magnitude (at least 1).
fn worst(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| {
            if a.is_finite() {
                (a - b).abs() / scale
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// `cuda:0`, or `None` after a SKIP line (a failure under `CARTAGE_REQUIRE=cuda`).
fn cuda(test: &str) -> Option<Device> {
    let device = Device::cuda(0);
    match cartage::backend(&device) {
        Ok(_) => Some(device),
        Err(e) => {
            assert!(
                !common::required(DeviceKind::Cuda),
                "{test}: CARTAGE_REQUIRE names cuda but {device} did not open: {e}"
            );
            common::device_missing(test, &device, &e);
            None
        }
    }
}

#[test]
fn cuda_conv2d_gradients_match_the_cpu() {
    let Some(device) = cuda("conv_backward/cuda_conv2d_gradients_match_the_cpu") else {
        return;
    };
    let cpu = Device::cpu();
    let names = ["input", "weight", "bias"];
    let mut failures = Vec::new();
    for case in cases() {
        for (dtype, tolerance) in [(DType::F32, 5e-4), (DType::BF16, 6e-2)] {
            let want = gradients(&case, dtype, DType::F32, &cpu).expect("the CPU computes every case");
            match gradients(&case, dtype, dtype, &device) {
                Ok(got) => {
                    for ((g, w), name) in got.iter().zip(&want).zip(names) {
                        let err = worst(g, w);
                        if err > tolerance {
                            failures.push(format!(
                                "{device} {dtype} {}: the {name} gradient differs by {err:.2e} (relative) from the CPU's",
                                case.name
                            ));
                        }
                    }
                }
                Err(e) => failures.push(format!("{device} {dtype} {}: {e}", case.name)),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn cuda_lists_the_fused_conv2d_backward_kernels_with_the_forward() {
    let Some(device) = cuda("conv_backward/cuda_lists_the_fused_conv2d_backward_kernels") else {
        return;
    };
    let backend = cartage::backend(&device).expect("cuda:0 opened");
    let caps = backend.capabilities();
    if !caps.supports(Op::Conv2d, DType::F32) {
        common::skip(&format!(
            "conv_backward/cuda_lists_the_fused_conv2d_backward_kernels: {device} lists no cuDNN conv2d \
             (cuDNN 9 did not load), so the gradients were composed"
        ));
        return;
    }
    // The gradients above ran fused wherever the forward did: the frontend tries these first.
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for op in [Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight] {
            assert_eq!(
                caps.supports(op, dtype),
                caps.supports(Op::Conv2d, dtype),
                "{device} lists {} for {dtype} unlike conv2d",
                op.name()
            );
        }
    }
}
