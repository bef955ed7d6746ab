//! GPT-2 checkpoints in the layout the `transformers` library writes (`config.json` and
//! `model.safetensors`): its configuration keys, its parameter names, its `Conv1D` weights
//! stored `[in, out]` (transposed here to `Linear`'s `[out, in]`) and its tied head.

use std::path::Path;

use cartage::prelude::*;
use cartage::{Epilogue, Error, SafetensorsFile};

use super::{Gpt, GptConfig};
use crate::state_dict::{StateDict, into_state_dict};
use crate::{LoadOptions, ParamStore};

const OP: &str = "Gpt::from_transformers";

/// A [`GptConfig`] from the text of a `transformers` GPT-2 `config.json` (`vocab_size`,
/// `n_positions`, `n_embd`, `n_head`, `n_layer`, `layer_norm_epsilon`, `activation_function`,
/// `tie_word_embeddings`, `resid_pdrop`). A configuration cartage's model cannot represent (an
/// MLP width `n_inner` other than 4 × `n_embd`, an unknown activation) is refused.
///
/// ```
/// let json = r#"{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
///                "n_head": 12, "n_layer": 12, "activation_function": "gelu_new"}"#;
/// let config = cartage_nn::models::gpt2_config_from_json(json)?;
/// assert_eq!((config.dim, config.layers, config.tied_embeddings), (768, 12, true));
/// # Ok::<(), cartage::Error>(())
/// ```
pub fn gpt2_config_from_json(text: &str) -> Result<GptConfig> {
    let bad = |reason: String| Error::InvalidArgument { op: OP, reason };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("config.json is not valid JSON: {e}")))?;
    let size = |key: &str| -> Result<usize> {
        json.get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                bad(format!(
                    "config.json has no whole number `{key}`; is this a GPT-2 configuration?"
                ))
            })
    };
    let number = |key: &str, default: f64| -> Result<f64> {
        match json.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| bad(format!("config.json's `{key}` is {v}, not a number"))),
        }
    };
    if let Some(kind) = json.get("model_type").and_then(serde_json::Value::as_str)
        && kind != "gpt2"
    {
        return Err(bad(format!(
            "config.json describes a `{kind}` model; only `gpt2` is supported"
        )));
    }
    for (key, expected) in [
        ("scale_attn_weights", true),
        ("scale_attn_by_inverse_layer_idx", false),
        ("reorder_and_upcast_attn", false),
        ("add_cross_attention", false),
    ] {
        if let Some(v) = json.get(key).and_then(serde_json::Value::as_bool)
            && v != expected
        {
            return Err(bad(format!("`{key}` is {v}; cartage's GPT-2 supports only {expected}")));
        }
    }
    let dim = size("n_embd")?;
    if let Some(inner) = json.get("n_inner").filter(|v| !v.is_null())
        && inner.as_u64() != Some(4 * dim as u64)
    {
        return Err(bad(format!(
            "`n_inner` is {inner}; cartage's blocks have an MLP of 4 × n_embd = {}",
            4 * dim
        )));
    }
    let activation = match json.get("activation_function").and_then(serde_json::Value::as_str) {
        None | Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => Epilogue::GeluTanh,
        Some("gelu") => Epilogue::Gelu,
        Some("relu") => Epilogue::Relu,
        Some(other) => {
            return Err(bad(format!(
                "the activation `{other}` is not one of gelu_new, gelu, relu"
            )));
        }
    };
    let tied = json
        .get("tie_word_embeddings")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(true);
    let config = GptConfig {
        tied_embeddings: tied,
        dropout: number("resid_pdrop", 0.1)?,
        activation,
        norm_eps: number("layer_norm_epsilon", 1e-5)?,
        ..GptConfig::new(
            size("vocab_size")?,
            size("n_positions")?,
            dim,
            size("n_head")?,
            size("n_layer")?,
        )
    };
    Ok(config)
}

/// Rename a `transformers` GPT-2 state dict (`transformer.h.0.attn.c_attn.weight`, ...) to
/// cartage's [`Gpt`] names (`block0.attn.qkv.weight`, ...), transposing the `Conv1D` weights to
/// `[out, in]`. The causal-mask buffers older versions saved (`attn.bias`, `attn.masked_bias`)
/// are dropped; a tied `lm_head.weight` is dropped when the model ties it; any other name is
/// kept as it is, so that a strict load names it as unexpected.
pub fn gpt2_state_dict(tensors: StateDict, config: &GptConfig) -> Result<StateDict> {
    let mut out = StateDict::new();
    for (key, value) in tensors {
        let name = key.strip_prefix("transformer.").unwrap_or(&key);
        let mapped = match name {
            "wte.weight" => Some(("tokens.weight".to_string(), false)),
            "wpe.weight" => Some(("positions.weight".to_string(), false)),
            "ln_f.weight" => Some(("norm.weight".to_string(), false)),
            "ln_f.bias" => Some(("norm.bias".to_string(), false)),
            "lm_head.weight" if config.tied_embeddings => None,
            "lm_head.weight" => Some(("head.weight".to_string(), false)),
            _ => block_name(name),
        };
        match mapped {
            Some((name, transpose)) => {
                let value = if transpose { value.t()?.contiguous()? } else { value };
                out.insert(name, value);
            }
            None if name.ends_with("attn.bias") || name.ends_with("attn.masked_bias") || name == "lm_head.weight" => {}
            None => {
                out.insert(key, value);
            }
        }
    }
    Ok(out)
}

/// `h.{i}.{part}` → (`block{i}.{cartage part}`, whether the weight is a transposed `Conv1D`).
fn block_name(name: &str) -> Option<(String, bool)> {
    let rest = name.strip_prefix("h.")?;
    let (index, part) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    let (ours, conv1d) = match part {
        "ln_1.weight" => ("ln1.weight", false),
        "ln_1.bias" => ("ln1.bias", false),
        "ln_2.weight" => ("ln2.weight", false),
        "ln_2.bias" => ("ln2.bias", false),
        "attn.c_attn.weight" => ("attn.qkv.weight", true),
        "attn.c_attn.bias" => ("attn.qkv.bias", false),
        "attn.c_proj.weight" => ("attn.out.weight", true),
        "attn.c_proj.bias" => ("attn.out.bias", false),
        "mlp.c_fc.weight" => ("mlp_up.weight", true),
        "mlp.c_fc.bias" => ("mlp_up.bias", false),
        "mlp.c_proj.weight" => ("mlp_down.weight", true),
        "mlp.c_proj.bias" => ("mlp_down.bias", false),
        _ => return None,
    };
    Some((format!("block{index}.{ours}"), conv1d))
}

impl Gpt {
    /// Load a GPT-2 checkpoint saved by `transformers` (`save_pretrained`: a folder with
    /// `config.json` and `model.safetensors`) onto `device`, strictly: every parameter must be
    /// in the file with its shape and dtype, and the file must hold nothing else. Returns the
    /// store, in evaluation mode (no dropout), and the model.
    ///
    /// ```no_run
    /// use cartage::prelude::*;
    /// use cartage_nn::models::Gpt;
    /// # fn main() -> cartage::Result<()> {
    /// let (_store, model) = Gpt::from_transformers("gpt2", &Device::cpu())?;
    /// let _guard = cartage::no_grad();
    /// let prompt = Tensor::from_slice(&[464i64, 3290], &[1, 2], &Device::cpu())?;
    /// let ids = model.generate(&prompt, 10)?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn from_transformers(dir: impl AsRef<Path>, device: &Device) -> Result<(ParamStore, Gpt)> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::InvalidArgument {
            op: OP,
            reason: format!(
                "{} could not be read ({e}); pass the folder `save_pretrained` wrote",
                config_path.display()
            ),
        })?;
        let config = gpt2_config_from_json(&text)?;
        let file = SafetensorsFile::open(dir.join("model.safetensors"))?;
        let state = gpt2_state_dict(into_state_dict(file.load(device)?), &config)?;
        let store = ParamStore::new(device);
        let model = Gpt::new(&store.root(), config, &mut Generator::new(0))?;
        store.load_state_dict(&state, LoadOptions::default())?;
        store.eval();
        Ok((store, model))
    }
}
