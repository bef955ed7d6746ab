//! `ParamStore::state_dict` / `load_state_dict`: PyTorch's names and layouts, strict by default
//! and all-or-nothing, copies into each parameter's own memory, files, and loading across
//! devices. Device cases run on the CPU and every GPU that opens (wgpu through lavapipe here),
//! each missing one skipped loudly, or a failure when `CARTAGE_REQUIRE` names its kind.

mod common;

use cartage::prelude::*;
use cartage::{Error, ErrorKind};
use cartage_nn::layers::{LayerNorm, Linear};
use cartage_nn::{LoadOptions, Module, ParamStore, StateDict};

/// The CPU and every GPU that opens.
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

/// `0.weight` [2, 3], `0.bias` [2], `1.weight` [2], `1.bias` [2]: a Linear then a LayerNorm.
fn model(device: &Device, seed: u64) -> Result<(ParamStore, Linear, LayerNorm)> {
    let store = ParamStore::new(device);
    let linear = Linear::new(&store.root().sub(0), 3, 2, true, &mut Generator::new(seed))?;
    let norm = LayerNorm::new(&store.root().sub(1), 2, 1e-5)?;
    Ok((store, linear, norm))
}

fn host(state: &StateDict) -> Result<Vec<(String, Vec<f32>)>> {
    state.iter().map(|(k, t)| Ok((k.clone(), t.to_vec::<f32>()?))).collect()
}

/// A map as PyTorch's `nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2)).state_dict()` has it.
fn torch_layout(device: &Device) -> Result<StateDict> {
    let mut state = StateDict::new();
    let w = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0]; // [out = 2, in = 3]
    state.insert("0.weight".into(), Tensor::from_slice(&w, &[2, 3], device)?);
    state.insert("0.bias".into(), Tensor::from_slice(&[0.5f32, -0.5], &[2], device)?);
    state.insert("1.weight".into(), Tensor::from_slice(&[2.0f32, 1.0], &[2], device)?);
    state.insert("1.bias".into(), Tensor::from_slice(&[0.0f32, 1.0], &[2], device)?);
    Ok(state)
}

#[test]
fn names_and_layouts_are_pytorchs() -> Result<()> {
    let (store, linear, _) = model(&Device::cpu(), 0)?;
    let state = store.state_dict();
    let keys: Vec<&str> = state.keys().map(String::as_str).collect();
    assert_eq!(keys, ["0.bias", "0.weight", "1.bias", "1.weight"]);
    assert_eq!(state["0.weight"].shape(), &[2, 3], "Linear weights are [out, in]");
    store.load_state_dict(&torch_layout(&Device::cpu())?, LoadOptions::default())?;
    // y = x·Wᵀ + b with PyTorch's W: x = [1, 1, 1] gives [6.5, -1.0].
    let y = linear.forward(&Tensor::ones(&[1, 3], DType::F32, &Device::cpu())?)?;
    assert_eq!(y.to_vec::<f32>()?, vec![6.5, -1.0]);
    Ok(())
}

#[test]
fn a_round_trip_copies_values_into_each_parameters_own_memory() -> Result<()> {
    for device in devices("a_round_trip_copies_values_into_each_parameters_own_memory") {
        let (a, _, _) = model(&device, 1)?;
        let (b, _, _) = model(&device, 2)?;
        assert_ne!(host(&a.state_dict())?, host(&b.state_dict())?);
        let diff = b.load_state_dict(&a.state_dict(), LoadOptions::default())?;
        assert!(diff.is_empty(), "{device}: {diff:?}");
        assert_eq!(host(&a.state_dict())?, host(&b.state_dict())?, "{device}");
        // The source's memory is not shared: writing into it leaves the loaded model alone.
        let before = host(&b.state_dict())?;
        a.get("0.weight")
            .expect("a parameter")
            .set(Tensor::zeros(&[2, 3], DType::F32, &device)?)?;
        assert_eq!(host(&b.state_dict())?, before, "{device}: load_state_dict must copy");
    }
    Ok(())
}

#[test]
fn a_state_from_another_device_is_moved_to_the_stores() -> Result<()> {
    for device in common::gpu_devices("a_state_from_another_device_is_moved_to_the_stores") {
        let (store, _, _) = model(&device, 0)?;
        store.load_state_dict(&torch_layout(&Device::cpu())?, LoadOptions::default())?;
        let w = store.get("0.weight").expect("a parameter");
        assert_eq!(w.device(), device);
        assert_eq!(w.tensor().to_vec::<f32>()?, vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    }
    Ok(())
}

#[test]
fn a_strict_load_names_every_bad_key_and_changes_nothing() -> Result<()> {
    let cpu = Device::cpu();
    let (store, _, _) = model(&cpu, 0)?;
    let before = host(&store.state_dict())?;
    let mut state = torch_layout(&cpu)?;
    state.remove("1.bias");
    state.insert("2.weight".into(), Tensor::zeros(&[4], DType::F32, &cpu)?);
    state.insert("1.weight".into(), Tensor::zeros(&[3], DType::F32, &cpu)?);
    state.insert("0.bias".into(), Tensor::zeros(&[2], DType::F64, &cpu)?);
    let err = store.load_state_dict(&state, LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StateMismatch);
    match &err {
        Error::StateMismatch {
            missing,
            unexpected,
            mismatched,
            ..
        } => {
            assert_eq!(missing, &["1.bias"]);
            assert_eq!(unexpected, &["2.weight"]);
            assert_eq!(mismatched.len(), 2, "{mismatched:?}");
            assert!(
                mismatched[0].starts_with("0.bias") && mismatched[0].contains("f64"),
                "{mismatched:?}"
            );
            assert!(
                mismatched[1].starts_with("1.weight") && mismatched[1].contains("[3]"),
                "{mismatched:?}"
            );
        }
        other => panic!("expected StateMismatch, got {other}"),
    }
    assert!(
        err.to_string().contains("strict"),
        "the message says how to opt out: {err}"
    );
    assert_eq!(host(&store.state_dict())?, before, "a refused load changes nothing");
    Ok(())
}

#[test]
fn a_non_strict_load_takes_what_matches_and_reports_the_rest() -> Result<()> {
    let cpu = Device::cpu();
    let (store, _, _) = model(&cpu, 0)?;
    let mut state = torch_layout(&cpu)?;
    state.remove("1.bias");
    state.insert("head.weight".into(), Tensor::zeros(&[4], DType::F32, &cpu)?);
    state.insert("1.weight".into(), Tensor::zeros(&[5], DType::F32, &cpu)?);
    let old_norm_weight = store.get("1.weight").expect("a parameter").tensor().to_vec::<f32>()?;
    let diff = store.load_state_dict(&state, LoadOptions { strict: false })?;
    assert_eq!(diff.missing, ["1.bias"]);
    assert_eq!(diff.unexpected, ["head.weight"]);
    assert_eq!(diff.mismatched.len(), 1);
    let now = store.state_dict();
    assert_eq!(now["0.weight"].to_vec::<f32>()?, vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    assert_eq!(
        now["1.weight"].to_vec::<f32>()?,
        old_norm_weight,
        "a mismatched entry is skipped"
    );
    Ok(())
}

#[test]
fn a_state_dict_file_round_trips() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        path: "tempdir".into(),
        source: e,
    })?;
    let path = dir.path().join("model.safetensors");
    for device in devices("a_state_dict_file_round_trips") {
        let (a, _, _) = model(&device, 3)?;
        a.save_state_dict(&path)?;
        let (b, _, _) = model(&device, 4)?;
        b.load_state_dict_file(&path, LoadOptions::default())?;
        assert_eq!(host(&a.state_dict())?, host(&b.state_dict())?, "{device}");
    }
    Ok(())
}
