//! `Tensor::linear`: the fused kernel (where the device lists it) against the composed
//! `matmul + add + activation` for every activation, with and without a bias, over batched
//! inputs; gradients through the composed path and through the recorded fused kernel (against
//! the composed ops' gradients, also under autocast); shape errors; and the algorithm-search switch
//! on devices without one. GPUs that open here run the same comparison against the CPU.

mod common;

use cartage::{DType, Device, Epilogue, ErrorKind, Op, Result, Tensor, Var};

fn cpu() -> Device {
    Device::cpu()
}

/// Inputs `[2, 3, 17]`, weight `[5, 17]`, bias `[5]`, of `dtype` on `device`, spread over ±2.
fn operands(device: &Device, dtype: DType) -> Result<(Tensor, Tensor, Tensor)> {
    let x = Tensor::randn(&[2, 3, 17], DType::F32, 1, &cpu())?.mul_scalar(1.5)?;
    let w = Tensor::randn(&[5, 17], DType::F32, 2, &cpu())?.mul_scalar(0.4)?;
    let b = Tensor::randn(&[5], DType::F32, 3, &cpu())?;
    Ok((
        x.to_device_dtype(device, dtype)?,
        w.to_device_dtype(device, dtype)?,
        b.to_device_dtype(device, dtype)?,
    ))
}

fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.to_device_dtype(&cpu(), DType::F32)?.to_vec::<f32>()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// The composed result, forced by a weight that requires a gradient (the fused kernel records
/// itself only without an activation, so the reference is built from the ops themselves).
fn composed(x: &Tensor, w: &Tensor, b: Option<&Tensor>, act: Epilogue) -> Result<Tensor> {
    let w = Var::new(w.clone())?.tensor();
    let mut y = x.matmul(&w.t()?)?;
    if let Some(b) = b {
        y = y.add(b)?;
    }
    match act {
        Epilogue::Identity => Ok(y),
        Epilogue::Relu => y.relu(),
        Epilogue::Gelu => y.gelu(),
        Epilogue::GeluTanh => x.linear(&w, b, act),
    }
}

#[test]
fn the_fused_cpu_kernel_matches_the_composed_ops() -> Result<()> {
    assert!(
        cartage::backend(&cpu())?
            .capabilities()
            .supports(Op::Linear, DType::F32)
    );
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    for act in Epilogue::ALL {
        for bias in [None, Some(&b)] {
            let fused = x.linear(&w, bias, act)?;
            assert_eq!(fused.shape(), &[2, 3, 5]);
            assert!(
                fused.grad_fn().is_none(),
                "nothing requires a gradient: the fused kernel ran"
            );
            let reference = composed(&x, &w, bias, act)?;
            assert!(reference.grad_fn().is_some(), "the reference is recorded");
            let what = format!("{} bias {}", act.name(), bias.is_some());
            assert_close(&what, &values(&fused)?, &values(&reference)?, 1e-5);
        }
    }
    Ok(())
}

#[test]
fn the_two_gelus_differ_as_their_formulas_do() -> Result<()> {
    let x = Tensor::new([[2.0f32]], &cpu())?;
    let one = Tensor::new([[1.0f32]], &cpu())?;
    let exact = x.linear(&one, None, Epilogue::Gelu)?.to_vec2::<f32>()?[0][0];
    let tanh = x.linear(&one, None, Epilogue::GeluTanh)?.to_vec2::<f32>()?[0][0];
    assert!((exact - 1.954_499_7).abs() < 1e-5, "{exact}");
    assert!((tanh - 1.954_597_6).abs() < 1e-5, "{tanh}");
    Ok(())
}

#[test]
fn bias_gradients_count_the_rows_a_relu_passes() -> Result<()> {
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    let (wv, bv) = (Var::new(w.clone())?, Var::new(b.clone())?);
    let y = x.linear(&wv.tensor(), Some(&bv.tensor()), Epilogue::Relu)?;
    let grads = y.sum_all()?.backward()?;
    let gb = values(grads.get(&bv).expect("the bias has a gradient"))?;
    // d(sum relu(z))/db_j counts the rows where z_j > 0.
    let z = values(&x.linear(&w, Some(&b), Epilogue::Identity)?)?;
    for (j, g) in gb.iter().enumerate() {
        let positive = z.iter().skip(j).step_by(5).filter(|v| **v > 0.0).count() as f32;
        assert_eq!(*g, positive, "bias gradient {j}");
    }
    assert!(grads.get(&wv).is_some(), "the weight has a gradient");
    Ok(())
}

/// The gradients of `sum(y · r)` for `y = linear(x, w, b)` with a fixed random `r`, by the
/// recorded fused kernel and by the composed ops, for x, w and b.
#[test]
fn the_recorded_fused_kernel_has_the_composed_gradients() -> Result<()> {
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    let r = Tensor::randn(&[2, 3, 5], DType::F32, 9, &cpu())?;
    let run = |fused: bool| -> Result<Vec<Vec<f32>>> {
        let (xv, wv, bv) = (Var::new(x.clone())?, Var::new(w.clone())?, Var::new(b.clone())?);
        let y = if fused {
            xv.tensor()
                .linear(&wv.tensor(), Some(&bv.tensor()), Epilogue::Identity)?
        } else {
            xv.tensor().matmul(&wv.tensor().t()?)?.add(&bv.tensor())?
        };
        let node = y.grad_fn().expect("recorded");
        assert_eq!(node == "linear", fused, "{node}");
        let grads = y.mul(&r)?.sum_all()?.backward()?;
        [&xv, &wv, &bv]
            .iter()
            .map(|v| values(grads.get(v).expect("every operand has a gradient")))
            .collect()
    };
    let (fused, reference) = (run(true)?, run(false)?);
    for (name, (got, want)) in ["x", "w", "b"].iter().zip(fused.iter().zip(&reference)) {
        assert_close(&format!("gradient of {name}"), got, want, 1e-5);
    }
    Ok(())
}

/// Recorded with an activation, the product and bias still run as one fused kernel (recorded as
/// a `linear`) and the activation after it, with the composed ops' gradients for x, w and b.
#[test]
fn a_recorded_activation_follows_the_fused_product() -> Result<()> {
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    let r = Tensor::randn(&[2, 3, 5], DType::F32, 11, &cpu())?;
    for activation in [Epilogue::Relu, Epilogue::Gelu, Epilogue::GeluTanh] {
        let run = |fused: bool| -> Result<Vec<Vec<f32>>> {
            let (xv, wv, bv) = (Var::new(x.clone())?, Var::new(w.clone())?, Var::new(b.clone())?);
            let y = if fused {
                let y = xv.tensor().linear(&wv.tensor(), Some(&bv.tensor()), activation)?;
                if activation == Epilogue::Gelu {
                    assert_eq!(y.grad_fn().expect("recorded"), "gelu");
                }
                y
            } else {
                let z = xv.tensor().matmul(&wv.tensor().t()?)?.add(&bv.tensor())?;
                z.linear(&Tensor::eye(5, DType::F32, &cpu())?, None, activation)?
            };
            let grads = y.mul(&r)?.sum_all()?.backward()?;
            [&xv, &wv, &bv]
                .iter()
                .map(|v| values(grads.get(v).expect("every operand has a gradient")))
                .collect()
        };
        let (fused, reference) = (run(true)?, run(false)?);
        for (name, (got, want)) in ["x", "w", "b"].iter().zip(fused.iter().zip(&reference)) {
            assert_close(&format!("{activation:?}: gradient of {name}"), got, want, 1e-5);
        }
    }
    Ok(())
}

/// Under autocast the bias runs in the autocast dtype too (PyTorch's `linear`): the output is
/// bf16, and every f32 master operand still gets an f32 gradient.
#[test]
fn autocast_lowers_the_bias_with_the_product() -> Result<()> {
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    let (wv, bv) = (Var::new(w)?, Var::new(b)?);
    let y = {
        let _ac = cartage::autocast(&cpu(), DType::BF16)?;
        x.linear(&wv.tensor(), Some(&bv.tensor()), Epilogue::Identity)?
    };
    assert_eq!(y.dtype(), DType::BF16, "the output stays in the autocast dtype");
    let grads = y.to_dtype(DType::F32)?.sum_all()?.backward()?;
    let gb = grads.get(&bv).expect("the bias has a gradient");
    assert_eq!(gb.dtype(), DType::F32);
    // d(sum y)/db_j is the number of rows, 6, exactly representable in bf16.
    assert_eq!(values(gb)?, vec![6.0; 5]);
    assert_eq!(grads.get(&wv).expect("the weight has a gradient").dtype(), DType::F32);
    Ok(())
}

#[test]
fn bad_shapes_are_errors_that_name_the_operands() -> Result<()> {
    let (x, w, b) = operands(&cpu(), DType::F32)?;
    let err = x.linear(&w.t()?, None, Epilogue::Identity).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
    assert!(err.to_string().contains("transposed"), "{err}");
    let err = x.linear(&w, Some(&b.narrow(0, 0, 4)?), Epilogue::Identity).unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");
    let ints = Tensor::zeros(&[2, 17], DType::I32, &cpu())?;
    assert!(ints.linear(&ints, None, Epilogue::Identity).is_err());
    Ok(())
}

#[test]
fn devices_without_an_algorithm_choice_keep_the_search_off() -> Result<()> {
    assert!(!cartage::set_matmul_algo_search(&cpu(), true)?);
    assert!(!cartage::backend(&cpu())?.matmul_algo_search());
    assert!(cartage::set_matmul_algo_search(&cpu(), false)?);
    Ok(())
}

#[test]
fn gpus_match_the_cpu() -> Result<()> {
    for device in common::gpu_devices("linear/gpus_match_the_cpu") {
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::F16, 4e-3), (DType::BF16, 3e-2)] {
            let caps = cartage::backend(&device)?.capabilities().clone();
            if !caps.supports(Op::Matmul, dtype) {
                common::skip(&format!("linear/gpus_match_the_cpu: {device} has no {dtype} matmul"));
                continue;
            }
            let (x, w, b) = operands(&device, dtype)?;
            let (xc, wc, bc) = operands(&cpu(), DType::F32)?;
            for act in Epilogue::ALL {
                let got = values(&x.linear(&w, Some(&b), act)?)?;
                let want = values(&xc.linear(&wc, Some(&bc), act)?)?;
                assert_close(&format!("{device} {dtype} {}", act.name()), &got, &want, tol);
            }
        }
    }
    Ok(())
}
