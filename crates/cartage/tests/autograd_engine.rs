//! Autograd semantics: accumulation, retained and freed graphs, no-grad scopes, detach, errors
//! for bad requests, variables replaced in place, and graphs too deep to drop recursively.

use cartage::{DType, Device, ErrorKind, Result, Tensor, Var};

fn cpu() -> Device {
    Device::cpu()
}

fn var(values: &[f32]) -> Result<Var> {
    Var::new(Tensor::from_slice(values, &[values.len()], &cpu())?)
}

#[test]
fn gradients_accumulate_until_zeroed() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    for _ in 0..3 {
        w.tensor().mul_scalar(2.0)?.sum_all()?.backward()?;
    }
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![6.0, 6.0]);
    w.zero_grad();
    assert!(w.grad().is_none());
    let grads = w.tensor().square()?.sum_all()?.backward()?;
    assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, vec![2.0, 4.0]);
    assert_eq!(grads.len(), 1);
    Ok(())
}

#[test]
fn a_variable_used_twice_gets_both_contributions() -> Result<()> {
    let x = var(&[3.0])?;
    let t = x.tensor();
    // y = x·x + exp(x)·x: dy/dx = 2x + exp(x)(1 + x)
    let y = t.mul(&t)?.add(&t.exp()?.mul(&t)?)?.sum_all()?;
    y.backward()?;
    let expected = 6.0 + 3f32.exp() * 4.0;
    let got = x.grad().unwrap().to_vec::<f32>()?[0];
    assert!((got - expected).abs() < 1e-3 * expected, "{got} vs {expected}");
    Ok(())
}

#[test]
fn a_freed_graph_says_how_to_keep_it() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    let loss = w.tensor().exp()?.sum_all()?;
    loss.backward_with(None, true)?;
    loss.backward()?;
    let err = loss.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert!(err.to_string().contains("retain_graph"), "{err}");
    Ok(())
}

#[test]
fn bad_backward_requests_are_typed_errors() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    let y = w.tensor().mul_scalar(3.0)?;
    let err = y.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert!(err.to_string().contains("output gradient"), "{err}");

    let wrong_shape = Tensor::ones(&[3], DType::F32, &cpu())?;
    assert_eq!(
        y.backward_with(Some(&wrong_shape), false).unwrap_err().kind(),
        ErrorKind::ShapeMismatch
    );
    let wrong_dtype = Tensor::ones(&[2], DType::F64, &cpu())?;
    assert_eq!(
        y.backward_with(Some(&wrong_dtype), false).unwrap_err().kind(),
        ErrorKind::WrongDType
    );

    let plain = Tensor::ones(&[], DType::F32, &cpu())?;
    let err = plain.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert!(err.to_string().contains("Var"), "{err}");

    let index = w.tensor().argmax(0, false)?;
    let err = index.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert!(err.to_string().contains("argmax"), "{err}");
    let flags = w.tensor().gt(&Tensor::zeros(&[], DType::F32, &cpu())?)?;
    assert!(!flags.requires_grad());
    assert!(
        flags
            .to_dtype(DType::F32)?
            .sum_all()?
            .backward()
            .unwrap_err()
            .to_string()
            .contains("gt")
    );

    assert_eq!(
        Var::new(Tensor::from_slice(&[1i32], &[1], &cpu())?).unwrap_err().kind(),
        ErrorKind::WrongDType
    );
    let g = Tensor::ones(&[3], DType::F32, &cpu())?;
    assert_eq!(w.set_grad(Some(g)).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    Ok(())
}

#[test]
fn in_place_writes_into_tracked_tensors_are_refused() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    let dst = Tensor::zeros(&[2], DType::F32, &cpu())?;
    let err = dst.copy_from(&w.tensor()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    {
        let _guard = cartage::no_grad();
        dst.copy_from(&w.tensor())?;
    }
    assert_eq!(dst.to_vec::<f32>()?, vec![1.0, 2.0]);
    Ok(())
}

#[test]
fn no_grad_and_detach_record_nothing() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    {
        let _guard = cartage::no_grad();
        let y = w.tensor().exp()?;
        assert!(!y.requires_grad() && y.grad_fn().is_none());
        let nested = cartage::no_grad();
        drop(nested);
        assert!(!cartage::is_grad_enabled());
    }
    assert!(cartage::is_grad_enabled());
    let y = w.tensor().exp()?;
    assert_eq!(y.grad_fn(), Some("exp"));
    assert!(!y.detach().requires_grad());
    // Recording is per thread: a guard here does not stop another thread.
    let _guard = cartage::no_grad();
    let w2 = w.clone();
    let recorded = std::thread::spawn(move || w2.tensor().exp().map(|t| t.requires_grad()))
        .join()
        .unwrap()?;
    assert!(recorded);
    Ok(())
}

#[test]
fn rebind_replaces_the_value_for_every_holder_and_moves_the_gradient() -> Result<()> {
    let w = var(&[1.0, 2.0])?;
    let held = w.clone();
    w.tensor().sum_all()?.backward()?;
    w.rebind(w.value().to_dtype(DType::F64)?)?;
    assert_eq!(held.tensor().dtype(), DType::F64);
    assert_eq!(held.grad().unwrap().dtype(), DType::F64);
    assert_eq!(held.id(), w.id());
    let err = w.rebind(Tensor::zeros(&[3], DType::F64, &cpu())?).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    let err = w.set(Tensor::zeros(&[3], DType::F64, &cpu())?).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    Ok(())
}

#[test]
fn gradients_of_half_precision_variables_come_back_in_their_dtype() -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        let w = Var::new(Tensor::full(&[4], 1.5, dtype, &cpu())?)?;
        let loss = w.tensor().to_dtype(DType::F32)?.square()?.sum_all()?;
        loss.backward()?;
        let g = w.grad().unwrap();
        assert_eq!(g.dtype(), dtype);
        assert_eq!(g.to_dtype(DType::F32)?.to_vec::<f32>()?, vec![3.0; 4]);
    }
    Ok(())
}

#[test]
fn a_graph_of_fifty_thousand_ops_backpropagates_and_drops() -> Result<()> {
    let w = var(&[1.0])?;
    let mut y = w.tensor();
    for _ in 0..50_000 {
        y = y.add_scalar(0.0)?;
    }
    let unused = y.clone();
    y.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![1.0]);
    let mut z = w.tensor();
    for _ in 0..50_000 {
        z = z.mul_scalar(1.0)?;
    }
    drop(z);
    drop(unused);
    Ok(())
}

#[test]
fn ties_and_full_dropout_have_pytorchs_gradients() -> Result<()> {
    // max over dims shares a tie (amax); max_dim sends it to the index it returns.
    let x = var(&[1.0, 3.0, 3.0])?;
    x.tensor().max(&[0], false)?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![0.0, 0.5, 0.5]);
    x.zero_grad();
    let (values, indices) = x.tensor().max_dim(0, false)?;
    assert_eq!(indices.item::<i64>()?, 1);
    values.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![0.0, 1.0, 0.0]);
    x.zero_grad();
    let (values, _) = x.tensor().min_dim(0, true)?;
    values.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![1.0, 0.0, 0.0]);
    // Dropping everything gives a zero gradient, not none.
    x.zero_grad();
    let mut rng = cartage::Generator::new(0);
    x.tensor().dropout(1.0, &mut rng, true)?.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![0.0; 3]);
    Ok(())
}

#[test]
fn backward_with_a_gradient_gives_the_vector_jacobian_product() -> Result<()> {
    // y = [w0·w1, w1², sin(w0)], backward(v): ∂/∂w0 = v0·w1 + v2·cos(w0),
    // ∂/∂w1 = v0·w0 + 2·v1·w1 (PyTorch's y.backward(gradient=v)).
    let (w0, w1) = (0.7f64, -1.3f64);
    let v = [1.0f64, 2.0, -3.0];
    let w = Var::new(Tensor::from_slice(&[w0, w1], &[2], &cpu())?)?;
    let t = w.tensor();
    let (a, b) = (t.narrow(0, 0, 1)?, t.narrow(0, 1, 1)?);
    let y = Tensor::cat(&[&a.mul(&b)?, &b.square()?, &a.sin()?], 0)?;
    assert_eq!(y.shape(), &[3]);
    let seed = Tensor::from_slice(&v, &[3], &cpu())?;
    let grads = y.backward_with(Some(&seed), true)?;
    let got = grads.get(&w).unwrap().to_vec::<f64>()?;
    let want = [v[0] * w1 + v[2] * w0.cos(), v[0] * w0 + 2.0 * v[1] * w1];
    for (g, e) in got.iter().zip(want) {
        assert!((g - e).abs() < 1e-12, "{got:?} vs {want:?}");
    }
    // A gradient of another shape is a typed error naming both shapes, and changes nothing.
    let before = w.grad().unwrap().to_vec::<f64>()?;
    let wrong = Tensor::from_slice(&v[..2], &[2], &cpu())?;
    let err = y.backward_with(Some(&wrong), false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
    assert!(
        err.to_string().contains("[3]") && err.to_string().contains("[2]"),
        "{err}"
    );
    assert_eq!(w.grad().unwrap().to_vec::<f64>()?, before);
    Ok(())
}

#[test]
fn requires_grad_makes_a_leaf_used_without_var_tensor() -> Result<()> {
    let x = Tensor::from_slice(&[3.0f32, 4.0], &[2], &cpu())?;
    let w = Tensor::from_slice(&[1.0f32, -2.0], &[2], &cpu())?.requires_grad_()?;
    assert!(w.requires_grad());
    // loss = Σ w² · x: ∂/∂w = 2·w·x.
    w.square()?.mul(&x)?.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![6.0, -16.0]);
    let var = w.as_var().expect("a leaf knows its variable");
    assert_eq!(Tensor::from(&var).grad().unwrap().to_vec::<f32>()?, vec![6.0, -16.0]);
    // The leaf shares the variable's memory: a value written with `Var::set` is what the next
    // forward pass through the same tensor reads.
    var.zero_grad();
    var.set(Tensor::from_slice(&[0.5f32, 0.5], &[2], &cpu())?)?;
    w.square()?.mul(&x)?.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![3.0, 4.0]);
    // Only floats; an already recorded tensor becomes a leaf of its own.
    let ids = Tensor::from_slice(&[1i64], &[1], &cpu())?;
    assert_eq!(ids.clone().requires_grad_().unwrap_err().kind(), ErrorKind::WrongDType);
    assert_eq!(Var::try_from(ids).err().unwrap().kind(), ErrorKind::WrongDType);
    let computed = w.mul_scalar(2.0)?;
    let leaf = computed.clone().requires_grad_()?;
    assert!(leaf.grad_fn().is_none() && leaf.as_var().unwrap().id() != var.id());
    leaf.sum_all()?.backward()?;
    assert_eq!(leaf.grad().unwrap().to_vec::<f32>()?, vec![1.0, 1.0]);
    assert_eq!(
        w.grad().unwrap().to_vec::<f32>()?,
        vec![3.0, 4.0],
        "nothing flowed back to w"
    );
    Ok(())
}
