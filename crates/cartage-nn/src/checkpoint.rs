//! Checkpoints: a model's parameters, its optimizer's state, the loss scaler and random
//! generators (those passed by name, and those the store's modules registered, such as dropout's)
//! in one safetensors file, resumed bit for bit on the same device. Loading checks everything
//! (parameters, optimizer state, generators) before it changes anything.
//!
//! Tensors are named `model/<parameter>` and `optim/<parameter>.<slot>`; numbers (the optimizer's
//! step and rate, the scaler's scale, each generator's seed and offset) go in the file's
//! metadata, written in Rust's shortest round-trip form so they read back exactly.

use std::collections::HashMap;
use std::path::Path;

use cartage::{Error, Generator, Result, SafetensorsFile, Tensor, save_safetensors_with_metadata};

use crate::optim::{Optimizer, OptimizerState};
use crate::{GradScaler, ParamStore, ScalerState};

/// Save `store`'s parameters, `optimizer`'s state, the scaler's and the named generators' states
/// to `path` (written to a temporary file and renamed over it).
pub fn save_checkpoint(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optimizer: &dyn Optimizer,
    scaler: Option<&GradScaler>,
    generators: &[(&str, &Generator)],
) -> Result<()> {
    let mut tensors: Vec<(String, Tensor)> = store
        .named_vars()
        .into_iter()
        .map(|(name, var)| (format!("model/{name}"), var.value()))
        .collect();
    let state = optimizer.state(store)?;
    tensors.extend(state.tensors.into_iter().map(|(n, t)| (format!("optim/{n}"), t)));
    let mut metadata = HashMap::new();
    for (name, value) in state.scalars {
        metadata.insert(format!("optim.{name}"), value.to_string());
    }
    if let Some(scaler) = scaler {
        let s = scaler.state();
        metadata.insert("scaler.scale".into(), s.scale.to_string());
        metadata.insert("scaler.growth_tracker".into(), s.growth_tracker.to_string());
    }
    for (name, rng) in generators {
        metadata.insert(format!("rng.{name}.seed"), rng.seed().to_string());
        metadata.insert(format!("rng.{name}.offset"), rng.offset().to_string());
    }
    for (name, shared) in store.generators() {
        let rng = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        metadata.insert(format!("rng.store.{name}.seed"), rng.seed().to_string());
        metadata.insert(format!("rng.store.{name}.offset"), rng.offset().to_string());
    }
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    save_safetensors_with_metadata(path, &refs, &metadata)
}

/// Resume from a checkpoint written by [`save_checkpoint`]: every parameter of `store` must be
/// in the file with its shape (a missing one or a shape mismatch is an error, and nothing is
/// changed until every parameter is found); values land on the store's device in each
/// parameter's dtype.
pub fn load_checkpoint(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optimizer: &mut dyn Optimizer,
    scaler: Option<&mut GradScaler>,
    generators: &mut [(&str, &mut Generator)],
) -> Result<()> {
    let path = path.as_ref();
    let file = SafetensorsFile::open(path)?;
    let device = store.device();
    let loaded = file.load(&device)?;
    let metadata = file.metadata().clone();
    let number = |key: &str| -> Result<Option<f64>> {
        metadata
            .get(key)
            .map(|v| {
                v.parse::<f64>().map_err(|_| Error::Format {
                    path: path.display().to_string(),
                    format: "cartage checkpoint",
                    reason: format!("`{key}` is `{v}`, not a number"),
                })
            })
            .transpose()
    };
    // Check every parameter before changing any.
    let mut values = Vec::new();
    for (name, var) in store.named_vars() {
        let key = format!("model/{name}");
        let t = loaded.get(&key).ok_or_else(|| Error::InvalidArgument {
            op: "load_checkpoint",
            reason: format!(
                "the parameter `{name}` is not in {} (it has {} tensors); was it saved from another model?",
                path.display(),
                loaded.len()
            ),
        })?;
        if t.shape() != var.shape().as_slice() {
            return Err(Error::ShapeMismatch {
                op: "load_checkpoint",
                lhs: var.shape().to_vec(),
                rhs: t.shape().to_vec(),
                reason: format!("the saved `{name}` does not have the parameter's shape"),
            });
        }
        let dtype = var.dtype();
        values.push((var, t.to_dtype(dtype)?));
    }
    let saved_generator = |key: &str, name: &str| -> Result<Generator> {
        let field = |part: &str| {
            metadata
                .get(&format!("{key}.{part}"))
                .and_then(|v| v.parse::<u64>().ok())
        };
        match (field("seed"), field("offset")) {
            (Some(seed), Some(offset)) => Ok(Generator::resume(seed, offset)),
            _ => Err(Error::InvalidArgument {
                op: "load_checkpoint",
                reason: format!("the generator `{name}` is not in {}", path.display()),
            }),
        }
    };
    let resumed: Vec<Generator> = generators
        .iter()
        .map(|(name, _)| saved_generator(&format!("rng.{name}"), name))
        .collect::<Result<_>>()?;
    let store_generators = store.generators();
    let resumed_in_store: Vec<Generator> = store_generators
        .iter()
        .map(|(name, _)| saved_generator(&format!("rng.store.{name}"), name))
        .collect::<Result<_>>()?;
    let mut state = OptimizerState::default();
    for (name, t) in &loaded {
        if let Some(rest) = name.strip_prefix("optim/") {
            state.tensors.push((rest.to_string(), t.clone()));
        }
    }
    for key in metadata.keys() {
        if let Some(rest) = key.strip_prefix("optim.")
            && let Some(v) = number(key)?
        {
            state.scalars.push((rest.to_string(), v));
        }
    }
    optimizer.load_state(store, &state)?;
    for (var, value) in values {
        var.set(value)?;
        var.zero_grad();
    }
    if let Some(scaler) = scaler
        && let Some(scale) = number("scaler.scale")?
    {
        scaler.load_state(ScalerState {
            scale,
            growth_tracker: number("scaler.growth_tracker")?.unwrap_or(0.0) as u64,
        });
    }
    for ((_, rng), state) in generators.iter_mut().zip(resumed) {
        **rng = state;
    }
    for ((_, shared), state) in store_generators.iter().zip(resumed_in_store) {
        *shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = state;
    }
    Ok(())
}
