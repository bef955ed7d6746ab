//! The neural-network ops (`tensor::nn`) on every device that opens, against host f64
//! references written as naive loops here: layer/RMS norm, cross-entropy and NLL with
//! `ignore_index` and label smoothing, dropout statistics, conv2d with stride, padding, dilation
//! and groups (depthwise included), max/avg pooling, and attention with and without masks; plus
//! the bad inputs each op must refuse with a typed error.

mod common;
mod nn_reference;

use cartage::tensor::nn::{Conv2dOptions, CrossEntropy, Reduction};
use cartage::{DType, Device, Error, Generator, Result, Tensor, Var, backend};
use nn_reference::*;

/// The CPU, then every other device that opens (a loud SKIP line for those that do not; a
/// failure when `CARTAGE_REQUIRE` names one).
fn devices(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    for device in [Device::cuda(0), Device::wgpu(0)] {
        match backend(&device) {
            Ok(_) => devices.push(device),
            Err(e) => {
                assert!(
                    !common::required(device.kind()),
                    "{test}: CARTAGE_REQUIRE names {} but {device} did not open: {e}",
                    device.kind().name()
                );
                common::device_missing(test, &device, &e);
            }
        }
    }
    devices
}

fn tensor(data: &[f32], shape: &[usize], device: &Device) -> Result<Tensor> {
    Tensor::from_slice(data, shape, device)
}

// ---------------------------------------------------------------------------------------------
// Normalisation

#[test]
fn layer_norm_and_rms_norm_match_the_reference() -> Result<()> {
    for device in devices("ops_nn/norm") {
        let (rows, d) = (6, 10);
        let data: Vec<f32> = values(rows * d, 1).iter().map(|v| v * 3.0 + 0.5).collect();
        let w = values(d, 2);
        let b = values(d, 3);
        let x = tensor(&data, &[2, 3, d], &device)?;
        let wt = tensor(&w, &[d], &device)?;
        let bt = tensor(&b, &[d], &device)?;
        let eps = 1e-5;
        let cases = [
            (
                "layer_norm",
                x.layer_norm(Some(&wt), Some(&bt), eps)?,
                norm_reference(&data, d, Some(&w), Some(&b), eps, false),
            ),
            (
                "layer_norm plain",
                x.layer_norm(None, None, eps)?,
                norm_reference(&data, d, None, None, eps, false),
            ),
            (
                "layer_norm weight only",
                x.layer_norm(Some(&wt), None, 0.1)?,
                norm_reference(&data, d, Some(&w), None, 0.1, false),
            ),
            (
                "rms_norm",
                x.rms_norm(Some(&wt), eps)?,
                norm_reference(&data, d, Some(&w), None, eps, true),
            ),
            (
                "rms_norm plain",
                x.rms_norm(None, 0.5)?,
                norm_reference(&data, d, None, None, 0.5, true),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got.shape(), &[2, 3, d]);
            assert_close(&format!("{device} {what}"), &got.to_vec()?, &want, 1e-4);
        }

        // A strided input (the transpose of a [d, rows] tensor) is read in place.
        let mut transposed = vec![0.0f32; rows * d];
        for r in 0..rows {
            for c in 0..d {
                transposed[c * rows + r] = data[r * d + c];
            }
        }
        let xt = tensor(&transposed, &[d, rows], &device)?.t()?;
        assert!(!xt.is_contiguous());
        let got = xt.layer_norm(Some(&wt), Some(&bt), eps)?;
        let want = norm_reference(&data, d, Some(&w), Some(&b), eps, false);
        assert_close(&format!("{device} strided layer_norm"), &got.to_vec()?, &want, 1e-4);
        let got = xt.rms_norm(Some(&wt), eps)?;
        let want = norm_reference(&data, d, Some(&w), None, eps, true);
        assert_close(&format!("{device} strided rms_norm"), &got.to_vec()?, &want, 1e-4);
    }
    Ok(())
}

#[test]
fn rms_norm_without_eps_uses_the_dtype_machine_epsilon() -> Result<()> {
    // PyTorch's F.rms_norm(eps=None): eps = torch.finfo(x.dtype).eps, 2⁻²³ for f32, 2⁻⁵² for
    // f64, 2⁻⁷ for bf16. The inputs are small enough that eps changes the result.
    let rms = |x: &[f64], eps: f64| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        x.iter().map(|v| v / (ms + eps).sqrt()).collect()
    };
    let f32_data = [1e-4f32, -2e-4, 3e-4, 5e-5];
    let f32_host: Vec<f64> = f32_data.iter().map(|&v| v as f64).collect();
    let f32_want = rms(&f32_host, 2f64.powi(-23));
    // The default is not some fixed eps: with PyTorch's layer default (1e-5) the values differ.
    assert!((rms(&f32_host, 1e-5)[0] - f32_want[0]).abs() > 0.1);
    for device in devices("ops_nn/rms_norm_default_eps") {
        let x = tensor(&f32_data, &[1, 4], &device)?;
        let got = x.rms_norm(None, None)?.to_vec::<f32>()?;
        assert_close(&format!("{device} f32 default eps"), &got, &f32_want, 1e-4);
    }
    let cpu = Device::cpu();
    let f64_data = [1e-9f64, -2e-9, 3e-9, 5e-10];
    let f64_x = Tensor::from_slice(&f64_data, &[4], &cpu)?;
    let got = f64_x.rms_norm(None, None)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let f64_want = rms(&f64_data, 2f64.powi(-52));
    assert!((rms(&f64_data, 0.0)[0] - f64_want[0]).abs() > 0.1);
    assert_close("cpu f64 default eps", &got, &f64_want, 1e-6);
    let bf16_data = [0.0625f64, -0.125, 0.03125, 0.0];
    let x = Tensor::from_slice(&bf16_data, &[4], &cpu)?.to_dtype(DType::BF16)?;
    let got = x.rms_norm(None, None)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let bf16_want = rms(&bf16_data, 2f64.powi(-7));
    assert!((rms(&bf16_data, 2f64.powi(-23))[0] - bf16_want[0]).abs() > 0.1);
    assert_close("cpu bf16 default eps", &got, &bf16_want, 1e-2);
    // An explicit eps still wins.
    let explicit = f64_x.rms_norm(None, 0.0)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    assert_close("cpu f64 eps 0", &explicit, &rms(&f64_data, 0.0), 1e-6);
    Ok(())
}

#[test]
fn norm_refuses_bad_parameters() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::ones(&[2, 4], DType::F32, &cpu)?;
    let w5 = Tensor::ones(&[5], DType::F32, &cpu)?;
    let err = x.layer_norm(Some(&w5), None, 1e-5).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "layer_norm", .. }), "{err}");
    assert!(err.to_string().contains("weight has shape [5]"), "{err}");
    let b5 = Tensor::ones(&[5], DType::F32, &cpu)?;
    let err = x.layer_norm(None, Some(&b5), 1e-5).unwrap_err();
    assert!(err.to_string().contains("bias has shape [5]"), "{err}");
    let err = x.rms_norm(None, -1.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "rms_norm", .. }), "{err}");
    assert!(err.to_string().contains("-1"), "{err}");
    let w64 = Tensor::ones(&[4], DType::F64, &cpu)?;
    assert!(matches!(x.rms_norm(Some(&w64), 1e-5), Err(Error::DTypeMismatch { .. })));
    let ints = Tensor::ones(&[2, 4], DType::I64, &cpu)?;
    assert!(matches!(
        ints.layer_norm(None, None, 1e-5),
        Err(Error::WrongDType { .. })
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Losses

#[test]
fn cross_entropy_and_nll_match_the_reference() -> Result<()> {
    for device in devices("ops_nn/cross_entropy") {
        let (n, c) = (7, 5);
        let logits: Vec<f32> = values(n * c, 4).iter().map(|v| v * 4.0).collect();
        let x = tensor(&logits, &[n, c], &device)?;
        let logp = x.log_softmax(-1)?;
        for (ignore, target) in [
            (-100i64, vec![0i64, 4, -100, 2, 1, -100, 3]),
            (2, vec![2, 0, 1, 2, 4, 3, 3]),
        ] {
            for s in [0.0, 0.1, 1.0] {
                for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
                    let opts = CrossEntropy {
                        ignore_index: ignore,
                        label_smoothing: s,
                        reduction,
                    };
                    let want = reduce_reference(&cross_entropy_reference(&logits, c, &target, ignore, s), reduction);
                    let what = format!("{device} ignore {ignore} smoothing {s} {reduction:?}");
                    for dtype in [DType::I64, DType::I32] {
                        let t = Tensor::from_slice(&target, &[n], &device)?.to_dtype(dtype)?;
                        let ce = x.cross_entropy(&t, opts)?;
                        let nll = logp.nll_loss(&t, opts)?;
                        let shape: &[usize] = if reduction == Reduction::None { &[n] } else { &[] };
                        assert_eq!(ce.shape(), shape, "{what}");
                        assert_eq!(nll.shape(), shape, "{what}");
                        assert_close(&format!("cross_entropy {what} {dtype}"), &ce.to_vec()?, &want, 1e-5);
                        assert_close(&format!("nll_loss {what} {dtype}"), &nll.to_vec()?, &want, 1e-5);
                    }
                }
            }
        }

        // A strided logits view, and a single row with a scalar target.
        let xt = tensor(&logits, &[n, c], &device)?.t()?.contiguous()?.t()?;
        assert!(!xt.is_contiguous());
        let target = Tensor::from_slice(&[1i64, 0, 2, 2, 4, 3, 0], &[n], &device)?;
        let want = reduce_reference(
            &cross_entropy_reference(&logits, c, &[1, 0, 2, 2, 4, 3, 0], -100, 0.0),
            Reduction::Mean,
        );
        assert_close(
            "strided",
            &xt.cross_entropy(&target, CrossEntropy::default())?.to_vec()?,
            &want,
            1e-5,
        );
        let row = tensor(&logits[..c], &[c], &device)?;
        let scalar_target = Tensor::from_slice(&[3i64], &[], &device)?;
        let want = cross_entropy_reference(&logits[..c], c, &[3], -100, 0.0)[0].unwrap();
        let opts = CrossEntropy {
            reduction: Reduction::None,
            ..Default::default()
        };
        let got = row.cross_entropy(&scalar_target, opts)?;
        assert_eq!(got.shape(), &[] as &[usize]);
        assert_close("single row", &got.to_vec()?, &[want], 1e-5);
        let got = row.log_softmax(-1)?.nll_loss(&scalar_target, CrossEntropy::default())?;
        assert_close("single row nll", &got.to_vec()?, &[want], 1e-5);

        // Every row ignored: the mean is NaN (0 / 0), as in PyTorch; the sum is 0.
        let ignored = Tensor::from_slice(&[-100i64; 7], &[n], &device)?;
        assert!(
            x.cross_entropy(&ignored, CrossEntropy::default())?
                .item::<f32>()?
                .is_nan()
        );
        assert!(
            logp.nll_loss(&ignored, CrossEntropy::default())?
                .item::<f32>()?
                .is_nan()
        );
        let sum = CrossEntropy {
            reduction: Reduction::Sum,
            ..Default::default()
        };
        assert_eq!(x.cross_entropy(&ignored, sum)?.item::<f32>()?, 0.0);
    }
    Ok(())
}

#[test]
fn losses_refuse_bad_targets() -> Result<()> {
    for device in devices("ops_nn/loss_bad") {
        let x = Tensor::zeros(&[3, 4], DType::F32, &device)?;
        let bad = Tensor::from_slice(&[0i64, 4, 1], &[3], &device)?;
        // Some devices report a bad index only at the next read (the first one found since the
        // last read), so each loss is computed and read on its own.
        let read = |loss: Result<Tensor>| loss.and_then(|loss| loss.to_vec::<f32>());
        let ce = read(x.cross_entropy(&bad, CrossEntropy::default()));
        let nll = read(x.nll_loss(&bad, CrossEntropy::default()));
        for (op, result) in [("cross_entropy", ce), ("gather", nll)] {
            match result {
                Err(Error::IndexOutOfRange {
                    op: got, index, size, ..
                }) => {
                    assert_eq!((got, index, size), (op, 4, 4), "{device} {op}");
                }
                other => panic!("{device} {op}: expected IndexOutOfRange, got {other:?}"),
            }
        }
        let negative = Tensor::from_slice(&[0i64, -1, 1], &[3], &device)?;
        assert!(matches!(
            x.cross_entropy(&negative, CrossEntropy::default())
                .and_then(|loss| loss.to_vec::<f32>()),
            Err(Error::IndexOutOfRange { index: -1, .. })
        ));
    }
    let cpu = Device::cpu();
    let x = Tensor::zeros(&[3, 4], DType::F32, &cpu)?;
    let short = Tensor::from_slice(&[0i64, 1], &[2], &cpu)?;
    let err = x.cross_entropy(&short, CrossEntropy::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                op: "cross_entropy",
                ..
            }
        ),
        "{err}"
    );
    let float_target = Tensor::zeros(&[3], DType::F32, &cpu)?;
    assert!(matches!(
        x.nll_loss(&float_target, CrossEntropy::default()),
        Err(Error::WrongDType { op: "nll_loss", .. })
    ));
    let ok = Tensor::from_slice(&[0i64, 1, 2], &[3], &cpu)?;
    let err = x
        .cross_entropy(
            &ok,
            CrossEntropy {
                label_smoothing: 1.5,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("1.5"), "{err}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Dropout

#[test]
fn dropout_drops_at_the_rate_asked_and_scales_the_rest() -> Result<()> {
    for device in devices("ops_nn/dropout") {
        let n = 20_000;
        let data: Vec<f32> = values(n, 5).iter().map(|v| v + 2.0).collect();
        let x = tensor(&data, &[100, 200], &device)?;
        for p in [0.1, 0.5, 0.8] {
            let mut rng = Generator::new(11);
            let y = x.dropout(p, &mut rng, true)?.to_vec::<f32>()?;
            let scale = 1.0 / (1.0 - p);
            let mut dropped = 0;
            for (&got, &v) in y.iter().zip(&data) {
                if got == 0.0 {
                    dropped += 1;
                } else {
                    assert!(
                        ((got as f64) - v as f64 * scale).abs() <= 1e-5 * scale * 3.0,
                        "{device} p {p}: {got} from {v}"
                    );
                }
            }
            // Binomial(n, p): 5 standard deviations either side.
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let expected = n as f64 * p;
            assert!(
                (dropped as f64 - expected).abs() < 5.0 * sd,
                "{device} p {p}: {dropped} of {n} dropped"
            );
            // The generator moved on: a second draw drops other elements; a fresh one replays.
            let again = x.dropout(p, &mut rng, true)?.to_vec::<f32>()?;
            assert_ne!(again, y, "{device} p {p}");
            let replay = x.dropout(p, &mut Generator::new(11), true)?.to_vec::<f32>()?;
            assert_eq!(replay, y, "{device} p {p}");
        }
        // Evaluation and p = 0 are the identity, drawing nothing; p = 1 gives zeros.
        let mut rng = Generator::new(3);
        let eval = x.dropout(0.5, &mut rng, false)?;
        assert!(eval.shares_storage(&x));
        assert_eq!(eval.to_vec::<f32>()?, data);
        assert!(x.dropout(0.0, &mut rng, true)?.shares_storage(&x));
        assert_eq!(rng.offset(), 0);
        let all = x.dropout(1.0, &mut rng, true)?;
        assert_eq!(all.shape(), x.shape());
        assert!(all.to_vec::<f32>()?.iter().all(|&v| v == 0.0));
    }
    Ok(())
}

#[test]
fn dropout_refuses_bad_probabilities() -> Result<()> {
    let x = Tensor::ones(&[4], DType::F32, &Device::cpu())?;
    let mut rng = Generator::new(0);
    for p in [-0.1, 1.5, f64::NAN] {
        for train in [true, false] {
            let err = x.dropout(p, &mut rng, train).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { op: "dropout", .. }), "{err}");
            assert!(err.to_string().contains(&format!("{p}")), "{err}");
        }
    }
    let ints = Tensor::ones(&[4], DType::I32, &Device::cpu())?;
    assert!(matches!(
        ints.dropout(0.5, &mut rng, true),
        Err(Error::WrongDType { .. })
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Convolution

#[test]
fn conv2d_matches_the_reference() -> Result<()> {
    let opts = |stride, padding, dilation, groups| Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    };
    // (input shape, weight shape, options, with bias)
    let cases: Vec<([usize; 4], [usize; 4], Conv2dOptions, bool)> = vec![
        ([2, 3, 7, 6], [4, 3, 3, 2], opts([1, 1], [0, 0], [1, 1], 1), true),
        ([2, 3, 7, 6], [4, 3, 3, 2], opts([2, 1], [1, 2], [1, 2], 1), true),
        ([1, 2, 5, 5], [3, 2, 3, 3], opts([2, 2], [1, 1], [2, 2], 1), false),
        ([3, 6, 6, 5], [9, 2, 3, 3], opts([1, 2], [1, 0], [1, 1], 3), true),
        // Depthwise, multiplier 1 and 2.
        ([2, 4, 6, 6], [4, 1, 3, 3], opts([1, 1], [1, 1], [1, 1], 4), true),
        ([2, 4, 5, 7], [8, 1, 2, 3], opts([2, 1], [0, 1], [2, 1], 4), false),
        // 1×1 kernel (the window view is the input itself).
        ([2, 3, 4, 4], [5, 3, 1, 1], opts([1, 1], [0, 0], [1, 1], 1), true),
        // Kernel as large as the padded input: one output position.
        ([1, 2, 3, 3], [2, 2, 5, 5], opts([3, 3], [1, 1], [1, 1], 1), false),
    ];
    for device in devices("ops_nn/conv2d") {
        for (k, &(xs, ws, opts, with_bias)) in cases.iter().enumerate() {
            let xd = values(xs.iter().product(), 10 + k as u64);
            let wd = values(ws.iter().product(), 20 + k as u64);
            let bd = values(ws[0], 30 + k as u64);
            let x = tensor(&xd, &xs, &device)?;
            let w = tensor(&wd, &ws, &device)?;
            let b = tensor(&bd, &[ws[0]], &device)?;
            let bias = with_bias.then_some(&b);
            let (want, shape) = conv_reference(&xd, xs, &wd, ws, with_bias.then_some(&bd[..]), opts);
            let got = x.conv2d(&w, bias, opts)?;
            assert_eq!(got.shape(), &shape, "{device} case {k}");
            assert!(got.is_contiguous(), "{device} case {k}");
            assert_close(
                &format!("{device} conv2d case {k} {opts:?}"),
                &got.to_vec()?,
                &want,
                1e-4,
            );
        }

        // A strided input: an [N, H, W, C] buffer seen as [N, C, H, W].
        let (xs, ws) = ([2usize, 3, 5, 4], [2usize, 3, 3, 3]);
        let xd = values(xs.iter().product(), 40);
        let mut nhwc = vec![0.0f32; xd.len()];
        let [n, c, h, w] = xs;
        let st = strides(&xs);
        for b in 0..n {
            for ci in 0..c {
                for y in 0..h {
                    for xx in 0..w {
                        nhwc[((b * h + y) * w + xx) * c + ci] = xd[b * st[0] + ci * st[1] + y * st[2] + xx];
                    }
                }
            }
        }
        let x = tensor(&nhwc, &[n, h, w, c], &device)?
            .transpose(1, 3)?
            .transpose(2, 3)?;
        assert_eq!(x.shape(), &xs);
        assert!(!x.is_contiguous());
        let wd = values(ws.iter().product(), 41);
        let weight = tensor(&wd, &ws, &device)?;
        let o = opts([1, 2], [1, 1], [1, 1], 1);
        let (want, _) = conv_reference(&xd, xs, &wd, ws, None, o);
        assert_close(
            &format!("{device} strided conv2d"),
            &x.conv2d(&weight, None, o)?.to_vec()?,
            &want,
            1e-4,
        );

        // Unbatched [C, H, W].
        let x3 = tensor(&xd[..c * h * w], &[c, h, w], &device)?;
        let (want, _) = conv_reference(&xd[..c * h * w], [1, c, h, w], &wd, ws, None, o);
        let got = x3.conv2d(&weight, None, o)?;
        assert_eq!(got.rank(), 3);
        assert_close(&format!("{device} unbatched conv2d"), &got.to_vec()?, &want, 1e-4);
    }
    Ok(())
}

#[test]
fn conv2d_refuses_bad_shapes() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::zeros(&[1, 3, 5, 5], DType::F32, &cpu)?;
    let w4 = Tensor::zeros(&[2, 4, 3, 3], DType::F32, &cpu)?;
    let err = x.conv2d(&w4, None, Conv2dOptions::default()).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "conv2d", .. }), "{err}");
    assert!(
        err.to_string()
            .contains("input has 3 channels but weight expects 4 (× groups 1)"),
        "{err}"
    );

    let big = Tensor::zeros(&[2, 3, 8, 3], DType::F32, &cpu)?;
    let err = x
        .conv2d(
            &big,
            None,
            Conv2dOptions {
                padding: [1, 1],
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "conv2d", .. }), "{err}");
    assert!(err.to_string().contains("spans 8 along the height"), "{err}");
    assert!(err.to_string().contains("only 7 (5 + 2 × padding 1)"), "{err}");
    let dilated = Tensor::zeros(&[2, 3, 3, 3], DType::F32, &cpu)?;
    let err = x
        .conv2d(
            &dilated,
            None,
            Conv2dOptions {
                dilation: [1, 3],
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("spans 7 along the width"), "{err}");

    let w = Tensor::zeros(&[4, 1, 3, 3], DType::F32, &cpu)?;
    let groups = |groups| Conv2dOptions {
        groups,
        ..Default::default()
    };
    let err = x.conv2d(&w, None, groups(2)).unwrap_err();
    assert!(
        err.to_string()
            .contains("input has 3 channels but weight expects 1 (× groups 2)"),
        "{err}"
    );
    let x6 = Tensor::zeros(&[1, 6, 5, 5], DType::F32, &cpu)?;
    let w5 = Tensor::zeros(&[5, 2, 3, 3], DType::F32, &cpu)?;
    let err = x6.conv2d(&w5, None, groups(3)).unwrap_err();
    assert!(
        err.to_string()
            .contains("5 output channels, not a multiple of groups 3"),
        "{err}"
    );
    assert!(matches!(
        x.conv2d(&w, None, groups(0)),
        Err(Error::InvalidArgument { .. })
    ));
    let stride0 = Conv2dOptions {
        stride: [0, 1],
        ..Default::default()
    };
    let w3 = Tensor::zeros(&[2, 3, 3, 3], DType::F32, &cpu)?;
    assert!(
        x.conv2d(&w3, None, stride0)
            .unwrap_err()
            .to_string()
            .contains("stride (0)")
    );
    let huge = Conv2dOptions {
        padding: [usize::MAX / 2, 0],
        ..Default::default()
    };
    assert!(matches!(x.conv2d(&w3, None, huge), Err(Error::ShapeMismatch { .. })));
    // An empty batch is not an error: an empty output of the right shape.
    let empty = Tensor::zeros(&[0, 3, 5, 5], DType::F32, &cpu)?;
    assert_eq!(
        empty.conv2d(&w3, None, Conv2dOptions::default())?.shape(),
        &[0, 2, 3, 3]
    );
    assert_eq!(empty.max_pool2d([2, 2], [2, 2], [0, 0])?.shape(), &[0, 3, 2, 2]);

    let bias = Tensor::zeros(&[3], DType::F32, &cpu)?;
    let err = x.conv2d(&w3, Some(&bias), Conv2dOptions::default()).unwrap_err();
    assert!(err.to_string().contains("the bias must be [2]"), "{err}");
    let flat = Tensor::zeros(&[3, 5], DType::F32, &cpu)?;
    assert!(matches!(
        flat.conv2d(&w3, None, Conv2dOptions::default()),
        Err(Error::ShapeMismatch { .. })
    ));
    let ints = Tensor::zeros(&[1, 3, 5, 5], DType::I32, &cpu)?;
    let wi = Tensor::zeros(&[2, 3, 3, 3], DType::I32, &cpu)?;
    assert!(matches!(
        ints.conv2d(&wi, None, Conv2dOptions::default()),
        Err(Error::WrongDType { .. })
    ));
    let w64 = Tensor::zeros(&[2, 3, 3, 3], DType::F64, &cpu)?;
    assert!(matches!(
        x.conv2d(&w64, None, Conv2dOptions::default()),
        Err(Error::DTypeMismatch { .. })
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Pooling

#[test]
fn pooling_matches_the_reference() -> Result<()> {
    // (input shape, kernel, stride, padding)
    type Case = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);
    let cases: [Case; 5] = [
        ([2, 3, 6, 6], [2, 2], [2, 2], [0, 0]),
        ([2, 3, 7, 5], [3, 3], [2, 2], [1, 1]),
        ([1, 2, 5, 6], [3, 2], [1, 2], [1, 0]),
        ([1, 1, 4, 4], [4, 4], [1, 1], [2, 2]),
        ([2, 2, 5, 5], [1, 1], [2, 3], [0, 0]),
    ];
    for device in devices("ops_nn/pool") {
        for (k, &(xs, kernel, stride, padding)) in cases.iter().enumerate() {
            // Negative values: a max pool that padded with zeros would be caught.
            let xd: Vec<f32> = values(xs.iter().product(), 50 + k as u64)
                .iter()
                .map(|v| v - 1.5)
                .collect();
            let x = tensor(&xd, &xs, &device)?;
            let what = format!("{device} case {k} kernel {kernel:?} stride {stride:?} padding {padding:?}");
            let (want, shape) = pool_reference(&xd, xs, kernel, stride, padding, PoolRef::Max);
            let got = x.max_pool2d(kernel, stride, padding)?;
            assert_eq!(got.shape(), &shape, "{what}");
            assert_close(&format!("max_pool2d {what}"), &got.to_vec()?, &want, 1e-6);
            for count_include_pad in [true, false] {
                let kind = PoolRef::Avg { count_include_pad };
                let (want, _) = pool_reference(&xd, xs, kernel, stride, padding, kind);
                let got = x.avg_pool2d(kernel, stride, padding, count_include_pad)?;
                assert_eq!(got.shape(), &shape, "{what}");
                assert_close(
                    &format!("avg_pool2d {what} {count_include_pad}"),
                    &got.to_vec()?,
                    &want,
                    1e-5,
                );
            }
        }
        // A strided input and an unbatched one.
        let xd = values(2 * 3 * 6 * 6, 60);
        let x = tensor(&xd, &[2, 3, 6, 6], &device)?;
        let xt = x.transpose(2, 3)?;
        let mut t = vec![0.0f32; xd.len()];
        for p in 0..6 {
            for y in 0..6 {
                for xx in 0..6 {
                    t[(p * 6 + y) * 6 + xx] = xd[(p * 6 + xx) * 6 + y];
                }
            }
        }
        let (want, _) = pool_reference(&t, [2, 3, 6, 6], [3, 2], [2, 1], [1, 1], PoolRef::Max);
        assert_close(
            "strided max_pool2d",
            &xt.max_pool2d([3, 2], [2, 1], [1, 1])?.to_vec()?,
            &want,
            1e-6,
        );
        let x3 = tensor(&xd[..36], &[1, 6, 6], &device)?;
        let (want, _) = pool_reference(
            &xd[..36],
            [1, 1, 6, 6],
            [2, 2],
            [2, 2],
            [0, 0],
            PoolRef::Avg {
                count_include_pad: true,
            },
        );
        let got = x3.avg_pool2d([2, 2], [2, 2], [0, 0], true)?;
        assert_eq!(got.shape(), &[1, 3, 3]);
        assert_close("unbatched avg_pool2d", &got.to_vec()?, &want, 1e-6);
    }
    Ok(())
}

/// The first NaN tap of each window, else its first largest tap, as `(value, y·W + x)`; padding
/// never wins.
fn max_pool_with_indices_reference(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> (Vec<f32>, Vec<i64>) {
    let oh = (h + 2 * padding[0] - kernel[0]) / stride[0] + 1;
    let ow = (w + 2 * padding[1] - kernel[1]) / stride[1] + 1;
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut best: Option<(f32, i64)> = None;
                for a in 0..kernel[0] {
                    for b in 0..kernel[1] {
                        let y = (i * stride[0] + a) as i64 - padding[0] as i64;
                        let xx = (j * stride[1] + b) as i64 - padding[1] as i64;
                        if y < 0 || xx < 0 || y >= h as i64 || xx >= w as i64 {
                            continue;
                        }
                        let v = x[plane * h * w + (y as usize) * w + xx as usize];
                        let better = match best {
                            None => true,
                            Some((m, _)) => !m.is_nan() && (v.is_nan() || v > m),
                        };
                        if better {
                            best = Some((v, y * w as i64 + xx));
                        }
                    }
                }
                let (v, at) = best.expect("padding is at most half the kernel");
                values.push(v);
                indices.push(at);
            }
        }
    }
    (values, indices)
}

#[test]
fn max_pool2d_with_indices_names_the_first_maximum() -> Result<()> {
    let shape = [2, 3, 7, 6];
    let numel: usize = shape.iter().product();
    for device in devices("ops_nn/max_pool2d_with_indices") {
        // Few distinct values, so windows hold ties; some NaN and -inf; one plane all -inf.
        let mut xd: Vec<f32> = values(numel, 77).iter().map(|v| (v * 4.0).round()).collect();
        for k in (5..numel).step_by(23) {
            xd[k] = f32::NAN;
        }
        for k in (9..numel).step_by(17) {
            xd[k] = f32::NEG_INFINITY;
        }
        for v in &mut xd[42..84] {
            *v = f32::NEG_INFINITY;
        }
        let x = tensor(&xd, &shape, &device)?;
        for (kernel, stride, padding) in [
            ([3, 3], [2, 2], [1, 1]),
            ([2, 3], [1, 2], [1, 1]),
            ([2, 2], [2, 2], [0, 0]),
        ] {
            let what = format!("{device} kernel {kernel:?} stride {stride:?} padding {padding:?}");
            let (want_v, want_i) = max_pool_with_indices_reference(&xd, shape, kernel, stride, padding);
            let (got_v, got_i) = x.max_pool2d_with_indices(kernel, stride, padding)?;
            assert_eq!(got_i.dtype(), DType::I64, "{what}");
            assert_eq!(got_i.to_vec::<i64>()?, want_i, "indices, {what}");
            let got_v: Vec<f32> = got_v.to_vec()?;
            for (k, (g, w)) in got_v.iter().zip(&want_v).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{what} at {k}: {g} vs {w}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn pooling_refuses_bad_windows() -> Result<()> {
    let x = Tensor::zeros(&[1, 1, 4, 4], DType::F32, &Device::cpu())?;
    let err = x.max_pool2d([5, 2], [1, 1], [0, 0]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "max_pool2d", .. }), "{err}");
    assert!(err.to_string().contains("spans 5 along the height"), "{err}");
    let err = x.avg_pool2d([2, 2], [1, 1], [0, 2], true).unwrap_err();
    assert!(err.to_string().contains("at most half the kernel"), "{err}");
    assert!(x.max_pool2d([2, 2], [0, 1], [0, 0]).is_err());
    let flat = Tensor::zeros(&[4, 4], DType::F32, &Device::cpu())?;
    assert!(matches!(
        flat.max_pool2d([2, 2], [2, 2], [0, 0]),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Attention

#[test]
fn attention_matches_the_reference() -> Result<()> {
    let (b0, b1, l, s, e, ev) = (2, 3, 4, 6, 5, 7);
    let b = b0 * b1;
    let qd = values(b * l * e, 70);
    let kd = values(b * s * e, 71);
    let vd = values(b * s * ev, 72);
    let dims = [b, l, s, e, ev];
    let default_scale = 1.0 / (e as f64).sqrt();
    let bool_mask: Vec<bool> = (0..l * s).map(|i| i % 3 != 1).collect();
    let float_mask: Vec<f32> = values(b1 * l * s, 73);
    for device in devices("ops_nn/attention") {
        let q = tensor(&qd, &[b0, b1, l, e], &device)?;
        let k = tensor(&kd, &[b0, b1, s, e], &device)?;
        let v = tensor(&vd, &[b0, b1, s, ev], &device)?;
        let sdpa = Tensor::scaled_dot_product_attention;

        let got = sdpa(&q, &k, &v, None, false, None)?;
        assert_eq!(got.shape(), &[b0, b1, l, ev]);
        let want = attention_reference(&qd, &kd, &vd, dims, default_scale, |_, _, _| Some(0.0));
        assert_close(&format!("{device} plain"), &got.to_vec()?, &want, 1e-5);

        let got = sdpa(&q, &k, &v, None, false, Some(0.3))?;
        let want = attention_reference(&qd, &kd, &vd, dims, 0.3, |_, _, _| Some(0.0));
        assert_close(&format!("{device} scale"), &got.to_vec()?, &want, 1e-5);

        let got = sdpa(&q, &k, &v, None, true, None)?;
        let want = attention_reference(&qd, &kd, &vd, dims, default_scale, |_, i, j| (j <= i).then_some(0.0));
        assert_close(&format!("{device} causal"), &got.to_vec()?, &want, 1e-5);

        // A bool mask [L, S] broadcast over the batch.
        let m = Tensor::from_slice(&bool_mask, &[l, s], &device)?;
        let got = sdpa(&q, &k, &v, Some(&m), false, None)?;
        let want = attention_reference(&qd, &kd, &vd, dims, default_scale, |_, i, j| {
            bool_mask[i * s + j].then_some(0.0)
        });
        assert_close(&format!("{device} bool mask"), &got.to_vec()?, &want, 1e-5);

        // A float mask [b1, L, S] added, combined with causal.
        let fm = tensor(&float_mask, &[b1, l, s], &device)?;
        let got = sdpa(&q, &k, &v, Some(&fm), true, None)?;
        let want = attention_reference(&qd, &kd, &vd, dims, default_scale, |bi, i, j| {
            (j <= i).then_some(float_mask[((bi % b1) * l + i) * s + j] as f64)
        });
        assert_close(&format!("{device} float mask + causal"), &got.to_vec()?, &want, 1e-5);

        // Batch dims broadcast like matmul: one key/value set [b1, S, E] for every b0.
        let kb = tensor(&kd[..b1 * s * e], &[b1, s, e], &device)?;
        let vb = tensor(&vd[..b1 * s * ev], &[b1, s, ev], &device)?;
        let got = sdpa(&q, &kb, &vb, None, false, None)?;
        assert_eq!(got.shape(), &[b0, b1, l, ev]);
        let mut kr = kd[..b1 * s * e].to_vec();
        kr.extend_from_slice(&kd[..b1 * s * e]);
        let mut vr = vd[..b1 * s * ev].to_vec();
        vr.extend_from_slice(&vd[..b1 * s * ev]);
        let want = attention_reference(&qd, &kr, &vr, dims, default_scale, |_, _, _| Some(0.0));
        assert_close(&format!("{device} broadcast batch"), &got.to_vec()?, &want, 1e-5);

        // Rows that see no key give 0 (as PyTorch's do from 2.5 on), the others their
        // attention: here every second query row is fully masked, alone and with causal.
        let alternate: Vec<bool> = (0..l * s).map(|i| (i / s) % 2 == 0).collect();
        let alternate = Tensor::from_slice(&alternate, &[l, s], &device)?;
        for causal in [false, true] {
            let got = sdpa(&q, &k, &v, Some(&alternate), causal, None)?.to_vec::<f32>()?;
            let want = attention_reference(&qd, &kd, &vd, dims, default_scale, |_, i, j| {
                (i % 2 == 0 && (!causal || j <= i)).then_some(0.0)
            });
            assert_close(
                &format!("{device} rows that see no key, causal {causal}"),
                &got,
                &want,
                1e-5,
            );
        }
    }
    Ok(())
}

/// Where a device fuses attention (`Op::Attention` listed for f32, bf16 or f16), the fused kernel
/// agrees with the composed path (forced by an all-true mask) on the same inputs, causal and not,
/// with sequence lengths that are not multiples of any tile: f32 to a few units of its rounding
/// (exact f32 products on both paths), the 16-bit types to their own.
#[test]
fn fused_attention_matches_the_composed_path() -> Result<()> {
    let mut fused_somewhere = false;
    for device in devices("ops_nn/fused_attention") {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            if !backend(&device)?.capabilities().supports(cartage::Op::Attention, dtype) {
                continue;
            }
            fused_somewhere = true;
            for (l, s, e, causal) in [(100, 100, 64, true), (37, 129, 64, false), (130, 130, 128, true)] {
                let (b0, b1) = (2, 3);
                let q = tensor(&values(b0 * b1 * l * e, 80), &[b0, b1, l, e], &device)?.to_dtype(dtype)?;
                let k = tensor(&values(b0 * b1 * s * e, 81), &[b0, b1, s, e], &device)?.to_dtype(dtype)?;
                let v = tensor(&values(b0 * b1 * s * e, 82), &[b0, b1, s, e], &device)?.to_dtype(dtype)?;
                // A zero mask that needs its own gradient: the composed path.
                let all = Var::new(Tensor::zeros(&[l, s], dtype, &device)?)?.tensor();
                let sdpa = Tensor::scaled_dot_product_attention;
                let fused = sdpa(&q, &k, &v, None, causal, None)?.to_dtype(DType::F32)?;
                let composed = sdpa(&q, &k, &v, Some(&all), causal, None)?.to_dtype(DType::F32)?;
                let want: Vec<f64> = composed.to_vec::<f32>()?.iter().map(|&x| f64::from(x)).collect();
                let what = format!("{device} {dtype} l={l} s={s} e={e} causal={causal}");
                let tolerance = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
                assert_close(&what, &fused.to_vec::<f32>()?, &want, tolerance);
            }
        }
    }
    if !fused_somewhere {
        common::skip("ops_nn/fused_attention: no device here fuses attention");
    }
    Ok(())
}

#[test]
fn attention_refuses_bad_shapes() -> Result<()> {
    let cpu = Device::cpu();
    let q = Tensor::zeros(&[2, 4, 5], DType::F32, &cpu)?;
    let k = Tensor::zeros(&[2, 6, 3], DType::F32, &cpu)?;
    let v = Tensor::zeros(&[2, 6, 7], DType::F32, &cpu)?;
    let sdpa = Tensor::scaled_dot_product_attention;
    let err = sdpa(&q, &k, &v, None, false, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("the query has embedding size 5 but the key has 3"),
        "{err}"
    );
    let k = Tensor::zeros(&[2, 6, 5], DType::F32, &cpu)?;
    let v5 = Tensor::zeros(&[2, 5, 7], DType::F32, &cpu)?;
    let err = sdpa(&q, &k, &v5, None, false, None).unwrap_err();
    assert!(
        err.to_string().contains("the key has 6 positions but the value has 5"),
        "{err}"
    );
    let mask = Tensor::zeros(&[4, 5], DType::Bool, &cpu)?;
    let err = sdpa(&q, &k, &v, Some(&mask), false, None).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("must broadcast to the attention scores"),
        "{err}"
    );
    let mask64 = Tensor::zeros(&[4, 6], DType::F64, &cpu)?;
    assert!(matches!(
        sdpa(&q, &k, &v, Some(&mask64), false, None),
        Err(Error::DTypeMismatch { .. })
    ));
    let flat = Tensor::zeros(&[5], DType::F32, &cpu)?;
    assert!(matches!(
        sdpa(&flat, &k, &v, None, false, None),
        Err(Error::ShapeMismatch { .. })
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// No host round trip

#[test]
fn nn_ops_never_read_back_to_the_host() -> Result<()> {
    let cpu = Device::cpu();
    let x = tensor(&values(2 * 3 * 6 * 6, 80), &[2, 3, 6, 6], &cpu)?;
    let w = tensor(&values(4 * 3 * 3 * 3, 81), &[4, 3, 3, 3], &cpu)?;
    let logits = tensor(&values(5 * 4, 82), &[5, 4], &cpu)?;
    let target = Tensor::from_slice(&[0i64, -100, 3, 2, -100], &[5], &cpu)?;
    let q = tensor(&values(2 * 4 * 8, 83), &[2, 4, 8], &cpu)?;
    let mut rng = Generator::new(1);
    let first = line!();
    let outputs = [
        x.layer_norm(None, None, 1e-5)?,
        x.rms_norm(None, 1e-5)?,
        logits.cross_entropy(&target, CrossEntropy::default())?,
        logits.log_softmax(-1)?.nll_loss(&target, CrossEntropy::default())?,
        x.dropout(0.5, &mut rng, true)?,
        x.conv2d(&w, None, Conv2dOptions::default())?,
        x.max_pool2d([2, 2], [2, 2], [1, 1])?,
        x.avg_pool2d([3, 3], [1, 1], [1, 1], false)?,
        Tensor::scaled_dot_product_attention(&q, &q, &q, None, true, None)?,
    ];
    let last = line!();
    let stats = cartage::stats();
    for (site, count) in &stats.sync_sites {
        let here = site.file().ends_with("ops_nn.rs") && (first..last).contains(&site.line());
        assert!(
            !here && !site.file().contains("tensor/nn/"),
            "{count} host syncs at {site}, inside an NN op"
        );
    }
    // The mean loss divided on the device by a count made there: NaN-free and read only now.
    assert!(outputs[2].item::<f32>()?.is_finite());
    Ok(())
}

#[test]
fn nn_ops_keep_f64_precision() -> Result<()> {
    for device in devices("ops_nn/f64") {
        let caps = backend(&device)?.capabilities().clone();
        if !caps.supports(cartage::Op::Matmul, DType::F64) {
            common::skip(&format!("ops_nn/f64 on {device}: no f64 matmul"));
            continue;
        }
        let f64s = |data: &[f32], shape: &[usize]| tensor(data, shape, &device)?.to_dtype(DType::F64);
        let read = |t: &Tensor| -> Result<Vec<f32>> { t.to_dtype(DType::F32)?.to_vec() };
        let (xs, ws) = ([2, 4, 6, 5], [6, 2, 3, 2]);
        let xd = values(xs.iter().product(), 90);
        let wd = values(ws.iter().product(), 91);
        let opts = Conv2dOptions {
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 2],
            groups: 2,
        };
        let (want, _) = conv_reference(&xd, xs, &wd, ws, None, opts);
        let got = f64s(&xd, &xs)?.conv2d(&f64s(&wd, &ws)?, None, opts)?;
        assert_eq!(got.dtype(), DType::F64);
        assert_close(&format!("{device} f64 conv2d"), &read(&got)?, &want, 1e-6);
        let (want, _) = pool_reference(
            &xd,
            xs,
            [3, 3],
            [2, 2],
            [1, 1],
            PoolRef::Avg {
                count_include_pad: false,
            },
        );
        let got = f64s(&xd, &xs)?.avg_pool2d([3, 3], [2, 2], [1, 1], false)?;
        assert_close(&format!("{device} f64 avg_pool2d"), &read(&got)?, &want, 1e-6);
        let want = norm_reference(&xd, 5, None, None, 1e-5, false);
        let got = f64s(&xd, &xs)?.layer_norm(None, None, 1e-5)?;
        assert_close(&format!("{device} f64 layer_norm"), &read(&got)?, &want, 1e-6);
    }
    Ok(())
}

#[test]
fn element_wise_losses_match_the_reference() -> Result<()> {
    let x = [0.3f32, -2.0, 1.5, 0.05, -0.7, 40.0];
    let t = [0.0f32, 1.0, 1.0, 0.5, 0.2, 1.0];
    let n = x.len() as f64;
    let pairs: Vec<(f64, f64)> = x.iter().zip(&t).map(|(&a, &b)| (a as f64, b as f64)).collect();
    let mse: f64 = pairs.iter().map(|(a, b)| (a - b).powi(2)).sum::<f64>() / n;
    let l1: f64 = pairs.iter().map(|(a, b)| (a - b).abs()).sum();
    let beta = 0.5;
    let smooth: Vec<f64> = pairs
        .iter()
        .map(|(a, b)| {
            let d = (a - b).abs();
            if d < beta { 0.5 * d * d / beta } else { d - 0.5 * beta }
        })
        .collect();
    let bce = |a: f64, b: f64, p: f64| -> f64 {
        let sig = 1.0 / (1.0 + (-a).exp());
        -(p * b * sig.ln() + (1.0 - b) * (1.0 - sig).ln())
    };
    for device in devices("element_wise_losses_match_the_reference") {
        let xs = tensor(&x, &[2, 3], &device)?;
        let ts = tensor(&t, &[2, 3], &device)?;
        let close = |got: f64, want: f64, what: &str| {
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{device} {what}: {got} vs {want}"
            );
        };
        close(xs.mse_loss(&ts, Reduction::Mean)?.item::<f32>()? as f64, mse, "mse");
        close(xs.l1_loss(&ts, Reduction::Sum)?.item::<f32>()? as f64, l1, "l1");
        let rows = xs.smooth_l1_loss(&ts, beta, Reduction::None)?.to_vec::<f32>()?;
        for (got, want) in rows.iter().zip(&smooth) {
            close(*got as f64, *want, "smooth_l1");
        }
        let pos = tensor(&[1.0, 2.0, 0.5], &[3], &device)?;
        let rows = xs
            .binary_cross_entropy_with_logits(&ts, Some(&pos), Reduction::None)?
            .to_vec::<f32>()?;
        for (i, got) in rows.iter().enumerate() {
            let (a, b) = pairs[i];
            // x = 40 saturates the sigmoid: the reference's 1 − σ underflows, the stable form
            // gives (1 − t)·x exactly.
            let want = if a > 30.0 {
                (1.0 - b) * a
            } else {
                bce(a, b, [1.0, 2.0, 0.5][i % 3])
            };
            close(*got as f64, want, "bce_with_logits");
        }
    }
    Ok(())
}

#[test]
fn element_wise_losses_refuse_bad_operands() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::zeros(&[2, 3], DType::F32, &cpu)?;
    let wrong_shape = Tensor::zeros(&[3], DType::F32, &cpu)?;
    let wrong_dtype = Tensor::zeros(&[2, 3], DType::F64, &cpu)?;
    let ints = Tensor::zeros(&[2, 3], DType::I64, &cpu)?;
    assert!(matches!(
        x.mse_loss(&wrong_shape, Reduction::Mean),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        x.l1_loss(&wrong_dtype, Reduction::Mean),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(
        ints.mse_loss(&ints, Reduction::Mean).is_err(),
        "integer losses are refused"
    );
    assert!(matches!(
        x.smooth_l1_loss(&x, -1.0, Reduction::Mean),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        x.smooth_l1_loss(&x, f64::NAN, Reduction::Mean),
        Err(Error::InvalidArgument { .. })
    ));
    let bad_weight = Tensor::ones(&[3], DType::F64, &cpu)?;
    assert!(
        x.binary_cross_entropy_with_logits(&x, Some(&bad_weight), Reduction::Mean)
            .is_err()
    );
    Ok(())
}
