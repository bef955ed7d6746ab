//! `Tensor::adam_step_` and `Tensor::sgd_step_`: the fused in-place update (where the backend has
//! it) and the composed one (strided operands, backends without it) follow PyTorch's formulas on
//! every device, write in place, and refuse bad operands with typed errors.

mod common;

use cartage::prelude::*;
use cartage::{AdamUpdate, ErrorKind, SgdUpdate};

fn adam(step: u64, decoupled: bool) -> AdamUpdate {
    AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        decoupled,
        step,
    }
}

/// Adam in f64 on the host, PyTorch's formulas, for `steps` steps from `p` with gradients `g`.
fn adam_reference(p: &[f64], grads: &[Vec<f64>], decoupled: bool) -> Vec<f64> {
    let (mut p, mut m, mut v) = (p.to_vec(), vec![0.0; p.len()], vec![0.0; p.len()]);
    for (t, g) in grads.iter().enumerate() {
        let rule = adam(t as u64 + 1, decoupled);
        let (bc1, bc2) = (1.0 - 0.9f64.powi(t as i32 + 1), 1.0 - 0.999f64.powi(t as i32 + 1));
        for i in 0..p.len() {
            let mut gi = g[i];
            if decoupled {
                p[i] *= 1.0 - rule.lr * rule.weight_decay;
            } else {
                gi += rule.weight_decay * p[i];
            }
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.999 * v[i] + 0.001 * gi * gi;
            p[i] -= rule.lr / bc1 * m[i] / ((v[i] / bc2).sqrt() + rule.eps);
        }
    }
    p
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| (((i as u64 * 7919 + seed * 104729) % 2001) as f64 / 1000.0) - 1.0)
        .collect()
}

fn devices() -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices("optimizer_update"));
    all
}

#[test]
fn adam_matches_the_reference_fused_and_composed_on_every_device() -> Result<()> {
    let n = 300;
    let p0 = values(n, 1);
    let grads: Vec<Vec<f64>> = (0..5).map(|s| values(n, s + 2)).collect();
    for device in devices() {
        for decoupled in [false, true] {
            let want = adam_reference(&p0, &grads, decoupled);
            // Contiguous operands take the fused kernel where the backend lists one; a
            // transposed parameter (and its moments) take the composed path.
            for strided in [false, true] {
                let make = |v: &[f64]| -> Result<Tensor> {
                    let t = Tensor::from_slice(v, &[20, 15], &device)?.to_dtype(DType::F32)?;
                    if strided { t.t()?.contiguous()?.t() } else { Ok(t) }
                };
                let p = make(&p0)?;
                let (m, v) = (make(&vec![0.0; n])?, make(&vec![0.0; n])?);
                for (t, g) in grads.iter().enumerate() {
                    p.adam_step_(&make(g)?, &m, &v, adam(t as u64 + 1, decoupled))?;
                }
                let got = p.to_dtype(DType::F64)?.contiguous()?.to_vec::<f64>()?;
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{device} decoupled {decoupled} strided {strided}: element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn sgd_momentum_and_nesterov_follow_pytorch() -> Result<()> {
    for device in devices() {
        for nesterov in [false, true] {
            let p = Tensor::new([1.0f32, -2.0], &device)?;
            let buf = p.zeros_like()?;
            let g = Tensor::new([0.5f32, 1.0], &device)?;
            let rule = SgdUpdate {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 0.0,
                nesterov,
                first_step: true,
            };
            p.sgd_step_(&g, Some(&buf), rule)?;
            p.sgd_step_(
                &g,
                Some(&buf),
                SgdUpdate {
                    first_step: false,
                    ..rule
                },
            )?;
            // buf: g, then 0.9·g + g = 1.9·g. Steps: lr·(g or g + 0.9·g) then lr·(1.9·g or g + 0.9·1.9·g).
            let (first, second) = if nesterov { (1.9, 1.0 + 0.9 * 1.9) } else { (1.0, 1.9) };
            let want = [1.0 - 0.1 * 0.5 * (first + second), -2.0 - 0.1 * (first + second)];
            let got = p.to_vec::<f32>()?;
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-6,
                    "{device} nesterov {nesterov}: {got:?} vs {want:?}"
                );
            }
            assert_eq!(
                buf.to_vec::<f32>()?,
                vec![0.95, 1.9],
                "{device}: the buffer holds 1.9·g"
            );
        }
    }
    Ok(())
}

#[test]
fn bad_updates_are_typed_errors() -> Result<()> {
    let cpu = Device::cpu();
    let p = Tensor::zeros(&[4], DType::F32, &cpu)?;
    let g = Tensor::ones(&[4], DType::F32, &cpu)?;
    let (m, v) = (p.zeros_like()?, p.zeros_like()?);
    let wrong_shape = Tensor::zeros(&[5], DType::F32, &cpu)?;
    let err = p.adam_step_(&wrong_shape, &m, &v, adam(1, true)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
    let half_state = Tensor::zeros(&[4], DType::F16, &cpu)?;
    assert!(p.adam_step_(&g, &half_state, &v, adam(1, true)).is_err());
    let err = p.adam_step_(&g, &m, &v, adam(0, true)).unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: true,
    };
    let err = p.sgd_step_(&g, None, sgd).unwrap_err();
    assert!(err.to_string().contains("momentum buffer"), "{err}");
    let ints = Tensor::zeros(&[4], DType::I32, &cpu)?;
    assert!(ints.sgd_step_(&ints, None, SgdUpdate { momentum: 0.0, ..sgd }).is_err());
    // A variable's value in a recording context cannot be stepped in place.
    let var = Var::new(Tensor::zeros(&[4], DType::F32, &cpu)?)?;
    let tracked = var.tensor().mul_scalar(1.0)?;
    let err = tracked
        .sgd_step_(&g, None, SgdUpdate { momentum: 0.0, ..sgd })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd, "{err}");
    // A parameter passed as its own gradient is composed, not fused over itself.
    let q = Tensor::new([1.0f32, 2.0], &cpu)?;
    q.sgd_step_(
        &q.clone(),
        None,
        SgdUpdate {
            momentum: 0.0,
            lr: 0.5,
            ..sgd
        },
    )?;
    assert_eq!(q.to_vec::<f32>()?, vec![0.5, 1.0]);
    Ok(())
}
