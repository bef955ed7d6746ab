//! Every gradient case on each GPU against the CPU, on the same inputs: in f32 to f32
//! round-off, and in bf16 (the cases marked for it) within bf16's precision. A missing device
//! is skipped loudly, or fails when `CARTAGE_REQUIRE` names its kind.

mod autograd_support;
mod common;

use autograd_support::{analytic, cases};
use cartage::{DType, Device};

/// The largest difference, relative to the largest reference magnitude (at least 1).
fn worst(got: &[f64], want: &[f64]) -> f64 {
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

#[test]
fn gradients_on_each_gpu_match_the_cpu() {
    let cpu = Device::cpu();
    let mut failures = Vec::new();
    for device in common::gpu_devices("autograd") {
        for case in cases::all() {
            let want = analytic(&case, DType::F32, &cpu).expect("the CPU computes every case");
            let mut dtypes = vec![(DType::F32, 2e-4)];
            if case.bf16 {
                dtypes.push((DType::BF16, 6e-2));
            }
            for (dtype, tolerance) in dtypes {
                match analytic(&case, dtype, &device) {
                    Ok(got) => {
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            let err = worst(g, w);
                            if err > tolerance {
                                failures.push(format!(
                                    "{device} {dtype} {}: input {i} differs by {err:.2e} (relative) from the CPU",
                                    case.name
                                ));
                            }
                        }
                    }
                    Err(e) => failures.push(format!("{device} {dtype} {}: {e}", case.name)),
                }
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
fn a_gradient_on_another_device_is_refused() {
    let Some(device) = common::gpu_devices("autograd").into_iter().next() else {
        return;
    };
    let w = cartage::Var::new(cartage::Tensor::ones(&[2], DType::F32, &device).unwrap()).unwrap();
    let y = w.tensor().mul_scalar(2.0).unwrap();
    let seed = cartage::Tensor::ones(&[2], DType::F32, &cpu_device()).unwrap();
    let err = y.backward_with(Some(&seed), false).unwrap_err();
    assert_eq!(err.kind(), cartage::ErrorKind::Autograd);
    assert!(err.to_string().contains(".to(&device)"), "{err}");
    let err = w.set_grad(Some(seed)).unwrap_err();
    assert_eq!(err.kind(), cartage::ErrorKind::Autograd);
}

fn cpu_device() -> Device {
    Device::cpu()
}
