//! `Tensor::activation_linear`: values and gradients against the composed activation then
//! `linear` for every activation, with and without a bias, in f64 on the CPU; and the bytes its
//! node saves for backward: one `[.., in]` tensor fewer than the composed pair keeps.

use cartage::{DType, Device, Epilogue, Result, Tensor, Var, graph_memory};

fn cpu() -> Device {
    Device::cpu()
}

/// Input `[2, 3, 7]` spread over ±3 (both sides of the activations' bends), weight `[5, 7]`,
/// bias `[5]`, in f64.
fn operands() -> Result<(Var, Var, Var)> {
    let x = Tensor::randn(&[2, 3, 7], DType::F64, 1, &cpu())?.mul_scalar(1.5)?;
    let w = Tensor::randn(&[5, 7], DType::F64, 2, &cpu())?.mul_scalar(0.4)?;
    let b = Tensor::randn(&[5], DType::F64, 3, &cpu())?;
    Ok((Var::new(x)?, Var::new(w)?, Var::new(b)?))
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_vec::<f64>()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// The activation through its own recorded ops.
fn activate(x: &Tensor, act: Epilogue) -> Result<Tensor> {
    match act {
        Epilogue::Identity => Ok(x.clone()),
        Epilogue::Relu => x.relu(),
        Epilogue::Gelu => x.gelu(),
        Epilogue::GeluTanh => {
            let inner = x
                .mul(x)?
                .mul(x)?
                .mul_scalar(0.044715)?
                .add(x)?
                .mul_scalar((2.0 / std::f64::consts::PI).sqrt())?;
            inner.tanh()?.add_scalar(1.0)?.mul(x)?.mul_scalar(0.5)
        }
    }
}

/// Output, then the gradients of `Σ out·c` (a fixed weighting, so every output row matters)
/// for the input, weight and (when given) bias.
fn run(fused: bool, act: Epilogue, bias: bool) -> Result<Vec<Vec<f64>>> {
    let (x, w, b) = operands()?;
    let (xt, wt, bt) = (x.tensor(), w.tensor(), b.tensor());
    let b_arg = bias.then_some(&bt);
    let out = if fused {
        xt.activation_linear(&wt, b_arg, act)?
    } else {
        // Through `matmul` and `add`: the composed reference.
        let y = activate(&xt, act)?.matmul(&wt.t()?)?;
        match b_arg {
            Some(b) => y.add(b)?,
            None => y,
        }
    };
    let c = Tensor::randn(out.shape(), DType::F64, 9, &cpu())?;
    out.mul(&c)?.sum_all()?.backward()?;
    let mut got = vec![values(&out)?, values(&x.grad().unwrap())?, values(&w.grad().unwrap())?];
    if bias {
        got.push(values(&b.grad().unwrap())?);
    }
    Ok(got)
}

/// One test function: graph memory is counted per device, and tests run on parallel threads.
#[test]
fn activation_linear_matches_the_composed_ops_and_saves_less() -> Result<()> {
    the_node_keeps_the_input_and_weight_only()?;
    values_and_gradients_match_the_composed_ops()
}

fn values_and_gradients_match_the_composed_ops() -> Result<()> {
    for act in Epilogue::ALL {
        for bias in [false, true] {
            let (fused, composed) = (run(true, act, bias)?, run(false, act, bias)?);
            for (i, what) in ["output", "input grad", "weight grad", "bias grad"]
                .iter()
                .enumerate()
                .take(fused.len())
            {
                assert_close(&format!("{} bias {bias}: {what}", act.name()), &fused[i], &composed[i]);
            }
        }
    }
    Ok(())
}

fn the_node_keeps_the_input_and_weight_only() -> Result<()> {
    let (x, w, b) = operands()?;
    let (xt, wt, bt) = (x.tensor(), w.tensor(), b.tensor());
    let saved = || graph_memory(&cpu()).saved_bytes;
    let before = saved();
    let fused = xt.activation_linear(&wt, Some(&bt), Epilogue::Gelu)?;
    let by_fused = saved() - before;
    let composed = xt.gelu()?.linear(&wt, Some(&bt), Epilogue::Identity)?;
    let by_composed = saved() - before - by_fused;
    assert_eq!(by_fused, xt.size_in_bytes() + wt.size_in_bytes(), "input and weight");
    assert_eq!(
        by_composed - by_fused,
        xt.size_in_bytes(),
        "the composed pair also keeps the activation's output"
    );
    drop((fused, composed));
    Ok(())
}
