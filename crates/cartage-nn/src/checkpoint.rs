//! Checkpoints: a model's parameters, its optimizer's state, the loss scaler and random
//! generators (those passed by name, and those the store's modules registered, such as dropout's)
//! in one safetensors file, resumed bit for bit on the same device. Loading checks everything
//! (parameters, optimizer state, generators) before it changes anything.
//!
//! Tensors are named `model/<parameter>` and `optim/<parameter>.<slot>`; numbers (the optimizer's
//! step and rate, the scaler's scale, each generator's seed and offset) go in the file's
//! metadata, written in Rust's shortest round-trip form so they read back exactly.
//!
//! Loading is strict by default, as PyTorch's `load_state_dict`: a parameter or optimizer entry
//! missing from the file, a tensor of the file that nothing takes, or one of another shape or
//! dtype is [`Error::StateMismatch`] naming every offending key, and nothing is changed.
//! [`load_checkpoint_with`] with `LoadOptions { strict: false }` loads what matches and returns
//! what it skipped.

use std::collections::HashMap;
use std::path::Path;

use cartage::{Error, Generator, Result, SafetensorsFile, Tensor, save_safetensors_with_metadata};

use crate::optim::{Optimizer, OptimizerState, StateDiff};
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

/// How [`load_checkpoint_with`] treats entries that do not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Refuse (`true`, the default) or skip (`false`) missing, unexpected and mismatched
    /// entries. Non-finite or negative numbers (a step of -1, a NaN scale) are refused either way.
    pub strict: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { strict: true }
    }
}

/// Resume from a checkpoint written by [`save_checkpoint`], strictly: every parameter of
/// `store` must be in the file with its shape and dtype, the file must hold nothing else that
/// `store` and `optimizer` do not take, and the optimizer's state must be whole (both Adam
/// moments and the step, say). Otherwise [`Error::StateMismatch`] names every offending key and
/// nothing is changed. Values are copied into each parameter's own storage.
///
/// A requested `scaler` or generator must be in the file; a saved scaler or generator not
/// asked for is ignored.
pub fn load_checkpoint(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optimizer: &mut dyn Optimizer,
    scaler: Option<&mut GradScaler>,
    generators: &mut [(&str, &mut Generator)],
) -> Result<()> {
    load_checkpoint_with(path, store, optimizer, scaler, generators, LoadOptions::default()).map(drop)
}

/// [`load_checkpoint`] with `options`: non-strict, it loads the entries that match and
/// returns the keys it skipped (file keys: `model/<name>`, `optim/<name>.<slot>`, `optim.step`).
///
/// ```no_run
/// use cartage_nn::{LoadOptions, ParamStore, load_checkpoint_with, optim::AdamW};
/// # fn main() -> cartage::Result<()> {
/// # let store = ParamStore::new(&cartage::Device::cpu());
/// let mut opt = AdamW::new(&store, 1e-3)?;
/// // A model with a new head: load the backbone, report what was left out.
/// let skipped = load_checkpoint_with("ckpt.safetensors", &store, &mut opt, None, &mut [],
///                                    LoadOptions { strict: false })?;
/// for key in skipped.missing.iter().chain(&skipped.unexpected).chain(&skipped.mismatched) {
///     println!("not loaded: {key}");
/// }
/// # Ok(())
/// # }
/// ```
pub fn load_checkpoint_with(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optimizer: &mut dyn Optimizer,
    scaler: Option<&mut GradScaler>,
    generators: &mut [(&str, &mut Generator)],
    options: LoadOptions,
) -> Result<StateDiff> {
    const OP: &str = "load_checkpoint";
    let path = path.as_ref();
    let file = SafetensorsFile::open(path)?;
    let device = store.device();
    let loaded = file.load(&device)?;
    let metadata = file.metadata().clone();
    let bad = |key: &str, v: &str, what: &str| Error::Format {
        path: path.display().to_string(),
        format: "cartage checkpoint",
        reason: format!("`{key}` is `{v}`, not {what}"),
    };
    let number = |key: &str| -> Result<Option<f64>> {
        metadata
            .get(key)
            .map(|v| v.parse::<f64>().map_err(|_| bad(key, v, "a number")))
            .transpose()
    };
    // Check every parameter before changing any.
    let (values, mut diff) = store.match_params("model/", |key| loaded.get(key));
    let known: std::collections::HashSet<String> = store
        .named_vars()
        .into_iter()
        .map(|(name, _)| format!("model/{name}"))
        .collect();
    let mut state = OptimizerState::default();
    for (name, t) in &loaded {
        if let Some(rest) = name.strip_prefix("optim/") {
            state.tensors.push((rest.to_string(), t.clone()));
        } else if !known.contains(name) {
            diff.unexpected.push(name.clone());
        }
    }
    for key in metadata.keys() {
        if let Some(rest) = key.strip_prefix("optim.")
            && let Some(v) = number(key)?
        {
            state.scalars.push((rest.to_string(), v));
        }
    }
    // The optimizer's keys, as the file names them: tensors `optim/<name>.<slot>`, numbers
    // `optim.<name>` (an optimizer's scalar names have no dot).
    let file_key = |k: String| {
        if k.contains('.') {
            format!("optim/{k}")
        } else {
            format!("optim.{k}")
        }
    };
    let opt_diff = optimizer.check_state(store, &state)?;
    diff.extend(StateDiff {
        missing: opt_diff.missing.into_iter().map(file_key).collect(),
        unexpected: opt_diff.unexpected.into_iter().map(file_key).collect(),
        mismatched: opt_diff.mismatched.into_iter().map(file_key).collect(),
    });
    let saved_scaler = match scaler.is_some() {
        false => None,
        true => match number("scaler.scale")? {
            None => {
                diff.missing.push("scaler.scale".into());
                None
            }
            Some(scale) if !(scale.is_finite() && scale > 0.0) => {
                return Err(bad("scaler.scale", &scale.to_string(), "a finite scale > 0"));
            }
            Some(scale) => {
                let tracker = match metadata.get("scaler.growth_tracker") {
                    None => 0,
                    Some(v) => v
                        .parse::<u64>()
                        .map_err(|_| bad("scaler.growth_tracker", v, "a whole number >= 0"))?,
                };
                Some(ScalerState {
                    scale,
                    growth_tracker: tracker,
                })
            }
        },
    };
    if options.strict && !diff.is_empty() {
        return Err(diff.into_error(OP));
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
    optimizer.load_state_with(store, &state, options.strict)?;
    {
        let _plain = cartage::no_grad();
        for (var, value) in values {
            // Same dtype (checked above); the file was loaded on the store's device.
            let value = value.to_device_dtype(&var.device(), var.dtype())?;
            var.value().copy_from(&value)?;
            var.zero_grad();
        }
    }
    if let (Some(scaler), Some(saved)) = (scaler, saved_scaler) {
        scaler.load_state(saved);
    }
    for ((_, rng), state) in generators.iter_mut().zip(resumed) {
        **rng = state;
    }
    for ((_, shared), state) in store_generators.iter().zip(resumed_in_store) {
        *shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = state;
    }
    if !diff.is_empty() {
        tracing::warn!(
            missing = ?diff.missing,
            unexpected = ?diff.unexpected,
            mismatched = ?diff.mismatched,
            "load_checkpoint (non-strict): entries skipped"
        );
    }
    Ok(diff)
}
