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

/// Something that updates a store's parameters from their gradients.
pub trait Optimizer {
    /// One update of every parameter of `store` that has a gradient. `store` must be the store
    /// the optimizer was built on.
    fn step(&mut self, store: &ParamStore) -> Result<()>;
    /// The learning rate of the next step.
    fn learning_rate(&self) -> f64;
    /// Set the learning rate (a schedule calls this before each step).
    fn set_learning_rate(&mut self, lr: f64);
    /// The state to checkpoint, with tensors named by `store`'s parameter names.
    fn state(&self, store: &ParamStore) -> Result<OptimizerState>;
    /// Resume from a checkpoint's state (tensors named by `store`'s parameter names).
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()>;
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

/// The tensor `<name>.<slot>` of `state` for each of `store`'s variables that has one.
pub(crate) fn import(store: &ParamStore, state: &OptimizerState, slot: &str) -> Result<Vec<(VarId, Tensor)>> {
    let mut out = Vec::new();
    for (name, var) in store.named_vars() {
        let key = format!("{name}.{slot}");
        if let Some((_, t)) = state.tensors.iter().find(|(n, _)| *n == key) {
            if t.shape() != var.shape().as_slice() {
                return Err(Error::ShapeMismatch {
                    op: "Optimizer::load_state",
                    lhs: var.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: format!("the saved `{key}` does not have its parameter's shape"),
                });
            }
            out.push((var.id(), follow(t.clone(), &var.value())?));
        }
    }
    Ok(out)
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
