//! Hostile use of the training library (DESIGN.md, "Trust"): wherever PyTorch raises, cartage
//! returns a typed error, and a refused call changes nothing. Optimizer steps and constructors,
//! the Adam step counter, the GradScaler's state machine, strict checkpoints and schedules at
//! huge step counts. Device cases run on every GPU that opens (wgpu through lavapipe here), each
//! missing one skipped loudly, or a failure when `CARTAGE_REQUIRE` names its kind.

mod common;

use std::collections::HashMap;
use std::path::Path;

use cartage::prelude::*;
use cartage::{Error, ErrorKind, SafetensorsFile, save_safetensors_with_metadata};
use cartage_nn::optim::{Adam, AdamW, LrSchedule, Optimizer, OptimizerState, Sgd, StepLr};
use cartage_nn::{GradScaler, LoadOptions, ParamStore, load_checkpoint, load_checkpoint_with, save_checkpoint};

/// The CPU and every GPU that opens.
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

/// A store with `w` [3] and `b` [2] on `device`.
fn store_on(device: &Device) -> Result<ParamStore> {
    let store = ParamStore::new(device);
    store
        .root()
        .var("w", Tensor::from_slice(&[1.0f32, -2.0, 0.5], &[3], &Device::cpu())?)?;
    store
        .root()
        .var("b", Tensor::from_slice(&[0.25f32, 3.0], &[2], &Device::cpu())?)?;
    Ok(store)
}

/// Gradients of `Σ (1 + k)·sin(p)` (fresh: the old ones are freed first).
fn backward(store: &ParamStore, k: f64) -> Result<()> {
    store.zero_grad();
    let mut loss: Option<Tensor> = None;
    for var in store.vars() {
        let term = var.tensor().sin()?.mul_scalar(1.0 + k)?.sum_all()?;
        loss = Some(match loss {
            Some(l) => l.add(&term)?,
            None => term,
        });
    }
    loss.expect("a store with parameters").backward().map(drop)
}

fn values(store: &ParamStore) -> Result<Vec<Vec<f32>>> {
    store.vars().iter().map(|v| v.value().to_vec::<f32>()).collect()
}

fn grads(store: &ParamStore) -> Result<Vec<Vec<f32>>> {
    store
        .vars()
        .iter()
        .map(|v| v.grad().expect("a gradient").to_vec::<f32>())
        .collect()
}

/// An optimizer's tensors and scalars as sorted host values.
type Snapshot = (Vec<(String, Vec<f32>)>, Vec<(String, f64)>);

/// An optimizer's state as sorted host values, to compare bit for bit.
fn snapshot(opt: &dyn Optimizer, store: &ParamStore) -> Result<Snapshot> {
    let state = opt.state(store)?;
    let mut tensors = state
        .tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_dtype(DType::F32)?.to_vec::<f32>()?)))
        .collect::<Result<Vec<_>>>()?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut scalars = state.scalars.clone();
    scalars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((tensors, scalars))
}

type Make = fn(&ParamStore) -> Result<Box<dyn Optimizer>>;

fn optimizers() -> Vec<(&'static str, Make)> {
    vec![
        ("Sgd", |s| {
            let mut o = Sgd::new(s, 0.1)?;
            o.momentum = 0.9;
            Ok(Box::new(o))
        }),
        ("Adam", |s| Ok(Box::new(Adam::new(s, 0.1)?))),
        ("AdamW", |s| Ok(Box::new(AdamW::new(s, 0.1)?))),
    ]
}

// ---------------------------------------------------------------- 1. refused steps, constructors

#[test]
fn a_refused_step_leaves_every_buffer_untouched() -> Result<()> {
    for device in devices("a_refused_step_leaves_every_buffer_untouched") {
        for (name, make) in optimizers() {
            // Straight: three steps.
            let straight = store_on(&device)?;
            let mut opt = make(&straight)?;
            for k in 0..3 {
                backward(&straight, k as f64)?;
                opt.step(&straight)?;
            }
            // The same, with refused steps (NaN, inf, negative rate) after the first.
            let store = store_on(&device)?;
            let mut opt = make(&store)?;
            backward(&store, 0.0)?;
            opt.step(&store)?;
            backward(&store, 1.0)?;
            let (before, params) = (snapshot(opt.as_ref(), &store)?, values(&store)?);
            for lr in [f64::NAN, f64::INFINITY, -0.1] {
                opt.set_learning_rate(lr);
                let err = opt.step(&store).unwrap_err();
                assert_eq!(
                    err.kind(),
                    ErrorKind::InvalidArgument,
                    "{name} on {device}, lr {lr}: {err}"
                );
                assert!(err.to_string().contains("Invalid learning rate"), "{err}");
                assert_eq!(
                    snapshot(opt.as_ref(), &store)?.0,
                    before.0,
                    "{name} on {device}: state changed"
                );
                assert_eq!(values(&store)?, params, "{name} on {device}: parameters changed");
            }
            opt.set_learning_rate(0.1);
            opt.step(&store)?;
            backward(&store, 2.0)?;
            opt.step(&store)?;
            assert_eq!(
                values(&store)?,
                values(&straight)?,
                "{name} on {device}: the refused steps changed the run"
            );
        }
    }
    Ok(())
}

#[test]
fn constructors_refuse_what_pytorch_refuses() -> Result<()> {
    let cpu = Device::cpu();
    let empty = ParamStore::new(&cpu);
    let refused = |r: Result<()>, says: &str| {
        let err = r.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains(says), "`{err}` does not say `{says}`");
    };
    refused(Sgd::new(&empty, 0.1).map(drop), "empty parameter list");
    refused(Adam::new(&empty, 0.1).map(drop), "empty parameter list");
    refused(AdamW::new(&empty, 0.1).map(drop), "empty parameter list");
    let store = store_on(&cpu)?;
    for lr in [-1e-3, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        refused(Sgd::new(&store, lr).map(drop), "Invalid learning rate");
        refused(Adam::new(&store, lr).map(drop), "Invalid learning rate");
        refused(AdamW::new(&store, lr).map(drop), "Invalid learning rate");
    }
    for (betas, says) in [
        ((1.0, 0.999), "index 0"),
        ((-0.1, 0.999), "index 0"),
        ((0.9, 1.0), "index 1"),
        ((0.9, f64::NAN), "index 1"),
    ] {
        refused(Adam::new(&store, 0.1)?.with(betas, 1e-8, 0.0).map(drop), says);
        refused(AdamW::new(&store, 0.1)?.with(betas, 1e-8, 0.0).map(drop), says);
    }
    refused(
        AdamW::new(&store, 0.1)?.with((0.9, 0.999), -1e-8, 0.0).map(drop),
        "Invalid epsilon",
    );
    refused(
        AdamW::new(&store, 0.1)?.with((0.9, 0.999), 1e-8, -0.01).map(drop),
        "Invalid weight_decay",
    );
    refused(
        Adam::new(&store, 0.1)?.with((0.9, 0.999), f64::NAN, 0.0).map(drop),
        "Invalid epsilon",
    );
    // SGD's public hyperparameters are checked by the step, before anything changes.
    backward(&store, 0.0)?;
    let params = values(&store)?;
    for set in [
        |o: &mut Sgd| o.momentum = -0.9,
        |o: &mut Sgd| o.weight_decay = -1.0,
        |o: &mut Sgd| o.nesterov = true,
    ] {
        let mut sgd = Sgd::new(&store, 0.1)?;
        set(&mut sgd);
        refused(sgd.step(&store), "");
        assert_eq!(values(&store)?, params);
    }
    Ok(())
}

// ---------------------------------------------------------------- 2. the Adam step counter

/// `opt`'s state with the saved step replaced by `step`.
fn with_step(opt: &dyn Optimizer, store: &ParamStore, step: f64) -> Result<OptimizerState> {
    let mut state = opt.state(store)?;
    for (name, v) in &mut state.scalars {
        if name == "step" {
            *v = step;
        }
    }
    Ok(state)
}

#[test]
fn an_invalid_saved_step_is_refused_and_a_huge_one_never_wraps() -> Result<()> {
    let cpu = Device::cpu();
    let store = store_on(&cpu)?;
    let mut opt = AdamW::new(&store, 0.1)?;
    backward(&store, 0.0)?;
    opt.step(&store)?;
    let saved = opt.state(&store)?;
    let before = snapshot(&opt, &store)?;
    // 2^64 does not fit a u64 (an `as u64` cast saturated it, and the next step overflowed).
    for bad in [-1.0, f64::NAN, f64::INFINITY, 1.5, 18_446_744_073_709_551_616.0] {
        let err = opt.load_state(&store, &with_step(&opt, &store, bad)?).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "step {bad}: {err}");
        assert!(err.to_string().contains("step"), "{err}");
        assert_eq!(snapshot(&opt, &store)?, before, "step {bad}: the optimizer changed");
        assert_eq!(opt.steps(), 1);
    }
    // The largest step an f64 holds below 2^64 loads and steps on (bias corrections are 1).
    let huge = 18_446_744_073_709_549_568.0;
    opt.load_state(&store, &with_step(&opt, &store, huge)?)?;
    assert_eq!(opt.steps(), huge as u64);
    backward(&store, 1.0)?;
    opt.step(&store)?;
    assert_eq!(opt.steps(), huge as u64 + 1);
    assert!(values(&store)?.iter().flatten().all(|x| x.is_finite()));
    opt.load_state(&store, &saved)?;
    assert_eq!(opt.steps(), 1);
    Ok(())
}

// ---------------------------------------------------------------- 3. GradScaler

fn scaled_backward(store: &ParamStore, scaler: &GradScaler) -> Result<()> {
    store.zero_grad();
    // One backward per parameter: they may differ in dtype or device.
    for var in store.vars() {
        scaler.scale(&var.tensor().square()?.sum_all()?)?.backward()?;
    }
    Ok(())
}

#[test]
fn the_scaler_unscales_at_most_once_and_steps_at_most_once_per_update() -> Result<()> {
    for device in devices("the_scaler_unscales_at_most_once_and_steps_at_most_once_per_update") {
        let store = store_on(&device)?;
        let mut opt = Sgd::new(&store, 0.1)?;
        let mut scaler = GradScaler::with_scale(1024.0);
        scaled_backward(&store, &scaler)?;
        scaler.unscale(&store)?;
        let true_grads = grads(&store)?;
        let expected: Vec<Vec<f32>> = values(&store)?
            .iter()
            .map(|p| p.iter().map(|x| 2.0 * x).collect())
            .collect();
        assert_eq!(true_grads, expected, "on {device}");
        let err = scaler.unscale(&store).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
        assert!(err.to_string().contains("already been called"), "{err}");
        assert_eq!(grads(&store)?, true_grads, "on {device}: unscaled twice");

        assert!(scaler.step(&mut opt, &store)?);
        let stepped = values(&store)?;
        let err = scaler.step(&mut opt, &store).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
        assert!(err.to_string().contains("step() has already been called"), "{err}");
        assert_eq!(values(&store)?, stepped, "on {device}: stepped twice");
        let err = scaler.unscale(&store).unwrap_err();
        assert!(err.to_string().contains("after step()"), "{err}");
        assert_eq!(scaler.current_scale(), 1024.0);

        // update() starts over: the next iteration runs (and steps through an implicit unscale).
        scaler.update();
        scaled_backward(&store, &scaler)?;
        assert!(scaler.step(&mut opt, &store)?);
        scaler.update();
    }
    Ok(())
}

#[test]
fn the_scaler_refuses_a_step_with_no_gradient() -> Result<()> {
    let cpu = Device::cpu();
    let store = store_on(&cpu)?;
    let mut opt = Sgd::new(&store, 0.1)?;
    let mut scaler = GradScaler::new();
    let params = values(&store)?;
    let err = scaler.step(&mut opt, &store).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
    assert!(
        err.to_string()
            .contains("No inf checks were recorded for this optimizer"),
        "{err}"
    );
    assert_eq!(values(&store)?, params);
    Ok(())
}

#[test]
fn the_scaler_checks_every_gradient_before_dividing_any() -> Result<()> {
    let cpu = Device::cpu();
    let store = store_on(&cpu)?;
    let mut scaler = GradScaler::with_scale(8.0);
    // `b` in f16: PyTorch refuses to unscale f16 gradients (keep f32 master weights).
    let b = store.get("b").expect("b");
    b.rebind(b.value().to_dtype(DType::F16)?)?;
    scaled_backward(&store, &scaler)?;
    let w = store.get("w").expect("w");
    let scaled = w.grad().expect("grad").to_vec::<f32>()?;
    let err = scaler.unscale(&store).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("unscale"), "{err}");
    assert_eq!(
        w.grad().expect("grad").to_vec::<f32>()?,
        scaled,
        "w was divided before b was refused"
    );
    // Nothing was recorded: with b fixed the same gradients unscale once.
    b.rebind(b.value().to_dtype(DType::F32)?)?;
    scaled_backward(&store, &scaler)?;
    scaler.unscale(&store)?;
    Ok(())
}

#[test]
fn the_scaler_unscales_parameters_on_two_devices() -> Result<()> {
    for gpu in common::gpu_devices("the_scaler_unscales_parameters_on_two_devices") {
        let store = store_on(&Device::cpu())?;
        let b = store.get("b").expect("b");
        b.rebind(b.value().to(&gpu)?)?;
        let mut scaler = GradScaler::with_scale(64.0);
        store.zero_grad();
        for var in store.vars() {
            scaler.scale(&var.tensor().square()?.sum_all()?)?.backward()?;
        }
        let mut opt = Sgd::new(&store, 0.1)?;
        let before = values(&store)?;
        assert!(scaler.step(&mut opt, &store)?, "on cpu and {gpu}");
        let want: Vec<Vec<f32>> = before
            .iter()
            .map(|p| p.iter().map(|x| x - 0.1 * 2.0 * x).collect())
            .collect();
        assert_eq!(values(&store)?, want, "on cpu and {gpu}");
        scaler.update();
    }
    Ok(())
}

// ---------------------------------------------------------------- 4. checkpoints

fn tempdir() -> Result<tempfile::TempDir> {
    tempfile::tempdir().map_err(|e| Error::Io {
        path: "tempdir".into(),
        source: e,
    })
}

/// A trained AdamW on `store`, saved to `path`.
fn trained(store: &ParamStore, path: &Path) -> Result<AdamW> {
    let mut opt = AdamW::new(store, 0.1)?;
    backward(store, 0.0)?;
    opt.step(store)?;
    store.zero_grad();
    save_checkpoint(path, store, &opt, None, &[])?;
    Ok(opt)
}

/// Rewrite the checkpoint at `path` through `edit`.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>, &mut HashMap<String, String>)) -> Result<()> {
    let file = SafetensorsFile::open(path)?;
    let mut tensors: Vec<(String, Tensor)> = file.load(&Device::cpu())?.into_iter().collect();
    let mut metadata = file.metadata().clone();
    drop(file);
    edit(&mut tensors, &mut metadata);
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    save_safetensors_with_metadata(path, &refs, &metadata)
}

fn mismatch(err: Error) -> (Vec<String>, Vec<String>, Vec<String>) {
    match err {
        Error::StateMismatch {
            mut missing,
            mut unexpected,
            mut mismatched,
            ..
        } => {
            missing.sort();
            unexpected.sort();
            mismatched.sort();
            (missing, unexpected, mismatched)
        }
        other => panic!("expected StateMismatch, got {other}"),
    }
}

#[test]
fn a_checkpoint_load_is_strict_and_all_or_nothing() -> Result<()> {
    for device in devices("a_checkpoint_load_is_strict_and_all_or_nothing") {
        a_checkpoint_load_is_strict_and_all_or_nothing_on(&device)?;
    }
    Ok(())
}

fn a_checkpoint_load_is_strict_and_all_or_nothing_on(device: &Device) -> Result<()> {
    let dir = tempdir()?;
    let path = dir.path().join("ckpt.safetensors");
    let saved_from = store_on(device)?;
    trained(&saved_from, &path)?;

    // Another architecture: `w` only, plus `extra`; nothing may change.
    let other = ParamStore::new(device);
    other
        .root()
        .var("w", Tensor::zeros(&[3], DType::F32, &Device::cpu())?)?;
    other
        .root()
        .var("extra", Tensor::zeros(&[4], DType::F32, &Device::cpu())?)?;
    let mut opt = AdamW::new(&other, 0.1)?;
    let before = (values(&other)?, snapshot(&opt, &other)?);
    let (missing, unexpected, mismatched) =
        mismatch(load_checkpoint(&path, &other, &mut opt, None, &mut []).unwrap_err());
    assert_eq!(missing, ["model/extra"]);
    assert_eq!(unexpected, ["model/b", "optim/b.m", "optim/b.v"]);
    assert!(mismatched.is_empty(), "{mismatched:?}");
    assert_eq!((values(&other)?, snapshot(&opt, &other)?), before);

    // Non-strict: `w` and its moments load, the rest is reported.
    let skipped = load_checkpoint_with(&path, &other, &mut opt, None, &mut [], LoadOptions { strict: false })?;
    assert_eq!(skipped.missing, ["model/extra"]);
    assert_eq!(values(&other)?[0], values(&saved_from)?[0]);
    assert_eq!(opt.steps(), 1);

    // Another dtype and another shape: mismatched, each named.
    let cast = ParamStore::new(device);
    cast.root().var("w", Tensor::zeros(&[3], DType::F64, &Device::cpu())?)?;
    cast.root().var("b", Tensor::zeros(&[5], DType::F32, &Device::cpu())?)?;
    let mut opt = AdamW::new(&cast, 0.1)?;
    let (missing, _, mismatched) = mismatch(load_checkpoint(&path, &cast, &mut opt, None, &mut []).unwrap_err());
    assert!(missing.is_empty(), "{missing:?}");
    assert_eq!(mismatched.len(), 4, "{mismatched:?}"); // model/b, optim/b.m, optim/b.v, model/w
    assert!(mismatched.iter().any(|m| m.starts_with("model/w:")), "{mismatched:?}");
    assert!(mismatched.iter().any(|m| m.starts_with("model/b")));
    Ok(())
}

#[test]
fn a_missing_moment_or_a_bad_step_in_a_checkpoint_is_refused() -> Result<()> {
    for device in devices("a_missing_moment_or_a_bad_step_in_a_checkpoint_is_refused") {
        a_missing_moment_or_a_bad_step_in_a_checkpoint_is_refused_on(&device)?;
    }
    Ok(())
}

fn a_missing_moment_or_a_bad_step_in_a_checkpoint_is_refused_on(device: &Device) -> Result<()> {
    let dir = tempdir()?;
    let path = dir.path().join("ckpt.safetensors");
    let saved_from = store_on(device)?;
    trained(&saved_from, &path)?;

    // A second run, one step further, whose state must survive every refused load.
    let store = store_on(device)?;
    let mut opt = AdamW::new(&store, 0.1)?;
    for k in 0..2 {
        backward(&store, k as f64)?;
        opt.step(&store)?;
    }
    store.zero_grad();
    let before = (values(&store)?, snapshot(&opt, &store)?);

    rewrite(&path, |tensors, _| tensors.retain(|(n, _)| n != "optim/w.v"))?;
    let (missing, _, _) = mismatch(load_checkpoint(&path, &store, &mut opt, None, &mut []).unwrap_err());
    assert_eq!(missing, ["optim/w.v"]);
    assert_eq!((values(&store)?, snapshot(&opt, &store)?), before);

    trained(&saved_from, &path)?;
    rewrite(&path, |_, metadata| {
        metadata.remove("optim.step");
    })?;
    let (missing, _, _) = mismatch(load_checkpoint(&path, &store, &mut opt, None, &mut []).unwrap_err());
    assert_eq!(missing, ["optim.step"]);
    assert_eq!((values(&store)?, snapshot(&opt, &store)?), before);

    for bad in ["-1", "NaN", "inf", "2.5"] {
        trained(&saved_from, &path)?;
        rewrite(&path, |_, metadata| {
            metadata.insert("optim.step".into(), bad.into());
        })?;
        let err = load_checkpoint(&path, &store, &mut opt, None, &mut []).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "step {bad}: {err}");
        assert_eq!((values(&store)?, snapshot(&opt, &store)?), before, "step {bad}");
    }

    trained(&saved_from, &path)?;
    rewrite(&path, |tensors, _| {
        tensors.push(("junk".into(), Tensor::zeros(&[1], DType::F32, &Device::cpu()).unwrap()));
    })?;
    let (_, unexpected, _) = mismatch(load_checkpoint(&path, &store, &mut opt, None, &mut []).unwrap_err());
    assert_eq!(unexpected, ["junk"]);

    // A requested scaler that the file lacks.
    trained(&saved_from, &path)?;
    let mut scaler = GradScaler::new();
    let (missing, _, _) = mismatch(load_checkpoint(&path, &store, &mut opt, Some(&mut scaler), &mut []).unwrap_err());
    assert_eq!(missing, ["scaler.scale"]);
    assert_eq!((values(&store)?, snapshot(&opt, &store)?), before);

    // The intact file loads.
    load_checkpoint(&path, &store, &mut opt, None, &mut [])?;
    assert_eq!(values(&store)?, values(&saved_from)?);
    assert_eq!(opt.steps(), 1);
    Ok(())
}

// ---------------------------------------------------------------- 5. schedules

#[test]
fn step_lr_at_huge_steps_is_what_pytorch_computes() {
    let halving = StepLr {
        base: 1.0,
        step_size: 1,
        gamma: 0.5,
    };
    // PyTorch: 1.0 * 0.5 ** (2**31) == 0.0 (an i32 exponent wrapped to -2^31 gave inf).
    assert_eq!(halving.lr(1 << 31), 0.0);
    assert_eq!(halving.lr(usize::MAX), 0.0);
    let slow = StepLr {
        base: 0.1,
        step_size: 3,
        gamma: 0.999_999_999,
    };
    let step = 3 * ((1usize << 32) + 5);
    assert_eq!(slow.lr(step), 0.1 * 0.999_999_999f64.powf(((1u64 << 32) + 5) as f64));
    assert!(slow.lr(step) > 0.0 && slow.lr(step) < 0.1);
    let constant = StepLr {
        base: 0.3,
        step_size: 7,
        gamma: 1.0,
    };
    assert_eq!(constant.lr(usize::MAX), 0.3);
}
