//! Optimizers, learning-rate schedules and gradient clipping.
//!
//! An optimizer is built on a [`ParamStore`] and keeps its state (momentum, moments) by
//! [`cartage::VarId`]; [`Optimizer::step`] takes the store again, refuses another store, reads
//! each parameter's current value and gradient from its variable, and moves its state to the
//! parameter's device and dtype when the store was moved or cast since. Parameters without a
//! gradient are left alone. Updates run without recording and write each parameter in place.
//!
//! Gradient accumulation needs nothing special: gradients add up across `backward` calls until
//! [`ParamStore::zero_grad`], which frees them.
//!
//! Each step updates the parameters of one device and dtype together, through
//! [`cartage::optim`]: one multi-tensor kernel where the device has it (CPU, CUDA), else one
//! fused kernel per parameter, else the formulas composed from element-wise ops.

mod adam;
mod clip;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamW};

pub use clip::clip_grad_norm;
pub use schedule::{LrSchedule, StepLr, WarmupCosine};

pub use sgd::Sgd;

use cartage::{Error, Result, Tensor, VarId};

use crate::{ParamStore, StoreId};

/// An optimizer's state for a checkpoint: tensors named `<parameter>.<slot>` (slots such as
/// `m`, `v`, `momentum`) and scalars (the step count).
#[derive(Clone, Debug, Default)]
pub struct OptimizerState {
    /// Per-parameter tensors, named `<parameter name>.<slot>`.
    pub tensors: Vec<(String, Tensor)>,
    /// Named numbers (`step`, `lr`).
    pub scalars: Vec<(String, f64)>,
}

impl OptimizerState {
    /// The scalar `name`.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.scalars.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// How a state (an optimizer's, or a checkpoint's) differs from what it is loaded into: the
/// keys a strict load refuses with [`Error::StateMismatch`], or a non-strict load skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateDiff {
    /// Keys the target needs and the state lacks.
    pub missing: Vec<String>,
    /// Keys of the state that the target does not have.
    pub unexpected: Vec<String>,
    /// `key: expected …, found …` for entries of another shape or dtype.
    pub mismatched: Vec<String>,
}

impl StateDiff {
    /// Whether everything matched.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }

    /// [`Error::StateMismatch`] naming every offending key.
    pub fn into_error(self, what: &'static str) -> Error {
        Error::StateMismatch {
            what,
            missing: self.missing,
            unexpected: self.unexpected,
            mismatched: self.mismatched,
        }
    }

    /// Add `other`'s keys.
    pub(crate) fn extend(&mut self, other: StateDiff) {
        self.missing.extend(other.missing);
        self.unexpected.extend(other.unexpected);
        self.mismatched.extend(other.mismatched);
    }
}

/// Something that updates a store's parameters from their gradients.
///
/// A refused [`Optimizer::step`] or [`Optimizer::load_state`] leaves the optimizer and the
/// parameters as they were: everything is checked before anything changes.
pub trait Optimizer {
    /// One update of every parameter of `store` that has a gradient. `store` must be the store
    /// the optimizer was built on.
    fn step(&mut self, store: &ParamStore) -> Result<()>;
    /// The learning rate of the next step.
    fn learning_rate(&self) -> f64;
    /// Set the learning rate (a schedule calls this before each step). A negative or
    /// non-finite rate is refused by the next step.
    fn set_learning_rate(&mut self, lr: f64);
    /// The state to checkpoint, with tensors named by `store`'s parameter names.
    fn state(&self, store: &ParamStore) -> Result<OptimizerState>;
    /// How `state` differs from what this optimizer would load from it (changes nothing).
    fn check_state(&self, store: &ParamStore, state: &OptimizerState) -> Result<StateDiff>;
    /// Resume from `state` (tensors named by `store`'s parameter names). Strict (`strict =
    /// true`): a missing, unexpected or mismatched key is [`Error::StateMismatch`] and nothing
    /// changes. Non-strict: loads the entries that match and returns those it skipped.
    fn load_state_with(&mut self, store: &ParamStore, state: &OptimizerState, strict: bool) -> Result<StateDiff>;
    /// Clear the gradients of `store`'s parameters (`optimizer.zero_grad()` in PyTorch; the
    /// same as [`ParamStore::zero_grad`]).
    fn zero_grad(&self, store: &ParamStore) {
        store.zero_grad();
    }
    /// Resume from a checkpoint's state, strictly (see [`Optimizer::load_state_with`]).
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()> {
        self.load_state_with(store, state, true).map(drop)
    }
}

/// The per-variable tensors of `slots` as `<name>.<slot>` entries.
pub(crate) fn export<'a>(
    store: &ParamStore,
    slots: impl Iterator<Item = (VarId, &'static str, &'a Tensor)>,
) -> Result<Vec<(String, Tensor)>> {
    let names = store.named_vars();
    slots
        .map(|(id, slot, t)| {
            let (name, _) = names
                .iter()
                .find(|(_, v)| v.id() == id)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "Optimizer::state",
                    reason: "the optimizer holds state for a variable that is not in this store".into(),
                })?;
            Ok((format!("{name}.{slot}"), t.clone()))
        })
        .collect()
}

/// What [`import`] found: per variable, the tensor of each slot that matched (in `slots`'
/// order; `None` where absent or skipped), and the keys that did not match.
pub(crate) struct Imported {
    pub(crate) per_var: Vec<(cartage::Var, Vec<Option<Tensor>>)>,
    pub(crate) diff: StateDiff,
}

/// Check `state` against `store` for an optimizer whose per-parameter slots are `slots` (all
/// present or all absent for each parameter, as PyTorch's per-parameter state) and whose
/// scalars are `scalars`. Nothing is converted: the tensors are returned as saved.
pub(crate) fn import(store: &ParamStore, state: &OptimizerState, slots: &[&str], scalars: &[&str]) -> Imported {
    let mut diff = StateDiff::default();
    let mut known = std::collections::HashSet::new();
    let mut per_var = Vec::new();
    for (name, var) in store.named_vars() {
        let mut found: Vec<Option<Tensor>> = Vec::with_capacity(slots.len());
        let mut ok = true;
        for slot in slots {
            let key = format!("{name}.{slot}");
            let t = state.tensors.iter().find(|(n, _)| *n == key).map(|(_, t)| t.clone());
            if let Some(t) = &t
                && t.shape() != var.shape().as_slice()
            {
                diff.mismatched.push(format!(
                    "{key}: expected shape {:?} (its parameter's), found {:?}",
                    var.shape(),
                    t.shape()
                ));
                ok = false;
            }
            known.insert(key);
            found.push(t);
        }
        let present = found.iter().filter(|t| t.is_some()).count();
        if present != 0 && present != slots.len() {
            for (slot, t) in slots.iter().zip(&found) {
                if t.is_none() {
                    diff.missing.push(format!("{name}.{slot}"));
                }
            }
            ok = false;
        }
        if !ok {
            found.iter_mut().for_each(|t| *t = None);
        }
        per_var.push((var, found));
    }
    for (name, _) in &state.tensors {
        if !known.contains(name) {
            diff.unexpected.push(name.clone());
        }
    }
    for (name, _) in &state.scalars {
        if !scalars.contains(&name.as_str()) {
            diff.unexpected.push(name.clone());
        }
    }
    Imported { per_var, diff }
}

/// A saved learning rate: a finite number ≥ 0.
pub(crate) fn saved_lr(op: &'static str, state: &OptimizerState) -> Result<Option<f64>> {
    match state.scalar("lr") {
        Some(lr) if !(lr.is_finite() && lr >= 0.0) => Err(Error::InvalidArgument {
            op,
            reason: format!(
                "the saved learning rate is {lr}; a learning rate is a finite number >= 0 (a corrupt or hand-edited state?)"
            ),
        }),
        lr => Ok(lr),
    }
}

/// Refuse an empty parameter list (`torch.optim`'s "optimizer got an empty parameter list").
pub(crate) fn non_empty(op: &'static str, store: &ParamStore) -> Result<()> {
    if store.vars().is_empty() {
        return Err(Error::InvalidArgument {
            op,
            reason: "optimizer got an empty parameter list: create the model's parameters in the store \
                     before building its optimizer"
                .into(),
        });
    }
    Ok(())
}

/// Refuse a learning rate that is negative, NaN or infinite (PyTorch: "Invalid learning rate").
pub(crate) fn check_lr(op: &'static str, lr: f64) -> Result<()> {
    if lr.is_finite() && lr >= 0.0 {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        reason: format!(
            "Invalid learning rate: {lr}; a learning rate is a finite number >= 0 (check the schedule that set it)"
        ),
    })
}

/// Refuse a hyperparameter `name` that is negative or NaN (PyTorch: "Invalid <name> value").
pub(crate) fn check_non_negative(op: &'static str, name: &str, value: f64) -> Result<()> {
    if value >= 0.0 && value.is_finite() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        reason: format!("Invalid {name} value: {value}; it must be a finite number >= 0"),
    })
}

/// Refuse a gradient of another shape, dtype or device than its parameter, before any kernel
/// runs (so that no group of parameters steps when a later one would fail).
pub(crate) fn check_grad(op: &'static str, store: &ParamStore, id: VarId, p: &Tensor, g: &Tensor) -> Result<()> {
    if g.shape() != p.shape() || g.dtype() != p.dtype() || g.device() != p.device() {
        let name = store
            .named_vars()
            .into_iter()
            .find(|(_, v)| v.id() == id)
            .map_or_else(|| "?".to_string(), |(n, _)| n);
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "the gradient of `{name}` is {:?} {} on {}, its parameter {:?} {} on {}: nothing was \
                 updated; set gradients of the parameter's shape, dtype and device",
                g.shape(),
                g.dtype(),
                g.device(),
                p.shape(),
                p.dtype(),
                p.device()
            ),
        });
    }
    Ok(())
}

/// The indices of `items` grouped by `key`, in order of first appearance within each group
/// (ordered by key, so that every run visits the groups in one order).
pub(crate) fn group_by<T, K: Ord>(items: &[T], key: impl Fn(&T) -> K) -> std::collections::BTreeMap<K, Vec<usize>> {
    let mut groups = std::collections::BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        groups.entry(key(item)).or_insert_with(Vec::new).push(i);
    }
    groups
}

/// Refuse a store other than the one the optimizer was built on.
pub(crate) fn same_store(op: &'static str, built_on: StoreId, store: &ParamStore) -> Result<()> {
    if store.id() == built_on {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        reason: "this optimizer was built on another ParamStore; pass the store whose parameters it \
                 updates (build one optimizer per store)"
            .into(),
    })
}

/// `state` on the device and in the dtype of `like` (a parameter moved or cast since).
pub(crate) fn follow(state: Tensor, like: &Tensor) -> Result<Tensor> {
    state.to_device_dtype(&like.device(), like.dtype())
}
