//! Variables: the leaves of the graph, the tensors gradients are computed for.
//!
//! A [`Var`] is a shared cell holding a value and the gradient accumulated for it. Every op on
//! [`Var::tensor`] records how its result was made, so [`Tensor::backward`] can find its way
//! back. The cell, not the tensor, is the identity: [`Var::set`] writes new values in place,
//! [`Var::rebind`] replaces the value (a move, a cast), and every holder of the `Var`, a module
//! or an optimizer keyed by [`VarId`], sees the new value. No handle goes stale (LESSONS R13).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{DType, Device, Error, Result};

use super::graph::GradLink;
use crate::Tensor;

static NEXT_VAR_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_HOOK_ID: AtomicU64 = AtomicU64::new(1);

/// A function run when a backward pass has finished a variable's gradient: it gets the variable
/// and its accumulated gradient (what [`Var::grad`] returns from then on). An error it returns
/// ends the backward pass with that error. See [`Var::on_grad_ready`].
pub type GradHook = Arc<dyn Fn(&Var, &Tensor) -> Result<()> + Send + Sync>;

/// Names one hook of a variable, to remove it with [`Var::remove_grad_hook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GradHookId(u64);

/// A variable's identity, unique in the process and stable across [`Var::set`] (moves, casts,
/// updates). Optimizers and parameter stores key their state by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(u64);

impl VarId {
    /// The number behind the id.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "var#{}", self.0)
    }
}

pub(crate) struct VarCell {
    id: VarId,
    state: Mutex<VarState>,
}

struct VarState {
    /// The value, without a link (the link is added by [`Var::tensor`]).
    value: Tensor,
    grad: Option<Tensor>,
    /// Run when a backward pass has finished the gradient (empty: no allocation, no cost).
    hooks: Vec<(GradHookId, GradHook)>,
}

impl VarCell {
    fn lock(&self) -> MutexGuard<'_, VarState> {
        // A panic while the lock is held cannot leave the state half-written: every write is a
        // single assignment of fully built tensors.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The value's shape, dtype and device (for checking gradients).
    pub(crate) fn meta(&self) -> (cartage_core::Dims, DType, Device) {
        let state = self.lock();
        (
            cartage_core::Dims::from_slice(state.value.shape()),
            state.value.dtype(),
            state.value.device(),
        )
    }

    /// Add `grad` to the accumulated gradient (the first one is stored as it is); returns the
    /// total and the hooks to run (called without the lock held).
    pub(crate) fn accumulate(&self, grad: Tensor) -> Result<(Tensor, Vec<GradHook>)> {
        let mut state = self.lock();
        if grad.dtype() != state.value.dtype() || grad.device() != state.value.device() {
            return Err(Error::Autograd {
                op: "backward",
                reason: format!(
                    "the gradient of {} is {} on {}, but the variable is now {} on {}: it was moved or \
                     cast (`Var::rebind`, `ParamStore::to`) after the forward pass that this backward \
                     runs through. Move or cast the model before the forward pass, or recompute it",
                    self.id,
                    grad.dtype(),
                    grad.device(),
                    state.value.dtype(),
                    state.value.device()
                ),
            });
        }
        let total = match state.grad.take() {
            None => grad,
            Some(old) => match old.add(&grad) {
                Ok(sum) => sum,
                Err(e) => {
                    state.grad = Some(old);
                    return Err(e);
                }
            },
        };
        state.grad = Some(total.clone());
        let hooks = state.hooks.iter().map(|(_, hook)| Arc::clone(hook)).collect();
        Ok((total, hooks))
    }
}

/// A tensor that gradients are computed for: a leaf of the graph.
///
/// Cloning a `Var` shares the cell (value and gradient). Gradients accumulate across backward
/// calls until [`Var::zero_grad`], as in PyTorch.
///
/// Ops take tensors, not variables: [`Var::tensor`] gives the recorded value (taken once per
/// forward pass is enough), and [`Tensor::requires_grad_`] makes a leaf whose recorded value is
/// the only handle needed (`Tensor::as_var` finds the variable again). A variable cannot lend
/// a `&Tensor` itself, since its value may be replaced ([`Var::rebind`]) while it is borrowed.
///
/// ```
/// use cartage::{DType, Device, Tensor, Var};
/// let cpu = Device::cpu();
/// let w = Var::new(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &cpu)?)?;
/// let loss = w.tensor().square()?.sum_all()?; // Σ w²
/// loss.backward()?;
/// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
/// # Ok::<(), cartage::Error>(())
/// ```
#[derive(Clone)]
pub struct Var {
    cell: Arc<VarCell>,
}

impl Var {
    /// A new variable holding `value` (detached from any graph it came from). Only float
    /// tensors can have gradients.
    ///
    /// ```
    /// use cartage::{DType, Device, ErrorKind, Tensor, Var};
    /// let ids = Tensor::from_slice(&[1i64, 2], &[2], &Device::cpu())?;
    /// assert_eq!(Var::new(ids).err().unwrap().kind(), ErrorKind::WrongDType);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn new(value: Tensor) -> Result<Var> {
        check_float("Var::new", value.dtype())?;
        Ok(Var {
            cell: Arc::new(VarCell {
                id: VarId(NEXT_VAR_ID.fetch_add(1, Ordering::Relaxed)),
                state: Mutex::new(VarState {
                    value: value.detach(),
                    grad: None,
                    hooks: Vec::new(),
                }),
            }),
        })
    }

    /// The identity, stable across [`Var::set`].
    pub fn id(&self) -> VarId {
        self.cell.id
    }

    /// The current value, as a tensor whose ops are recorded. Take it afresh after a
    /// [`Var::set`]: a tensor taken before still holds the old value.
    pub fn tensor(&self) -> Tensor {
        let value = self.cell.lock().value.clone();
        value.with_link(Some(GradLink::Leaf(Arc::clone(&self.cell))))
    }

    /// The current value, not recorded (as `self.tensor().detach()`).
    pub fn value(&self) -> Tensor {
        self.cell.lock().value.clone()
    }

    /// The accumulated gradient, or `None` before the first backward that reached this variable
    /// (and after [`Var::zero_grad`]).
    pub fn grad(&self) -> Option<Tensor> {
        self.cell.lock().grad.clone()
    }

    /// Frees the accumulated gradient (the next backward starts from nothing). Freeing, not
    /// filling with zeros, gives the memory back to the cache at once.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let w = Var::new(Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// w.tensor().sum_all()?.backward()?;
    /// w.tensor().sum_all()?.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![2.0, 2.0]); // accumulated
    /// w.zero_grad();
    /// assert!(w.grad().is_none());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn zero_grad(&self) {
        self.cell.lock().grad = None;
    }

    /// Run `hook` each time a backward pass has finished this variable's gradient: once every
    /// op that used the variable has passed its share back, while the rest of the graph may
    /// still be running (data-parallel training starts reducing a bucket there). The hook gets
    /// the variable and its accumulated gradient, runs on the backward's thread without
    /// recording, and cannot run a backward itself (one started there is refused with
    /// [`Error::InvalidState`]); an error it returns ends the backward with that error. Hooks run in the order they were added. Returns an id for
    /// [`Var::remove_grad_hook`].
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use cartage::{DType, Device, Tensor, Var};
    /// let cpu = Device::cpu();
    /// let (a, b) = (Var::new(Tensor::ones(&[2], DType::F32, &cpu)?)?, Var::new(Tensor::ones(&[2], DType::F32, &cpu)?)?);
    /// let ready = Arc::new(Mutex::new(Vec::new()));
    /// for (name, v) in [("a", &a), ("b", &b)] {
    ///     let ready = Arc::clone(&ready);
    ///     v.on_grad_ready(Arc::new(move |_var: &Var, g: &Tensor| {
    ///         ready.lock().unwrap().push((name, g.to_vec::<f32>()?));
    ///         Ok(())
    ///     }));
    /// }
    /// // b is used by the last op only: its gradient is final before a's.
    /// a.tensor().exp()?.mul(&b.tensor())?.sum_all()?.backward()?;
    /// let order: Vec<&str> = ready.lock().unwrap().iter().map(|(n, _)| *n).collect();
    /// assert_eq!(order, ["b", "a"]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn on_grad_ready(&self, hook: GradHook) -> GradHookId {
        let id = GradHookId(NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed));
        self.cell.lock().hooks.push((id, hook));
        id
    }

    /// Remove a hook added with [`Var::on_grad_ready`]; returns whether it was there.
    pub fn remove_grad_hook(&self, id: GradHookId) -> bool {
        let mut state = self.cell.lock();
        let before = state.hooks.len();
        state.hooks.retain(|(h, _)| *h != id);
        state.hooks.len() != before
    }

    /// Replaces the gradient (for optimizers and gradient clipping). It must have the value's
    /// shape, dtype and device.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        let mut state = self.cell.lock();
        if let Some(g) = &grad {
            check_like("Var::set_grad", &state.value, g)?;
        }
        state.grad = grad.map(|g| g.detach());
        Ok(())
    }

    /// Writes `value` into the variable's own memory: every holder of this `Var` sees the new
    /// values, and nothing else shares them afterwards (two models loaded from one tensor stay
    /// apart). The shape, dtype and device must stay: a typed error says to call
    /// [`Var::rebind`] to move or cast a variable. The write counts as an in-place write, so a
    /// backward through a graph that saved the old value is refused.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let w = Var::new(Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// let held_elsewhere = w.clone();
    /// let source = Tensor::full(&[2], 3.0, DType::F32, &Device::cpu())?;
    /// w.set(source.clone())?;
    /// assert_eq!(held_elsewhere.value().to_vec::<f32>()?, vec![3.0, 3.0]);
    /// assert!(!w.value().shares_storage(&source));
    /// assert!(w.set(source.to_dtype(DType::F64)?).is_err()); // a cast is `rebind`'s job
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn set(&self, value: Tensor) -> Result<()> {
        let state = self.cell.lock();
        check_same_shape("Var::set", &state.value, &value)?;
        if value.dtype() != state.value.dtype() || value.device() != state.value.device() {
            return Err(Error::InvalidArgument {
                op: "Var::set",
                reason: format!(
                    "the variable is {} on {} and the value {} on {}; `set` writes into the variable's \
                     own memory and keeps its dtype and device. To move or cast the variable, call \
                     `Var::rebind(value)` (or `ParamStore::to`/`to_dtype` for a whole model); to keep \
                     it where it is, pass `value.to_device_dtype(&var.device(), var.dtype())?`",
                    state.value.dtype(),
                    state.value.device(),
                    value.dtype(),
                    value.device()
                ),
            });
        }
        let _guard = super::no_grad();
        state.value.copy_from(&value)
    }

    /// Replaces the value with `value` itself (sharing its memory), which may have another
    /// float dtype or device: the explicit way to move or cast a variable. The shape must stay.
    /// An accumulated gradient follows (moved and cast), so value and gradient always agree; a
    /// backward through a graph recorded before a move or cast is refused when it reaches the
    /// variable.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let w = Var::new(Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// let held_elsewhere = w.clone();
    /// w.rebind(w.value().to_dtype(DType::F64)?)?;
    /// assert_eq!(held_elsewhere.tensor().dtype(), DType::F64);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn rebind(&self, value: Tensor) -> Result<()> {
        check_float("Var::rebind", value.dtype())?;
        let mut state = self.cell.lock();
        check_same_shape("Var::rebind", &state.value, &value)?;
        let grad = match state.grad.take() {
            Some(g) if g.device() != value.device() || g.dtype() != value.dtype() => {
                let _guard = super::no_grad();
                match g.to_device_dtype(&value.device(), value.dtype()) {
                    Ok(moved) => Some(moved),
                    Err(e) => {
                        state.grad = Some(g);
                        return Err(e);
                    }
                }
            }
            other => other,
        };
        state.value = value.detach();
        state.grad = grad;
        Ok(())
    }

    /// The value's shape.
    pub fn shape(&self) -> cartage_core::Dims {
        self.cell.meta().0
    }

    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.cell.meta().1
    }

    /// The value's device.
    pub fn device(&self) -> Device {
        self.cell.meta().2
    }

    pub(crate) fn from_cell(cell: Arc<VarCell>) -> Var {
        Var { cell }
    }
}

impl fmt::Debug for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shape, dtype, device) = self.cell.meta();
        f.debug_struct("Var")
            .field("id", &self.cell.id)
            .field("shape", &shape.as_slice())
            .field("dtype", &dtype)
            .field("device", &device)
            .field("has_grad", &self.cell.lock().grad.is_some())
            .finish()
    }
}

fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype,
            expected: "a float dtype: only floating-point tensors have gradients",
        })
    }
}

fn check_same_shape(op: &'static str, current: &Tensor, value: &Tensor) -> Result<()> {
    if value.shape() == current.shape() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        op,
        lhs: current.shape().to_vec(),
        rhs: value.shape().to_vec(),
        reason: "a variable keeps its shape; make a new `Var` for a new shape".into(),
    })
}

fn check_like(op: &'static str, value: &Tensor, grad: &Tensor) -> Result<()> {
    if grad.shape() != value.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: value.shape().to_vec(),
            rhs: grad.shape().to_vec(),
            reason: "a gradient has its variable's shape".into(),
        });
    }
    if grad.dtype() != value.dtype() {
        return Err(Error::WrongDType {
            op,
            dtype: grad.dtype(),
            expected: "the variable's dtype",
        });
    }
    if grad.device() != value.device() {
        return Err(Error::Autograd {
            op,
            reason: format!(
                "the gradient is on {} but the variable on {}; move it with `.to(&device)` first",
                grad.device(),
                value.device()
            ),
        });
    }
    Ok(())
}
