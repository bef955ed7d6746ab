//! Autograd is as strict as PyTorch's, whatever the caller does between forward and backward:
//!
//! - a tensor saved for backward and then written in place (`copy_from`, an async copy, an
//!   optimizer step alone or multi-tensor, `Var::set`, a write through `detach()`) makes backward
//!   fail with [`ErrorKind::ModifiedInPlace`], naming the op and both sites; writing a tensor
//!   that no op saved is fine;
//! - `Var::set` copies into the variable's own memory and refuses another dtype or device;
//!   `Var::rebind` moves or casts, and a backward through a graph recorded before the move is a
//!   typed error, never a gradient of the wrong dtype or device;
//! - one loss backpropagated from several threads at once: exactly one succeeds, the others get
//!   a typed error, and the gradients are those of one backward;
//! - a gradient hook that starts a backward gets [`ErrorKind::InvalidState`], not a stack
//!   overflow.
//!
//! Every case runs on the CPU and again on every other device that opens here.

mod common;

use std::sync::{Arc, Barrier};

use cartage::optim::{AdamSlot, SgdSlot, adam_step_many, sgd_step_many};
use cartage::prelude::*;
use cartage::{AdamUpdate, Error, ErrorKind, SgdUpdate, Var};

/// The CPU, then every GPU that opens (the others print a SKIP line, or fail when
/// `CARTAGE_REQUIRE` names their kind).
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

fn var(values: &[f32], device: &Device) -> Result<Var> {
    Var::new(Tensor::from_slice(values, &[values.len()], device)?)
}

fn plain(values: &[f32], device: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, &[values.len()], device)
}

const SGD: SgdUpdate = SgdUpdate {
    lr: 0.5,
    momentum: 0.0,
    dampening: 0.0,
    weight_decay: 0.0,
    nesterov: false,
    first_step: false,
};

const ADAM: AdamUpdate = AdamUpdate {
    lr: 0.1,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
    decoupled: true,
    step: 1,
};

/// `result` is `ModifiedInPlace` for `op`, written by `written_by` from this file.
fn assert_modified<T: std::fmt::Debug>(device: &Device, result: Result<T>, op: &str, written_by: &str) {
    match result {
        Err(
            ref e @ Error::ModifiedInPlace {
                op: got_op,
                written_by: got_by,
                written_at,
                saved_version,
                version,
                ..
            },
        ) => {
            assert_eq!(got_op, op, "{device}: {e}");
            assert_eq!(got_by, written_by, "{device}: {e}");
            assert!(written_at.file().ends_with("hostile_autograd.rs"), "{device}: {e}");
            assert!(version > saved_version, "{device}: {e}");
            assert!(!e.to_string().is_empty());
        }
        other => panic!("{device}: expected ModifiedInPlace by `{written_by}` in `{op}`, got {other:?}"),
    }
}

#[test]
fn copy_from_into_a_saved_input_is_refused() -> Result<()> {
    for device in devices("copy_from_into_a_saved_input_is_refused") {
        let w = var(&[1.0, 2.0], &device)?;
        let x = plain(&[3.0, 4.0], &device)?;
        let loss = w.tensor().mul(&x)?.sum_all()?; // mul saves x
        x.copy_from(&plain(&[5.0, 6.0], &device)?)?;
        assert_modified(&device, loss.backward(), "mul", "copy_from");
        assert!(w.grad().is_none(), "{device}: no gradient from a refused backward");
    }
    Ok(())
}

#[test]
fn a_write_through_detach_into_a_saved_output_is_refused() -> Result<()> {
    for device in devices("a_write_through_detach_into_a_saved_output_is_refused") {
        let w = var(&[0.0, 1.0], &device)?;
        let y = w.tensor().exp()?; // exp saves its own output
        let loss = y.sum_all()?;
        y.detach().copy_from(&plain(&[7.0, 7.0], &device)?)?;
        assert_modified(&device, loss.backward(), "exp", "copy_from");
    }
    Ok(())
}

#[test]
fn writing_a_tensor_no_op_saved_is_fine() -> Result<()> {
    for device in devices("writing_a_tensor_no_op_saved_is_fine") {
        let w = var(&[1.0, 2.0], &device)?;
        let x = plain(&[3.0, 4.0], &device)?;
        let loss = w.tensor().add(&x)?.sum_all()?; // add saves nothing
        x.copy_from(&plain(&[5.0, 6.0], &device)?)?;
        loss.backward()?;
        assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![1.0, 1.0], "{device}");
    }
    Ok(())
}

#[test]
fn an_async_copy_into_a_saved_tensor_is_refused() -> Result<()> {
    for device in devices("an_async_copy_into_a_saved_tensor_is_refused") {
        let w = var(&[1.0, 2.0], &device)?;
        let x = plain(&[3.0, 4.0], &device)?;
        let loss = w.tensor().mul(&x)?.sum_all()?;
        let mut staging = cartage::alloc_staging(&device, 8)?;
        staging.as_mut_slice_of::<f32>()?.copy_from_slice(&[9.0, 9.0]);
        x.copy_from_pinned_async(&staging)?.wait()?;
        assert_modified(&device, loss.backward(), "mul", "copy_from_pinned_async");
    }
    Ok(())
}

#[test]
fn an_optimizer_step_on_a_saved_parameter_is_refused() -> Result<()> {
    for device in devices("an_optimizer_step_on_a_saved_parameter_is_refused") {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &device)?;
        let grad = Tensor::full(&[2, 2], 0.5, DType::F32, &device)?;
        // One fused (or composed) step per parameter.
        let w = Var::new(Tensor::full(&[2, 2], 1.0, DType::F32, &device)?)?;
        let loss = x.matmul(&w.tensor())?.sum_all()?; // matmul saves w
        w.value().sgd_step_(&grad, None, SGD)?;
        assert_modified(&device, loss.backward(), "matmul", "sgd_step_");

        let w = Var::new(Tensor::full(&[2, 2], 1.0, DType::F32, &device)?)?;
        let loss = x.matmul(&w.tensor())?.sum_all()?;
        let (m, v) = (w.value().zeros_like()?, w.value().zeros_like()?);
        w.value().adam_step_(&grad, &m, &v, ADAM)?;
        assert_modified(&device, loss.backward(), "matmul", "adam_step_");

        // Multi-tensor steps.
        let (a, b) = (
            Var::new(Tensor::full(&[2, 2], 1.0, DType::F32, &device)?)?,
            Var::new(Tensor::full(&[2, 2], 2.0, DType::F32, &device)?)?,
        );
        let loss = x.matmul(&a.tensor())?.add(&b.tensor())?.sum_all()?;
        let (pa, pb) = (a.value(), b.value());
        let slots = [
            SgdSlot {
                param: &pa,
                grad: &grad,
                momentum_buffer: None,
            },
            SgdSlot {
                param: &pb,
                grad: &grad,
                momentum_buffer: None,
            },
        ];
        sgd_step_many(SGD, &slots)?;
        assert_modified(&device, loss.backward(), "matmul", UpdateKindName::sgd());

        let w = Var::new(Tensor::full(&[2, 2], 1.0, DType::F32, &device)?)?;
        let loss = x.matmul(&w.tensor())?.sum_all()?;
        let p = w.value();
        let (m, v) = (p.zeros_like()?, p.zeros_like()?);
        adam_step_many(
            ADAM,
            &[AdamSlot {
                param: &p,
                grad: &grad,
                exp_avg: &m,
                exp_avg_sq: &v,
            }],
        )?;
        assert_modified(&device, loss.backward(), "matmul", UpdateKindName::adam());
    }
    Ok(())
}

/// The names multi-tensor steps report their writes under.
struct UpdateKindName;

impl UpdateKindName {
    fn sgd() -> &'static str {
        cartage::UpdateKind::Sgd.many_name()
    }
    fn adam() -> &'static str {
        cartage::UpdateKind::Adam.many_name()
    }
}

#[test]
fn var_set_between_forward_and_backward_is_refused() -> Result<()> {
    for device in devices("var_set_between_forward_and_backward_is_refused") {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &device)?;
        let w = Var::new(Tensor::full(&[2, 2], 1.0, DType::F32, &device)?)?;
        let loss = x.matmul(&w.tensor())?.sum_all()?;
        w.set(Tensor::full(&[2, 2], 3.0, DType::F32, &device)?)?;
        assert_modified(&device, loss.backward(), "matmul", "copy_from");
    }
    Ok(())
}

#[test]
fn var_set_copies_into_the_variables_own_memory() -> Result<()> {
    for device in devices("var_set_copies_into_the_variables_own_memory") {
        let source = plain(&[1.0, 2.0], &device)?;
        let (a, b) = (var(&[0.0, 0.0], &device)?, var(&[0.0, 0.0], &device)?);
        a.set(source.clone())?;
        b.set(source.clone())?;
        assert!(!a.value().shares_storage(&source), "{device}");
        assert!(!a.value().shares_storage(&b.value()), "{device}");
        // A step on one model leaves the other, and the source, alone.
        a.value().sgd_step_(&plain(&[1.0, 1.0], &device)?, None, SGD)?;
        assert_eq!(a.value().to_vec::<f32>()?, vec![0.5, 1.5], "{device}");
        assert_eq!(b.value().to_vec::<f32>()?, vec![1.0, 2.0], "{device}");
        assert_eq!(source.to_vec::<f32>()?, vec![1.0, 2.0], "{device}");
    }
    Ok(())
}

#[test]
fn var_set_refuses_another_dtype_or_device() -> Result<()> {
    for device in devices("var_set_refuses_another_dtype_or_device") {
        let w = var(&[1.0, 2.0], &device)?;
        let err = w.set(plain(&[1.0, 2.0], &device)?.to_dtype(DType::F16)?).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{device}: {err}");
        assert!(err.to_string().contains("rebind"), "{device}: {err}");
        assert_eq!(w.dtype(), DType::F32, "{device}");
        if !device.is_cpu() {
            let err = w.set(plain(&[1.0, 2.0], &Device::cpu())?).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{device}: {err}");
            assert_eq!(w.device(), device);
        }
    }
    Ok(())
}

#[test]
fn a_gradient_for_a_variable_cast_since_the_forward_pass_is_refused() -> Result<()> {
    for device in devices("a_gradient_for_a_variable_cast_since_the_forward_pass_is_refused") {
        let w = var(&[1.0, 2.0], &device)?;
        let loss = w.tensor().square()?.sum_all()?;
        w.rebind(w.value().to_dtype(DType::F16)?)?;
        let err = loss.backward().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Autograd, "{device}: {err}");
        assert!(w.grad().is_none(), "{device}: no gradient of the old dtype");
        if !device.is_cpu() {
            let w = var(&[1.0, 2.0], &device)?;
            let loss = w.tensor().square()?.sum_all()?;
            w.rebind(w.value().to(&Device::cpu())?)?;
            let err = loss.backward().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Autograd, "{device}: {err}");
            assert!(w.grad().is_none(), "{device}: no gradient on the old device");
        }
    }
    Ok(())
}

#[test]
fn concurrent_backwards_of_one_loss_have_exactly_one_winner() -> Result<()> {
    const THREADS: usize = 8;
    for device in devices("concurrent_backwards_of_one_loss_have_exactly_one_winner") {
        let rounds = if device.is_cpu() { 200 } else { 10 };
        for round in 0..rounds {
            let w = var(&[1.0, 2.0, 3.0], &device)?;
            // A chain of a few ops, so that threads meet inside the graph, not only at its root.
            let loss = w
                .tensor()
                .square()?
                .mul_scalar(2.0)?
                .exp()?
                .mul_scalar(0.01)?
                .sum_all()?;
            let start = Arc::new(Barrier::new(THREADS));
            let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|_| {
                        let (loss, start) = (&loss, Arc::clone(&start));
                        s.spawn(move || {
                            start.wait();
                            loss.backward().map(drop)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a backward thread panicked"))
                    .collect()
            });
            let winners = outcomes.iter().filter(|o| o.is_ok()).count();
            assert_eq!(winners, 1, "{device} round {round}: {outcomes:?}");
            for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
                assert!(
                    matches!(e.kind(), ErrorKind::Autograd | ErrorKind::InvalidState),
                    "{device} round {round}: {e}"
                );
            }
            let single = var(&[1.0, 2.0, 3.0], &device)?;
            single
                .tensor()
                .square()?
                .mul_scalar(2.0)?
                .exp()?
                .mul_scalar(0.01)?
                .sum_all()?
                .backward()?;
            assert_eq!(
                w.grad().unwrap().to_vec::<f32>()?,
                single.grad().unwrap().to_vec::<f32>()?,
                "{device} round {round}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_hook_that_starts_a_backward_is_refused() -> Result<()> {
    for device in devices("a_hook_that_starts_a_backward_is_refused") {
        let w = var(&[1.0, 2.0], &device)?;
        // A graph recorded beforehand, retained: a hook that backpropagates through it reaches
        // `w` again and runs itself again, without end (a stack overflow before the fix).
        let again = w.tensor().square()?.sum_all()?;
        w.on_grad_ready(Arc::new(move |_: &Var, _: &Tensor| {
            again.backward_with(None, true).map(drop)
        }));
        let err = w.tensor().mul_scalar(3.0)?.sum_all()?.backward().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidState, "{device}: {err}");
        assert!(err.to_string().contains("hook"), "{device}: {err}");
        // The thread is usable again afterwards.
        let v = var(&[1.0], &device)?;
        v.tensor().sum_all()?.backward()?;
        assert_eq!(v.grad().unwrap().to_vec::<f32>()?, vec![1.0], "{device}");
    }
    Ok(())
}
