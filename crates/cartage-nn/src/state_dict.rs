//! A model's parameters by name: PyTorch's `state_dict` / `load_state_dict`, in memory and as
//! safetensors files.
//!
//! Names are the store's (`blocks.3.attn.qkv.bias`, `0.weight`), and layouts are PyTorch's
//! (`Linear` weights `[out, in]`), so a map written by `torch.save(model.state_dict())` through
//! safetensors loads into the same architecture built in cartage with the same names.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use cartage::{Result, SafetensorsFile, Tensor, Var, save_safetensors};

use crate::optim::StateDiff;
use crate::{LoadOptions, ParamStore};

/// Parameters by name, as [`ParamStore::state_dict`] gives them and
/// [`ParamStore::load_state_dict`] takes them.
pub type StateDict = BTreeMap<String, Tensor>;

const LOAD: &str = "load_state_dict";

impl ParamStore {
    /// Every parameter by name, detached from autograd. Like PyTorch's `state_dict()`, the
    /// tensors share memory with the parameters: copy one before changing it in place.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{ParamStore, layers::Linear};
    /// # fn main() -> cartage::Result<()> {
    /// let store = ParamStore::new(&Device::cpu());
    /// Linear::new(&store.root().sub("0"), 3, 2, true, &mut Generator::new(0))?;
    /// let state = store.state_dict();
    /// assert_eq!(state.keys().collect::<Vec<_>>(), ["0.bias", "0.weight"]);
    /// assert_eq!(state["0.weight"].shape(), &[2, 3]); // [out, in], as in PyTorch
    /// # Ok(())
    /// # }
    /// ```
    pub fn state_dict(&self) -> StateDict {
        self.named_vars()
            .into_iter()
            .map(|(name, var)| (name, var.tensor().detach()))
            .collect()
    }

    /// Copy `state` into the parameters of the same names, in their own memory (values on
    /// another device are moved there first).
    ///
    /// Strict (the default [`LoadOptions`]): every parameter must be in `state` with its shape
    /// and dtype, and `state` must hold nothing else; otherwise [`cartage::Error::StateMismatch`] names
    /// every missing, unexpected and mismatched key and no parameter is changed. Non-strict, the
    /// entries that match are loaded and the others are returned.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::{LoadOptions, ParamStore, layers::Linear};
    /// # fn main() -> cartage::Result<()> {
    /// let mut rng = Generator::new(0);
    /// let (a, b) = (ParamStore::new(&Device::cpu()), ParamStore::new(&Device::cpu()));
    /// Linear::new(&a.root().sub("fc"), 3, 2, true, &mut rng)?;
    /// Linear::new(&b.root().sub("fc"), 3, 2, true, &mut rng)?;
    /// b.load_state_dict(&a.state_dict(), LoadOptions::default())?;
    /// assert_eq!(b.state_dict()["fc.weight"].to_vec::<f32>()?, a.state_dict()["fc.weight"].to_vec::<f32>()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn load_state_dict(&self, state: &StateDict, options: LoadOptions) -> Result<StateDiff> {
        let device = self.device();
        let params = self.named_vars();
        let (writes, mut diff) = self.match_params("", |key| state.get(key));
        diff.unexpected = state
            .keys()
            .filter(|key| !params.iter().any(|(name, _)| name == *key))
            .cloned()
            .collect();
        if options.strict && !diff.is_empty() {
            return Err(diff.into_error(LOAD));
        }
        // Move everything first, so that a failed move leaves every parameter as it was.
        let moved = writes
            .into_iter()
            .map(|(var, value)| {
                let value = if value.device() == device {
                    value.clone()
                } else {
                    value.to(&device)?
                };
                Ok((var, value))
            })
            .collect::<Result<Vec<_>>>()?;
        for (var, value) in moved {
            var.set(value)?;
        }
        Ok(diff)
    }

    /// Each parameter matched with the value `get` finds under its key (`prefix` + its name):
    /// those of the parameter's shape and dtype, ready to write, and the keys that were missing or
    /// mismatched (`unexpected` is left to the caller, which knows what else its source holds).
    pub(crate) fn match_params<'a>(
        &self,
        prefix: &str,
        get: impl Fn(&str) -> Option<&'a Tensor>,
    ) -> (Vec<(Var, &'a Tensor)>, StateDiff) {
        let mut diff = StateDiff::default();
        let mut matched = Vec::new();
        for (name, var) in self.named_vars() {
            let key = format!("{prefix}{name}");
            let Some(value) = get(&key) else {
                diff.missing.push(key);
                continue;
            };
            if value.shape() != var.shape().as_slice() || value.dtype() != var.dtype() {
                diff.mismatched.push(format!(
                    "{key}: expected {:?} {}, found {:?} {}",
                    var.shape(),
                    var.dtype(),
                    value.shape(),
                    value.dtype()
                ));
                continue;
            }
            matched.push((var, value));
        }
        (matched, diff)
    }

    /// Write [`ParamStore::state_dict`] to a safetensors file (PyTorch's
    /// `safetensors.torch.save_file(model.state_dict(), path)`).
    pub fn save_state_dict(&self, path: impl AsRef<Path>) -> Result<()> {
        let state = self.state_dict();
        let refs: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(path, &refs)
    }

    /// [`ParamStore::load_state_dict`] from a safetensors file (as written by
    /// [`ParamStore::save_state_dict`] or by PyTorch's `safetensors.torch.save_file`). The file
    /// is read onto the store's device.
    #[track_caller]
    pub fn load_state_dict_file(&self, path: impl AsRef<Path>, options: LoadOptions) -> Result<StateDiff> {
        let file = SafetensorsFile::open(path)?;
        let state = into_state_dict(file.load(&self.device())?);
        self.load_state_dict(&state, options)
    }
}

/// A loaded map in name order.
pub(crate) fn into_state_dict(tensors: HashMap<String, Tensor>) -> StateDict {
    tensors.into_iter().collect()
}
