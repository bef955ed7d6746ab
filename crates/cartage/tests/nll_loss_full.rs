//! `nll_loss_with` against PyTorch's documented `F.nll_loss` semantics, computed here in f64:
//! `loss[n, d…] = -weight[t] · input[n, t, d…]`, rows whose target is `ignore_index` give 0, the
//! mean divides by the summed weight of the rows kept. Inputs `[N, C, d]` and `[C]`, with and
//! without class weights, every reduction, the input gradient, and agreement with
//! `cross_entropy_with` on log-probabilities; on the CPU and every GPU that opens (f32 there),
//! each missing one skipped loudly.

mod common;

use cartage::tensor::nn::{CrossEntropy, Reduction};
use cartage::{DType, Device, Error, Result, Tensor, Var};

/// `[N = 2, C = 3, d = 2]`, any values (nll_loss does not require normalised rows).
const X: &[f64] = &[-0.3, -1.7, -2.2, -0.4, -1.1, -0.9, -0.05, -2.5, -3.0, -0.6, -0.8, -1.3];
const T: &[i64] = &[2, -100, 0, 1];
const W: &[f64] = &[0.5, 2.0, 1.5];
const SHAPE: [usize; 3] = [2, 3, 2];

/// `X[n, c, d]`.
fn x_at(n: usize, c: usize, d: usize) -> f64 {
    X[(n * SHAPE[1] + c) * SHAPE[2] + d]
}

/// The per-position losses and weights of PyTorch's `nll_loss`, in `[N, d]` order.
fn reference(weight: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
    let mut losses = Vec::new();
    let mut weights = Vec::new();
    for n in 0..SHAPE[0] {
        for d in 0..SHAPE[2] {
            let t = T[n * SHAPE[2] + d];
            if t == -100 {
                losses.push(0.0);
                weights.push(0.0);
                continue;
            }
            let w = weight.map_or(1.0, |w| w[t as usize]);
            losses.push(-w * x_at(n, t as usize, d));
            weights.push(w);
        }
    }
    (losses, weights)
}

fn devices() -> Vec<(Device, DType, f64)> {
    let mut all = vec![(Device::cpu(), DType::F64, 1e-12)];
    for d in common::gpu_devices("nll_loss_full") {
        all.push((d, DType::F32, 1e-5));
    }
    all
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: {got:?} vs {want:?}");
    }
}

#[test]
fn spatial_weighted_nll_follows_pytorch_semantics() -> Result<()> {
    for (device, dtype, tol) in devices() {
        let x = Tensor::from_slice(X, &SHAPE, &device)?.to_dtype(dtype)?;
        let t = Tensor::from_slice(T, &[2, 2], &device)?;
        let w = Tensor::from_slice(W, &[3], &device)?.to_dtype(dtype)?;
        for weighted in [false, true] {
            let (losses, weights) = reference(weighted.then_some(W));
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                let opts = CrossEntropy {
                    reduction,
                    ..Default::default()
                };
                let got = x.nll_loss_with(&t, weighted.then_some(&w), opts)?;
                let sum: f64 = losses.iter().sum();
                let want = match reduction {
                    Reduction::Mean => vec![sum / weights.iter().sum::<f64>()],
                    Reduction::Sum => vec![sum],
                    Reduction::None => losses.clone(),
                };
                let what = format!("{device} weighted={weighted} {reduction:?}");
                let expected_shape: &[usize] = if reduction == Reduction::None { &[2, 2] } else { &[] };
                assert_eq!(got.shape(), expected_shape, "{what}");
                close(&got.to_vec_f64()?, &want, tol, &what);
            }
        }
    }
    Ok(())
}

#[test]
fn a_single_row_takes_a_scalar_target() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::from_slice(&[-0.2f64, -1.5, -2.5], &[3], &cpu)?;
    let w = Tensor::from_slice(&[1.0f64, 4.0, 2.0], &[3], &cpu)?;
    let t = Tensor::from_slice(&[1i64], &[], &cpu)?;
    // Weighted mean of one row: -w[1]·x[1] / w[1] = -x[1].
    let mean = x.nll_loss_with(&t, Some(&w), CrossEntropy::default())?.item::<f64>()?;
    assert!((mean - 1.5).abs() < 1e-12, "{mean}");
    let sum = CrossEntropy {
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let total = x.nll_loss_with(&t, Some(&w), sum)?.item::<f64>()?;
    assert!((total - 4.0 * 1.5).abs() < 1e-12, "{total}");
    Ok(())
}

#[test]
fn the_weighted_mean_gradient_is_minus_weight_over_total() -> Result<()> {
    for (device, dtype, tol) in devices() {
        let x = Var::new(Tensor::from_slice(X, &SHAPE, &device)?.to_dtype(dtype)?)?;
        let t = Tensor::from_slice(T, &[2, 2], &device)?;
        let w = Tensor::from_slice(W, &[3], &device)?.to_dtype(dtype)?;
        let grads = x
            .tensor()
            .nll_loss_with(&t, Some(&w), CrossEntropy::default())?
            .backward()?;
        let g = grads.get(&x).expect("a gradient for the input").to_vec_f64()?;
        let (_, weights) = reference(Some(W));
        let total: f64 = weights.iter().sum();
        let mut want = vec![0.0; X.len()];
        for n in 0..SHAPE[0] {
            for d in 0..SHAPE[2] {
                let target = T[n * SHAPE[2] + d];
                if target != -100 {
                    let c = target as usize;
                    want[(n * SHAPE[1] + c) * SHAPE[2] + d] = -W[c] / total;
                }
            }
        }
        close(&g, &want, tol, &format!("{device} gradient"));
    }
    Ok(())
}

#[test]
fn on_log_probabilities_it_is_cross_entropy() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::from_slice(X, &SHAPE, &cpu)?;
    let t = Tensor::from_slice(T, &[2, 2], &cpu)?;
    let w = Tensor::from_slice(W, &[3], &cpu)?;
    for label_smoothing in [0.0, 0.2] {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let opts = CrossEntropy {
                reduction,
                label_smoothing,
                ..Default::default()
            };
            let nll = x.log_softmax(1)?.nll_loss_with(&t, Some(&w), opts)?.to_vec_f64()?;
            let ce = x.cross_entropy_with(&t, Some(&w), opts)?.to_vec_f64()?;
            close(&nll, &ce, 1e-12, &format!("{reduction:?} s={label_smoothing}"));
        }
    }
    Ok(())
}

#[test]
fn every_row_ignored_gives_nan_and_bad_operands_are_refused() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::from_slice(X, &SHAPE, &cpu)?;
    let w = Tensor::from_slice(W, &[3], &cpu)?;
    let o = CrossEntropy::default();
    // PyTorch: the weighted mean over no rows is 0 / 0.
    let ignored = Tensor::full(&[2, 2], -100i64, DType::I64, &cpu)?;
    assert!(x.nll_loss_with(&ignored, Some(&w), o)?.item::<f64>()?.is_nan());

    let t = Tensor::from_slice(T, &[2, 2], &cpu)?;
    let float_target = Tensor::zeros(&[2, 2], DType::F64, &cpu)?;
    assert!(matches!(
        x.nll_loss_with(&float_target, Some(&w), o),
        Err(Error::WrongDType { op: "nll_loss", .. })
    ));
    let wrong_weight = Tensor::ones(&[4], DType::F64, &cpu)?;
    assert!(matches!(
        x.nll_loss_with(&t, Some(&wrong_weight), o),
        Err(Error::ShapeMismatch { op: "nll_loss", .. })
    ));
    let wrong_rows = Tensor::zeros(&[2, 3], DType::I64, &cpu)?;
    assert!(matches!(
        x.nll_loss_with(&wrong_rows, Some(&w), o),
        Err(Error::ShapeMismatch { op: "nll_loss", .. })
    ));
    let f32_weight = Tensor::ones(&[3], DType::F32, &cpu)?;
    assert!(matches!(
        x.nll_loss_with(&t, Some(&f32_weight), o),
        Err(Error::DTypeMismatch { .. })
    ));
    Ok(())
}
