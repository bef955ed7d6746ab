//! The recorded graph: each op on a tensor that a variable leads to makes a [`Node`] holding its
//! backward function (with the tensors that function needs, saved) and links to its inputs.
//!
//! The node holds its inputs alive, as in PyTorch: that is what makes keeping a loss with its
//! graph grow memory (LESSONS R23). Backward releases each node's saved tensors and links as it
//! passes, unless asked to retain the graph. Nothing is recorded unless an input has a link and
//! recording is on ([`super::is_grad_enabled`]); the check is a pointer test per input, so ops on
//! plain tensors pay nothing more.

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{DType, Device, Dims, Error, Result, Site};

use super::var::VarCell;
use crate::Tensor;
use crate::tensor::Storage;

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

/// Autograd's share of a device's memory: the recorded ops alive now and the bytes of the
/// tensors they saved for backward (the activations, counted by view size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphMemory {
    /// Recorded ops alive (not yet released by a backward, nor dropped).
    pub nodes: usize,
    /// Bytes their backward functions hold.
    pub saved_bytes: usize,
}

/// Per device; a handful of entries, touched only when an op is recorded or released.
static PER_DEVICE: Mutex<Vec<(Device, GraphMemory)>> = Mutex::new(Vec::new());

fn account(device: Device, nodes: isize, bytes: isize) {
    let mut table = PER_DEVICE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let at = match table.iter().position(|(d, _)| *d == device) {
        Some(i) => i,
        None => {
            table.push((device, GraphMemory::default()));
            table.len() - 1
        }
    };
    let entry = &mut table[at].1;
    entry.nodes = entry.nodes.saturating_add_signed(nodes);
    entry.saved_bytes = entry.saved_bytes.saturating_add_signed(bytes);
}

/// The recorded graph's memory on `device` (the device of each op's result).
///
/// ```
/// use cartage::{DType, Device, Tensor, Var};
/// let cpu = Device::cpu();
/// let w = Var::new(Tensor::ones(&[1024], DType::F32, &cpu)?)?;
/// let before = cartage::graph_memory(&cpu);
/// let loss = w.tensor().exp()?.sum_all()?; // exp saves its 4 KiB output
/// assert!(cartage::graph_memory(&cpu).saved_bytes >= before.saved_bytes + 4096);
/// loss.backward()?; // released as backward passes
/// # Ok::<(), cartage::Error>(())
/// ```
pub fn graph_memory(device: &Device) -> GraphMemory {
    let table = PER_DEVICE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    table
        .iter()
        .find(|(d, _)| d == device)
        .map(|(_, m)| *m)
        .unwrap_or_default()
}

/// Recorded ops alive now, on every device.
pub fn live_graph_nodes() -> usize {
    let table = PER_DEVICE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    table.iter().map(|(_, m)| m.nodes).sum()
}

/// Bytes saved for backward by the live graph, on every device. A graph kept alive by a stored
/// loss shows here (LESSONS R23).
pub fn saved_activation_bytes() -> usize {
    let table = PER_DEVICE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    table.iter().map(|(_, m)| m.saved_bytes).sum()
}

/// One recorded op.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    pub(crate) device: Device,
    pub(crate) site: Site,
    /// Shape, dtype and device of each input (a gradient must match them).
    pub(crate) input_meta: Vec<(Dims, DType, Device)>,
    state: Mutex<NodeState>,
}

pub(crate) struct NodeState {
    pub(crate) inputs: Vec<Option<GradLink>>,
    pub(crate) backward: Option<BackwardFn>,
    pub(crate) saved_bytes: usize,
    /// The storages the backward function reads, with their versions when recorded.
    pub(crate) saved_versions: Vec<(Arc<Storage>, u64)>,
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
        state.saved_versions = Vec::new();
        state.released = true;
        let freed = std::mem::take(&mut state.saved_bytes);
        drop(state);
        account(self.device, 0, -(freed as isize));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        account(self.device, -1, -(state.saved_bytes as isize));
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
    make: impl FnOnce(&Tensor) -> (BackwardFn, Saved),
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
    make: impl FnOnce(&Tensor) -> (BackwardFn, Saved),
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
    let (backward, saved) = make(&out);
    let Saved {
        bytes: saved_bytes,
        versions,
    } = saved;
    account(out.device(), 1, saved_bytes as isize);
    let node = Node {
        name,
        device: out.device(),
        site: out.origin(),
        input_meta: inputs
            .iter()
            .map(|t| (Dims::from_slice(t.shape()), t.dtype(), t.device()))
            .collect(),
        state: Mutex::new(NodeState {
            inputs: inputs.iter().map(|t| t.link().filter(|l| l.flows()).cloned()).collect(),
            backward: Some(backward),
            saved_bytes,
            saved_versions: versions,
            released: false,
        }),
    };
    out.with_link(Some(GradLink::Node(Arc::new(node))))
}

/// What a backward function keeps: the bytes of its saved tensors (for the activation count)
/// and each saved tensor's storage with its version at record time, which backward checks
/// ([`Node::check_versions`]).
pub(crate) struct Saved {
    bytes: usize,
    versions: Vec<(Arc<Storage>, u64)>,
}

/// The tensors a backward function reads, listed before the closure that captures them:
/// `saving(keep(&[&x, &y]), move |g, need| ...)`. List every tensor the closure captures (a
/// missing one would escape the in-place check). Their versions are read now, so backward can
/// refuse one written in place since.
pub(crate) fn keep(saved: &[&Tensor]) -> Saved {
    Saved {
        bytes: saved.iter().map(|t| t.size_in_bytes()).sum(),
        versions: saved
            .iter()
            .map(|t| (Arc::clone(t.storage()), t.storage().version()))
            .collect(),
    }
}

/// A backward function from a closure, with what it saved ([`keep`]).
pub(crate) fn saving(
    saved: Saved,
    f: impl Fn(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> (BackwardFn, Saved) {
    (Box::new(f), saved)
}

impl Node {
    /// Refuse to run this node's backward when a tensor it saved was written in place since it
    /// was recorded (PyTorch's "modified by an inplace operation").
    pub(crate) fn check_versions(&self, state: &NodeState) -> Result<()> {
        for (storage, saved_version) in &state.saved_versions {
            let version = storage.version();
            if version != *saved_version {
                let (written_by, written_at) = storage.last_write().unwrap_or(("an in-place write", self.site));
                return Err(Error::ModifiedInPlace {
                    op: self.name,
                    recorded_at: self.site,
                    saved_version: *saved_version,
                    version,
                    written_by,
                    written_at,
                });
            }
        }
        Ok(())
    }
}
