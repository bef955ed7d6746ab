//! `Tensor::layer_norm_linear`: values and gradients against `layer_norm` then `linear`, with
//! and without each parameter, in f64 on the CPU, and under bf16 autocast in f32; and the bytes
//! its node saves for backward: the norm's output is not among them.

use cartage::{DType, Device, Epilogue, Result, Tensor, Var, graph_memory};

fn cpu() -> Device {
    Device::cpu()
}

/// Input `[2, 3, 7]`, norm weight and bias `[7]`, weight `[5, 7]`, bias `[5]`.
fn operands(dtype: DType) -> Result<Vec<Var>> {
    let make = |shape: &[usize], seed: u64, scale: f64| -> Result<Var> {
        Var::new(Tensor::randn(shape, dtype, seed, &cpu())?.mul_scalar(scale)?)
    };
    Ok(vec![
        make(&[2, 3, 7], 1, 1.5)?,
        make(&[7], 2, 1.0)?,
        make(&[7], 3, 1.0)?,
        make(&[5, 7], 4, 0.4)?,
        make(&[5], 5, 1.0)?,
    ])
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// The output, then the gradients of `Σ out·c` for every operand used, in operand order.
fn run(fused: bool, dtype: DType, params: [bool; 3], autocast: bool) -> Result<Vec<Vec<f64>>> {
    let vars = operands(dtype)?;
    let t: Vec<Tensor> = vars.iter().map(Var::tensor).collect();
    let [gamma, beta, bias] = params;
    let (nw, nb, b) = (gamma.then_some(&t[1]), beta.then_some(&t[2]), bias.then_some(&t[4]));
    let out = {
        let _autocast = autocast.then(|| cartage::autocast(&cpu(), DType::BF16)).transpose()?;
        if fused {
            t[0].layer_norm_linear(nw, nb, 1e-5, &t[3], b)?
        } else {
            t[0].layer_norm(nw, nb, 1e-5)?.linear(&t[3], b, Epilogue::Identity)?
        }
    };
    let c = Tensor::randn(out.shape(), out.dtype(), 9, &cpu())?;
    out.mul(&c)?.sum_all()?.backward()?;
    let mut got = vec![values(&out)?];
    let used = [true, gamma, beta, true, bias];
    for (var, used) in vars.iter().zip(used) {
        if used {
            got.push(values(&var.grad().unwrap())?);
        }
    }
    Ok(got)
}

/// One test function: graph memory is counted per device, and tests run on parallel threads.
#[test]
fn layer_norm_linear_matches_the_composed_ops_and_saves_less() -> Result<()> {
    the_node_does_not_keep_the_normalised_tensor()?;
    for params in [
        [true, true, true],
        [false, false, false],
        [true, false, true],
        [false, true, false],
    ] {
        let (fused, composed) = (
            run(true, DType::F64, params, false)?,
            run(false, DType::F64, params, false)?,
        );
        assert_eq!(fused.len(), composed.len());
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
            assert_close(&format!("f64 {params:?}: value {i}"), f, c, 1e-9);
        }
    }
    // Under bf16 autocast: the norm in f32, the linear layer in bf16, as composed.
    let (fused, composed) = (
        run(true, DType::F32, [true; 3], true)?,
        run(false, DType::F32, [true; 3], true)?,
    );
    for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
        assert_close(&format!("autocast: value {i}"), f, c, 1e-2);
    }
    Ok(())
}

fn the_node_does_not_keep_the_normalised_tensor() -> Result<()> {
    let vars = operands(DType::F32)?;
    let t: Vec<Tensor> = vars.iter().map(Var::tensor).collect();
    let saved = || graph_memory(&cpu()).saved_bytes;
    let before = saved();
    let fused = t[0].layer_norm_linear(Some(&t[1]), Some(&t[2]), 1e-5, &t[3], Some(&t[4]))?;
    let by_fused = saved() - before;
    let composed = t[0]
        .layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)?
        .linear(&t[3], Some(&t[4]), Epilogue::Identity)?;
    let by_composed = saved() - before - by_fused;
    let sizes: usize = t[..4].iter().map(Tensor::size_in_bytes).sum();
    assert_eq!(by_fused, sizes, "the input, the norm's weight and bias and the weight");
    // The composed norm needs no bias for its backward; the recomputation does.
    assert_eq!(
        by_composed + t[2].size_in_bytes() - by_fused,
        t[0].size_in_bytes(),
        "the composed pair keeps the norm's output"
    );
    drop((fused, composed));
    Ok(())
}
