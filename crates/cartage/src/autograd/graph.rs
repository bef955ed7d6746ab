//! The recorded graph: each op on a tensor that a variable leads to makes a [`Node`] holding its
//! backward function (with the tensors that function needs, saved) and links to its inputs.
//!
//! The node holds its inputs alive, as in PyTorch: that is what makes keeping a loss with its
//! graph grow memory (ARTICLE R23). Backward releases each node's saved tensors and links as it
//! passes, unless asked to retain the graph. Nothing is recorded unless an input has a link and
//! recording is on ([`super::is_grad_enabled`]); the check is a pointer test per input, so ops on
//! plain tensors pay nothing more.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{DType, Device, Dims, Result, Site};

use super::var::VarCell;
use crate::Tensor;

/// What a gradient flows back to: a variable's cell or the node that made a tensor; or, for
/// the result of an op with no derivative (argmax, comparisons, integer casts) computed from a
/// variable, the op's name, so that asking it for a gradient can say why there is none.
#[derive(Clone)]
pub(crate) enum GradLink {
    Leaf(Arc<VarCell>),
    Node(Arc<Node>),
    Constant(&'static str),
}

impl GradLink {
    /// True for links gradients flow through (not [`GradLink::Constant`]).
    #[inline]
    pub(crate) fn flows(&self) -> bool {
        !matches!(self, GradLink::Constant(_))
    }
}

/// The gradients of an op's inputs, given the gradient of its output and which inputs need
/// one (`needs[i]` is false for inputs no variable leads to: their gradient is not computed).
pub(crate) type BackwardFn = Box<dyn Fn(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

static LIVE_NODES: AtomicUsize = AtomicUsize::new(0);
static SAVED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Nodes alive now, in the whole process.
pub fn live_graph_nodes() -> usize {
    LIVE_NODES.load(Ordering::Relaxed)
}

/// Bytes of the tensors saved by live nodes for their backward (activations), counted by view
/// size, in the whole process. A graph kept alive by a stored loss shows here.
pub fn saved_activation_bytes() -> usize {
    SAVED_BYTES.load(Ordering::Relaxed)
}

/// One recorded op.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    pub(crate) site: Site,
    /// Shape, dtype and device of each input (a gradient must match them).
    pub(crate) input_meta: Vec<(Dims, DType, Device)>,
    state: Mutex<NodeState>,
}

pub(crate) struct NodeState {
    pub(crate) inputs: Vec<Option<GradLink>>,
    pub(crate) backward: Option<BackwardFn>,
    pub(crate) saved_bytes: usize,
    /// Set once backward released the node (so a second pass can say why it fails).
    pub(crate) released: bool,
}

impl Node {
    pub(crate) fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drop the backward function (its saved tensors) and the links to the inputs.
    pub(crate) fn release(&self) {
        let mut state = self.lock();
        state.backward = None;
        state.inputs.clear();
        state.released = true;
        SAVED_BYTES.fetch_sub(std::mem::take(&mut state.saved_bytes), Ordering::Relaxed);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        LIVE_NODES.fetch_sub(1, Ordering::Relaxed);
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        SAVED_BYTES.fetch_sub(state.saved_bytes, Ordering::Relaxed);
        // Release long chains iteratively: dropping a node drops its inputs, which would
        // otherwise recurse once per op and overflow the stack on a graph of 100k ops.
        let mut pending: Vec<Arc<Node>> = state
            .inputs
            .drain(..)
            .filter_map(|l| match l {
                Some(GradLink::Node(n)) => Some(n),
                _ => None,
            })
            .collect();
        while let Some(node) = pending.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(node) {
                let inner_state = inner.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
                pending.extend(inner_state.inputs.drain(..).filter_map(|l| match l {
                    Some(GradLink::Node(n)) => Some(n),
                    _ => None,
                }));
            }
        }
    }
}

/// True when an op on `inputs` would be recorded: recording is on and an input has a link.
#[inline]
pub(crate) fn tracking(inputs: &[&Tensor]) -> bool {
    inputs.iter().any(|t| t.link().is_some_and(GradLink::flows)) && super::is_grad_enabled()
}

/// Record `out` as made by `name` from `inputs`, with the backward function `make` builds
/// (called only when recording). `saved` lists the tensors the backward function keeps (for the
/// activation count). Returns `out`, linked to the new node, or unchanged when not recording.
#[inline]
pub(crate) fn record(
    out: Tensor,
    name: &'static str,
    inputs: &[&Tensor],
    make: impl FnOnce(&Tensor) -> (BackwardFn, usize),
) -> Tensor {
    if inputs.iter().all(|t| t.link().is_none()) {
        return out;
    }
    record_slow(out, name, inputs, make)
}

/// Mark `out`, made by an op with no derivative, so that backward from it says so; a no-op
/// unless an input is tracked. The result takes part in later ops as a constant.
#[inline]
pub(crate) fn record_constant(out: Tensor, name: &'static str, inputs: &[&Tensor]) -> Tensor {
    if inputs.iter().all(|t| t.link().is_none()) || !super::is_grad_enabled() {
        return out;
    }
    out.with_link(Some(GradLink::Constant(name)))
}

#[cold]
fn record_slow(
    out: Tensor,
    name: &'static str,
    inputs: &[&Tensor],
    make: impl FnOnce(&Tensor) -> (BackwardFn, usize),
) -> Tensor {
    if !super::is_grad_enabled() {
        return out;
    }
    if !inputs.iter().any(|t| t.link().is_some_and(GradLink::flows)) {
        // Only constants (results of ops with no derivative) lead here: the result is one too,
        // and keeps the name of the op that made it so, for the error backward gives.
        let constant = inputs.iter().find_map(|t| t.link()).cloned();
        return out.with_link(constant);
    }
    let (backward, saved_bytes) = make(&out);
    LIVE_NODES.fetch_add(1, Ordering::Relaxed);
    SAVED_BYTES.fetch_add(saved_bytes, Ordering::Relaxed);
    let node = Node {
        name,
        site: out.origin(),
        input_meta: inputs
            .iter()
            .map(|t| (Dims::from_slice(t.shape()), t.dtype(), t.device()))
            .collect(),
        state: Mutex::new(NodeState {
            inputs: inputs.iter().map(|t| t.link().filter(|l| l.flows()).cloned()).collect(),
            backward: Some(backward),
            saved_bytes,
            released: false,
        }),
    };
    out.with_link(Some(GradLink::Node(Arc::new(node))))
}

/// A backward function from a closure, with the bytes of the tensors it saved ([`bytes`]).
pub(crate) fn saving(
    saved_bytes: usize,
    f: impl Fn(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> (BackwardFn, usize) {
    (Box::new(f), saved_bytes)
}

/// The bytes of the tensors a backward function saves (by view size).
pub(crate) fn bytes(saved: &[&Tensor]) -> usize {
    saved.iter().map(|t| t.size_in_bytes()).sum()
}
