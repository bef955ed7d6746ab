//! [`ParamStore`]: the named parameters of a model, moved and cast in place.
//!
//! Parameters are [`Var`]s: shared cells whose value [`Var::rebind`] replaces in place. A module
//! holds the `Var`s it made and reads `var.tensor()` on every forward; an optimizer keeps its
//! state by [`cartage::VarId`] and takes the store at each step. So the stale-handle bug (R13) —
//! building the optimizer, then moving the model, and the optimizer updating the old tensors —
//! cannot happen: there are no old tensors to update.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cartage::{DType, Device, Error, Generator, Result, Tensor, Var, VarId};

static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

/// A store's identity (an optimizer remembers the store it was built on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreId(u64);

struct Inner {
    id: StoreId,
    state: Mutex<State>,
    training: AtomicBool,
}

struct State {
    device: Device,
    params: Vec<(String, Var)>,
    generators: Vec<(String, SharedGenerator)>,
}

/// A random generator owned by a module (dropout's masks) and registered with its store, so that
/// checkpoints save and restore it with the parameters.
pub type SharedGenerator = Arc<Mutex<Generator>>;

/// The parameters of a model: named variables on one device. Cloning shares the store.
///
/// ```
/// use cartage::prelude::*;
/// use cartage_nn::ParamStore;
/// # fn main() -> cartage::Result<()> {
/// let mut store = ParamStore::new(&Device::cpu());
/// let w = store.root().sub("layer").var("weight", Tensor::ones(&[2, 2], DType::F32, &Device::cpu())?)?;
/// assert_eq!(store.names(), vec!["layer.weight".to_string()]);
/// store.to_dtype(DType::F64)?;             // in place: `w` sees it
/// assert_eq!(w.tensor().dtype(), DType::F64);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<Inner>,
}

impl ParamStore {
    /// An empty store whose parameters will live on `device`, in training mode.
    pub fn new(device: &Device) -> ParamStore {
        ParamStore {
            inner: Arc::new(Inner {
                id: StoreId(NEXT_STORE.fetch_add(1, Ordering::Relaxed)),
                state: Mutex::new(State {
                    device: *device,
                    params: Vec::new(),
                    generators: Vec::new(),
                }),
                training: AtomicBool::new(true),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Register `rng` under `prefix` followed by its index among the generators of that prefix
    /// (`dropout.0`, `dropout.1`, …, in construction order) and return the shared handle the
    /// module draws from. [`crate::save_checkpoint`] saves every registered generator.
    pub fn register_generator(&self, prefix: &str, rng: Generator) -> SharedGenerator {
        let mut state = self.lock();
        let index = state
            .generators
            .iter()
            .filter(|(name, _)| name.rsplit_once('.').is_some_and(|(p, _)| p == prefix))
            .count();
        let shared = Arc::new(Mutex::new(rng));
        state
            .generators
            .push((format!("{prefix}.{index}"), Arc::clone(&shared)));
        shared
    }

    /// The registered generators with their names, in registration order.
    pub fn generators(&self) -> Vec<(String, SharedGenerator)> {
        self.lock().generators.clone()
    }

    /// The store's identity.
    pub fn id(&self) -> StoreId {
        self.inner.id
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.lock().device
    }

    /// The top-level scope, where parameter names start.
    pub fn root(&self) -> Scope {
        Scope {
            store: self.clone(),
            prefix: String::new(),
        }
    }

    /// Register `value` (moved to the store's device when it is elsewhere) under `name`.
    fn add(&self, name: String, value: Tensor) -> Result<Var> {
        let mut state = self.lock();
        if state.params.iter().any(|(n, _)| *n == name) {
            return Err(Error::InvalidArgument {
                op: "ParamStore::var",
                reason: format!("a parameter named `{name}` already exists; give each parameter its own name"),
            });
        }
        let value = if value.device() == state.device {
            value
        } else {
            value.to(&state.device)?
        };
        let var = Var::new(value)?;
        state.params.push((name, var.clone()));
        Ok(var)
    }

    /// Move every parameter (and its accumulated gradient) to `device`, in place: modules and
    /// optimizers holding the variables see the moved values.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// use cartage_nn::ParamStore;
    /// # fn main() -> cartage::Result<()> {
    /// let mut store = ParamStore::new(&Device::cpu());
    /// let w = store.root().var("w", Tensor::ones(&[3], DType::F32, &Device::cpu())?)?;
    /// store.to(&Device::cpu())?; // any device: `Device::pick()?`
    /// assert_eq!(w.tensor().device(), store.device());
    /// # Ok(())
    /// # }
    /// ```
    pub fn to(&mut self, device: &Device) -> Result<()> {
        let mut state = self.lock();
        for (_, var) in &state.params {
            if var.device() != *device {
                let _plain = cartage::no_grad();
                var.rebind(var.value().to(device)?)?;
            }
        }
        state.device = *device;
        Ok(())
    }

    /// Cast every parameter (and its gradient) to the float `dtype`, in place.
    pub fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        let state = self.lock();
        for (_, var) in &state.params {
            if var.dtype() != dtype {
                let _plain = cartage::no_grad();
                var.rebind(var.value().to_dtype(dtype)?)?;
            }
        }
        Ok(())
    }

    /// The variables, in registration order.
    pub fn vars(&self) -> Vec<Var> {
        self.lock().params.iter().map(|(_, v)| v.clone()).collect()
    }

    /// The variables with their names, in registration order.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        self.lock().params.clone()
    }

    /// The parameter names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.lock().params.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The variable named `name`.
    pub fn get(&self, name: &str) -> Option<Var> {
        self.lock()
            .params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// The variable with id `id`, if this store holds it.
    pub fn by_id(&self, id: VarId) -> Option<Var> {
        self.lock()
            .params
            .iter()
            .find(|(_, v)| v.id() == id)
            .map(|(_, v)| v.clone())
    }

    /// Free every parameter's gradient (the memory goes back to the cache at once; PyTorch's
    /// `zero_grad(set_to_none=True)`). The next backward starts from nothing.
    pub fn zero_grad(&self) {
        for (_, var) in &self.lock().params {
            var.zero_grad();
        }
    }

    /// Number of parameter elements.
    pub fn num_params(&self) -> usize {
        self.lock()
            .params
            .iter()
            .map(|(_, v)| v.shape().iter().product::<usize>())
            .sum()
    }

    /// Bytes of the parameter values (gradients and optimizer states not included).
    pub fn size_in_bytes(&self) -> usize {
        self.lock()
            .params
            .iter()
            .map(|(_, v)| v.shape().iter().product::<usize>() * v.dtype().size_in_bytes())
            .sum()
    }

    /// Training mode: dropout drops. The default.
    pub fn train(&self) {
        self.inner.training.store(true, Ordering::Relaxed);
    }

    /// Evaluation mode: dropout passes its input through.
    pub fn eval(&self) {
        self.inner.training.store(false, Ordering::Relaxed);
    }

    /// True in training mode.
    pub fn is_training(&self) -> bool {
        self.inner.training.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for ParamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("ParamStore")
            .field("device", &state.device)
            .field("params", &state.params.len())
            .finish()
    }
}

/// A place in a store's name tree: parameters made through it are named `prefix.name`.
#[derive(Clone, Debug)]
pub struct Scope {
    store: ParamStore,
    prefix: String,
}

impl Scope {
    /// The scope `name` inside this one (`encoder` → `encoder.0`).
    pub fn sub(&self, name: impl std::fmt::Display) -> Scope {
        Scope {
            store: self.store.clone(),
            prefix: self.name(&name.to_string()),
        }
    }

    fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Register `value` as the parameter `name` of this scope (on the store's device).
    pub fn var(&self, name: &str, value: Tensor) -> Result<Var> {
        self.store.add(self.name(name), value)
    }

    /// The store.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// The store's device.
    pub fn device(&self) -> Device {
        self.store.device()
    }
}
