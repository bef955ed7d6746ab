//! `cross_entropy_with` against values PyTorch 2.x printed for the same f64 inputs
//! (`F.cross_entropy(x, t, weight=w, reduction=.., label_smoothing=..)`): an input
//! `[N = 2, C = 3, d = 2]` with class-index targets (one ignored) and with probability targets,
//! class weights, every reduction, label smoothing 0 and 0.1, and the input gradient; on the CPU
//! and every GPU that opens (f32 there), each missing one skipped loudly.

mod common;

use cartage::tensor::nn::{CrossEntropy, Reduction};
use cartage::{DType, Device, Error, Result, Tensor};

const X: &[f64] = &[
    3.081992149353e+00,
    -5.868577957153e-01,
    -4.357578754425e+00,
    1.136862516403e+00,
    -2.169044733047e+00,
    -2.797190904617e+00,
    8.066936731339e-01,
    1.676052689552e+00,
    -1.438515186310e+00,
    -8.066870570183e-01,
    -1.193270683289e+00,
    3.640729784966e-01,
];
const P: &[f64] = &[
    3.180824119799e-01,
    5.378601640219e-01,
    2.566716755109e-01,
    2.022886573718e-01,
    4.252459125093e-01,
    2.598511786063e-01,
    9.277295272640e-02,
    3.308849882824e-02,
    3.278460029197e-01,
    6.421333679205e-01,
    5.793810443539e-01,
    3.247781332513e-01,
];
const T: &[i64] = &[2, -100, 0, 1];
const W: &[f64] = &[0.5, 2.0, 1.5];

/// (targets are probabilities, reduction, label smoothing, PyTorch's result).
fn expected() -> Vec<(bool, Reduction, f64, Vec<f64>)> {
    use Reduction::*;
    vec![
        (false, Mean, 0.0, vec![3.390791332529e+00]),
        (true, Mean, 0.0, vec![4.320732007598e+00]),
        (false, Mean, 0.1, vec![3.379011617256e+00]),
        (true, Mean, 0.1, vec![4.278336881510e+00]),
        (false, Sum, 0.0, vec![1.356316533012e+01]),
        (true, Sum, 0.0, vec![1.728292803039e+01]),
        (false, Sum, 0.1, vec![1.351604646903e+01]),
        (true, Sum, 0.1, vec![1.711334752604e+01]),
        (
            false,
            None,
            0.0,
            vec![7.885274360018e+00, 0.0, 1.080576659187e-01, 5.569833304180e+00],
        ),
        (
            true,
            None,
            0.0,
            vec![
                7.176143312147e+00,
                2.189018179757e+00,
                3.549827270967e+00,
                4.367939267520e+00,
            ],
        ),
        (
            false,
            None,
            0.1,
            vec![7.856045187181e+00, 0.0, 3.757460853558e-01, 5.284255196489e+00],
        ),
        (
            true,
            None,
            0.1,
            vec![
                7.217827244097e+00,
                2.219630988550e+00,
                3.473338729899e+00,
                4.202550563495e+00,
            ],
        ),
    ]
}

const GRAD_WEIGHTED_MEAN_SMOOTHED: &[f64] = &[
    3.645173797299e-01,
    0.0,
    -1.645005105465e-02,
    0.0,
    -3.480673286752e-01,
    0.0,
    8.228471269712e-04,
    3.531168536789e-01,
    -4.223890513538e-03,
    -4.368284534526e-01,
    3.401043386567e-03,
    8.371159977377e-02,
];

fn devices() -> Vec<(Device, DType, f64)> {
    let mut all = vec![(Device::cpu(), DType::F64, 1e-9)];
    for d in common::gpu_devices("cross_entropy_full") {
        all.push((d, DType::F32, 1e-4));
    }
    all
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: {got:?} vs PyTorch {want:?}"
        );
    }
}

#[test]
fn spatial_weighted_and_soft_targets_match_pytorch() -> Result<()> {
    for (device, dtype, tol) in devices() {
        let x = Tensor::from_slice(X, &[2, 3, 2], &device)?.to_dtype(dtype)?;
        let p = Tensor::from_slice(P, &[2, 3, 2], &device)?.to_dtype(dtype)?;
        let t = Tensor::from_slice(T, &[2, 2], &device)?;
        let w = Tensor::from_slice(W, &[3], &device)?.to_dtype(dtype)?;
        for (soft, reduction, label_smoothing, want) in expected() {
            let opts = CrossEntropy {
                reduction,
                label_smoothing,
                ..Default::default()
            };
            let target = if soft { &p } else { &t };
            let got = x.cross_entropy_with(target, Some(&w), opts)?;
            let what = format!("{device} soft={soft} {reduction:?} s={label_smoothing}");
            if reduction == Reduction::None {
                assert_eq!(got.shape(), &[2, 2], "{what}");
            }
            close(&got.to_vec_f64()?, &want, tol, &what);
        }
    }
    Ok(())
}

#[test]
fn the_weighted_smoothed_gradient_matches_pytorch() -> Result<()> {
    for (device, dtype, tol) in devices() {
        let x = cartage::Var::new(Tensor::from_slice(X, &[2, 3, 2], &device)?.to_dtype(dtype)?)?;
        let t = Tensor::from_slice(T, &[2, 2], &device)?;
        let w = Tensor::from_slice(W, &[3], &device)?.to_dtype(dtype)?;
        let opts = CrossEntropy {
            label_smoothing: 0.1,
            ..Default::default()
        };
        let grads = x.tensor().cross_entropy_with(&t, Some(&w), opts)?.backward()?;
        let g = grads.get(&x).expect("a gradient for the input");
        close(
            &g.to_vec_f64()?,
            GRAD_WEIGHTED_MEAN_SMOOTHED,
            tol,
            &format!("{device} gradient"),
        );
    }
    Ok(())
}

#[test]
fn without_weights_on_rows_it_is_the_fused_loss() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::from_slice(&X[..6], &[2, 3], &cpu)?;
    let t = Tensor::from_slice(&[1i64, 2], &[2], &cpu)?;
    let a = x.cross_entropy_with(&t, None, CrossEntropy::default())?.item::<f64>()?;
    let b = x.cross_entropy(&t, CrossEntropy::default())?.item::<f64>()?;
    assert_eq!(a, b);
    Ok(())
}

#[test]
fn bad_operands_are_refused() -> Result<()> {
    let cpu = Device::cpu();
    let x = Tensor::zeros(&[2, 3, 2], DType::F32, &cpu)?;
    let wrong_rows = Tensor::zeros(&[2, 3], DType::I64, &cpu)?;
    let wrong_probs = Tensor::zeros(&[2, 3], DType::F32, &cpu)?;
    let wrong_weight = Tensor::ones(&[4], DType::F32, &cpu)?;
    let t = Tensor::zeros(&[2, 2], DType::I64, &cpu)?;
    let o = CrossEntropy::default();
    assert!(matches!(
        x.cross_entropy_with(&wrong_rows, None, o),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        x.cross_entropy_with(&wrong_probs, None, o),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        x.cross_entropy_with(&t, Some(&wrong_weight), o),
        Err(Error::ShapeMismatch { .. })
    ));
    let bad = CrossEntropy {
        label_smoothing: 1.5,
        ..o
    };
    assert!(matches!(
        x.cross_entropy_with(&t, None, bad),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}
