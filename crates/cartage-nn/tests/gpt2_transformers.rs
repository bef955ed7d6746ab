//! A GPT-2 checkpoint written by the `transformers` library (`tests/fixtures/gpt2-tiny`: 2
//! layers, width 64, 4 heads, context 32, vocabulary 96, random weights; made by
//! `xtask/python/gpt2_fixture.py`) loads into cartage's `Gpt` and gives `transformers`' f32
//! logits within 1e-5 and its greedy continuation, on the CPU and every GPU that opens (each
//! missing one skipped loudly, or a failure when `CARTAGE_REQUIRE` names its kind).

mod common;

use std::path::{Path, PathBuf};

use cartage::prelude::*;
use cartage::{Epilogue, Error, ErrorKind, load_safetensors};
use cartage_nn::models::{Gpt, gpt2_config_from_json, gpt2_state_dict};
use cartage_nn::{LoadOptions, Module, ParamStore};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny")
}

/// The CPU and every GPU that opens.
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

#[test]
fn transformers_logits_and_greedy_tokens_are_reproduced() -> Result<()> {
    let expected = load_safetensors(fixture().join("expected.safetensors"), &Device::cpu())?;
    let want_logits = expected["logits"].to_vec::<f32>()?;
    let want_tokens = expected["generated"].to_vec::<i64>()?;
    let prompt = &expected["prompt"];
    for device in devices("transformers_logits_and_greedy_tokens_are_reproduced") {
        let (store, model) = Gpt::from_transformers(fixture(), &device)?;
        assert!(!store.is_training(), "a loaded model is in evaluation mode");
        let config = model.config();
        assert!(config.tied_embeddings && config.activation == Epilogue::GeluTanh);
        assert!(store.get("head.weight").is_none(), "the head reads the token table");
        let _guard = cartage::no_grad();
        let ids = prompt.to(&device)?;
        let logits = model.forward(&ids)?.to_vec::<f32>()?;
        assert_eq!(logits.len(), want_logits.len());
        let worst = logits
            .iter()
            .zip(&want_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "{device}: logits differ from transformers' by up to {worst}"
        );
        let spread = want_logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            spread > 0.5,
            "the fixture's logits are large enough to tell layouts apart ({spread})"
        );
        let tokens = model
            .generate(&ids, want_tokens.len() - prompt.numel())?
            .to_vec::<i64>()?;
        assert_eq!(tokens, want_tokens, "{device}: greedy continuation");
    }
    Ok(())
}

#[test]
fn the_configuration_is_read_from_config_json() -> Result<()> {
    let text = std::fs::read_to_string(fixture().join("config.json")).map_err(|e| Error::Io {
        path: "config.json".into(),
        source: e,
    })?;
    let config = gpt2_config_from_json(&text)?;
    assert_eq!(
        (config.vocab, config.context, config.dim, config.heads, config.layers),
        (96, 32, 64, 4, 2)
    );
    assert_eq!((config.norm_eps, config.dropout), (1e-5, 0.1));
    for (bad, why) in [
        (r#"{"n_embd": 64}"#, "vocab_size"),
        (r#"not json"#, "JSON"),
        (r#"{"model_type": "llama"}"#, "llama"),
        (
            r#"{"vocab_size": 8, "n_positions": 4, "n_embd": 8, "n_head": 2, "n_layer": 1, "n_inner": 16}"#,
            "n_inner",
        ),
        (
            r#"{"vocab_size": 8, "n_positions": 4, "n_embd": 8, "n_head": 2, "n_layer": 1, "activation_function": "swish"}"#,
            "swish",
        ),
        (
            r#"{"vocab_size": 8, "n_positions": 4, "n_embd": 8, "n_head": 2, "n_layer": 1, "scale_attn_by_inverse_layer_idx": true}"#,
            "scale_attn_by_inverse_layer_idx",
        ),
    ] {
        match gpt2_config_from_json(bad) {
            Err(Error::InvalidArgument { reason, .. }) => assert!(reason.contains(why), "{bad}: {reason}"),
            other => panic!("{bad}: expected InvalidArgument, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn a_checkpoint_of_another_shape_or_with_extra_keys_is_refused_by_name() -> Result<()> {
    let cpu = Device::cpu();
    let text = std::fs::read_to_string(fixture().join("config.json")).map_err(|e| Error::Io {
        path: "config.json".into(),
        source: e,
    })?;
    let config = gpt2_config_from_json(&text)?;
    let raw: cartage_nn::StateDict = load_safetensors(fixture().join("model.safetensors"), &cpu)?
        .into_iter()
        .collect();
    let mut renamed = gpt2_state_dict(raw.clone(), &config)?;
    assert!(renamed.contains_key("block1.attn.qkv.weight"));
    assert_eq!(
        renamed["block0.mlp_up.weight"].shape(),
        &[256, 64],
        "Conv1D weights become [out, in]"
    );
    renamed.insert(
        "transformer.h.9.attn.c_attn.weight".into(),
        Tensor::zeros(&[1], DType::F32, &cpu)?,
    );
    renamed.remove("norm.bias");
    let store = ParamStore::new(&cpu);
    let _model = Gpt::new(&store.root(), config, &mut Generator::new(0))?;
    match store.load_state_dict(&renamed, LoadOptions::default()) {
        Err(Error::StateMismatch {
            missing, unexpected, ..
        }) => {
            assert_eq!(missing, ["norm.bias"]);
            assert_eq!(unexpected, ["transformer.h.9.attn.c_attn.weight"]);
        }
        other => panic!("expected StateMismatch, got {other:?}"),
    }
    // A model of another width does not take the checkpoint.
    let narrow = ParamStore::new(&cpu);
    let _small = Gpt::new(
        &narrow.root(),
        cartage_nn::models::GptConfig { dim: 32, ..config },
        &mut Generator::new(0),
    )?;
    let err = narrow
        .load_state_dict(&gpt2_state_dict(raw, &config)?, LoadOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StateMismatch);
    // A folder without config.json says what to pass.
    let Err(err) = Gpt::from_transformers(fixture().join("missing"), &cpu) else {
        panic!("a folder without config.json loaded");
    };
    assert!(err.to_string().contains("save_pretrained"), "{err}");
    Ok(())
}
