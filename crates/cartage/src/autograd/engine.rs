//! Reverse mode: from one tensor back to the variables that lead to it.
//!
//! The nodes reachable from the output are counted first (how many consumers each has), then
//! run in an order where a node runs only after every consumer has passed it its share of the
//! gradient (Kahn's order on the reversed graph). A node's gradient is dropped as soon as the
//! node has run, and the node's saved tensors are released as it is passed, unless the graph is
//! retained. Inputs that no variable leads to have no link, so their gradients are never
//! computed. The whole pass runs without recording.
//!
//! A variable's gradient is final once every node that uses it has run (its uses are counted
//! with the nodes'): it is then accumulated into the variable at once, and the variable's
//! gradient-ready hooks run ([`Var::on_grad_ready`]), while the rest of the graph is still to
//! go. That is what lets data-parallel training start communicating a bucket of gradients
//! during backward. A variable without hooks costs one count per use.

use std::collections::HashMap;
use std::sync::Arc;

use cartage_core::{Error, Result};

use super::gradients::Gradients;
use super::graph::{GradLink, Node};
use super::var::{Var, VarCell};
use crate::Tensor;

/// Run backward from `root` with output gradient `grad` (already checked against `root`).
/// `unit_seed`: `grad` is the ones this engine made for [`Tensor::backward`] (see
/// [`is_unit_seed`]).
pub(crate) fn run(root: &Tensor, grad: Tensor, retain_graph: bool, unit_seed: bool) -> Result<Gradients> {
    let _running = Running::enter()?;
    // Held to the end of the pass, so no other storage can take the seed's address meanwhile.
    let _seed = (unit_seed && !retain_graph).then(|| UnitSeed::mark(&grad));
    let _guard = super::no_grad();
    let mut out = Gradients::default();
    match root.link() {
        None => {
            return Err(Error::Autograd {
                op: "backward",
                reason: "this tensor does not require a gradient: no variable leads to it. Make the \
                         parameters `Var`s and compute from `var.tensor()`, outside `no_grad()`"
                    .into(),
            });
        }
        Some(GradLink::Constant(op)) => {
            return Err(Error::Autograd {
                op: "backward",
                reason: format!(
                    "this tensor comes from `{op}`, which has no derivative (indices, comparisons and \
                     integer results are constants to autograd); compute the loss from float ops"
                ),
            });
        }
        Some(GradLink::Leaf(cell)) => {
            let g = if grad.is_contiguous() { grad } else { grad.contiguous()? };
            finish_leaf(&mut out, Arc::clone(cell), g)?;
        }
        Some(GradLink::Node(root_node)) => {
            let uses = count_consumers(root_node)?;
            walk(root_node, grad, uses, retain_graph, &mut out)?;
        }
    }
    Ok(out)
}

/// How many reachable consumers each reachable node has, and how many uses each variable has.
struct Uses {
    nodes: HashMap<usize, usize>,
    leaves: HashMap<usize, usize>,
}

fn key(node: &Arc<Node>) -> usize {
    Arc::as_ptr(node) as usize
}

fn cell_key(cell: &Arc<VarCell>) -> usize {
    Arc::as_ptr(cell) as usize
}

/// How many reachable consumers each reachable node has, and how many reachable uses each
/// variable; fails when a node was released by an earlier backward.
fn count_consumers(root: &Arc<Node>) -> Result<Uses> {
    let mut consumers: HashMap<usize, usize> = HashMap::new();
    let mut leaves: HashMap<usize, usize> = HashMap::new();
    consumers.insert(key(root), 0);
    let mut stack = vec![Arc::clone(root)];
    while let Some(node) = stack.pop() {
        let state = node.lock();
        if state.released || state.backward.is_none() {
            return Err(freed(&node));
        }
        for link in state.inputs.iter().flatten() {
            match link {
                GradLink::Node(input) => {
                    let count = consumers.entry(key(input)).or_insert(0);
                    *count += 1;
                    if *count == 1 {
                        stack.push(Arc::clone(input));
                    }
                }
                GradLink::Leaf(cell) => *leaves.entry(cell_key(cell)).or_insert(0) += 1,
                GradLink::Constant(_) => {}
            }
        }
    }
    Ok(Uses {
        nodes: consumers,
        leaves,
    })
}

fn walk(root: &Arc<Node>, grad: Tensor, uses: Uses, retain_graph: bool, out: &mut Gradients) -> Result<()> {
    let Uses {
        nodes: mut consumers,
        leaves: mut leaf_uses,
    } = uses;
    let mut leaves: HashMap<usize, (Arc<VarCell>, Tensor)> = HashMap::new();
    let mut pending: HashMap<usize, Tensor> = HashMap::new();
    pending.insert(key(root), grad);
    let mut ready = vec![Arc::clone(root)];
    while let Some(node) = ready.pop() {
        let grad_out = pending.remove(&key(&node));
        let (inputs, input_grads) = {
            let mut state = node.lock();
            let inputs: Vec<Option<GradLink>> = state.inputs.clone();
            let input_grads = match &grad_out {
                Some(g) => {
                    node.check_versions(&state)?;
                    let needs: Vec<bool> = inputs.iter().map(Option::is_some).collect();
                    let grads = if retain_graph {
                        let backward = state.backward.as_ref().ok_or_else(|| freed(&node))?;
                        backward(g, &needs)
                    } else {
                        // Claimed under the lock: another thread's backward through this node
                        // finds it gone and fails, so no backward function runs twice.
                        let backward = state.backward.take().ok_or_else(|| freed(&node))?;
                        drop(state);
                        backward(g, &needs)
                    }
                    .map_err(|e| in_backward_of(&node, e))?;
                    check_grads(&node, &grads)?;
                    grads
                }
                None => vec![None; inputs.len()],
            };
            (inputs, input_grads)
        };
        drop(grad_out);
        if !retain_graph {
            node.release();
        }
        for (link, g) in inputs.into_iter().zip(input_grads) {
            match link {
                None => {}
                Some(GradLink::Constant(_)) => {}
                Some(GradLink::Leaf(cell)) => {
                    let k = cell_key(&cell);
                    if let Some(g) = g {
                        add_leaf(&mut leaves, &cell, g)?;
                    }
                    let last = leaf_uses.get_mut(&k).is_some_and(|count| {
                        *count -= 1;
                        *count == 0
                    });
                    if last && let Some((cell, g)) = leaves.remove(&k) {
                        finish_leaf(out, cell, g)?;
                    }
                }
                Some(GradLink::Node(input)) => {
                    let k = key(&input);
                    if let Some(g) = g {
                        let merged = match pending.remove(&k) {
                            Some(prev) => prev.add(&g)?,
                            None => g,
                        };
                        pending.insert(k, merged);
                    }
                    let count = consumers.get_mut(&k).expect("every reachable node was counted");
                    *count -= 1;
                    if *count == 0 {
                        ready.push(input);
                    }
                }
            }
        }
    }
    // Every use was counted, so nothing is left here; should a count ever disagree, the gradient
    // is still delivered rather than lost.
    for (_, (cell, g)) in leaves.drain() {
        finish_leaf(out, cell, g)?;
    }
    Ok(())
}

/// Accumulate a variable's final gradient of this pass, record it, and run its hooks.
fn finish_leaf(out: &mut Gradients, cell: Arc<VarCell>, g: Tensor) -> Result<()> {
    let (total, hooks) = cell.accumulate(g)?;
    let var = Var::from_cell(cell);
    for hook in &hooks {
        hook(&var, &total)?;
    }
    out.insert(var, total);
    Ok(())
}

fn add_leaf(leaves: &mut HashMap<usize, (Arc<VarCell>, Tensor)>, cell: &Arc<VarCell>, g: Tensor) -> Result<()> {
    let k = cell_key(cell);
    match leaves.remove(&k) {
        Some((cell, prev)) => {
            let sum = prev.add(&g)?;
            leaves.insert(k, (cell, sum));
        }
        None => {
            // A stored gradient owns dense memory, never a broadcast view of another tensor.
            let g = if g.is_contiguous() { g } else { g.contiguous()? };
            leaves.insert(k, (Arc::clone(cell), g));
        }
    }
    Ok(())
}

fn check_grads(node: &Node, grads: &[Option<Tensor>]) -> Result<()> {
    if grads.len() != node.input_meta.len() {
        return Err(internal(
            node,
            format!("{} gradients for {} inputs", grads.len(), node.input_meta.len()),
        ));
    }
    for (g, (shape, dtype, device)) in grads.iter().zip(&node.input_meta) {
        if let Some(g) = g
            && (g.shape() != shape.as_slice() || g.dtype() != *dtype || g.device() != *device)
        {
            return Err(internal(
                node,
                format!(
                    "a gradient of shape {:?} {} on {} for an input of shape {:?} {} on {}",
                    g.shape(),
                    g.dtype(),
                    g.device(),
                    shape.as_slice(),
                    dtype,
                    device
                ),
            ));
        }
    }
    Ok(())
}

fn internal(node: &Node, what: String) -> Error {
    Error::Autograd {
        op: "backward",
        reason: format!(
            "internal: the backward of `{}` (recorded at {}) returned {what}; this is a bug in cartage",
            node.name, node.site
        ),
    }
}

/// The error for a node whose backward function an earlier (or concurrent) backward took.
fn freed(node: &Node) -> Error {
    Error::Autograd {
        op: "backward",
        reason: format!(
            "the graph through `{}` (recorded at {}) was freed by an earlier backward, or is being \
             freed by one running on another thread. Pass `retain_graph = true` to the first \
             `backward_with` to go through it twice, or recompute the forward pass",
            node.name, node.site
        ),
    }
}

thread_local! {
    /// Set while this thread runs a backward pass (a hook that starts another is refused).
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The storage of the unit seed of the backward pass this thread runs, while it runs (0:
    /// none, or the pass keeps its graph).
    static UNIT_SEED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether `g`, the output gradient a backward function received, is the engine's own unit
/// seed (or a view of it: every element 1) in a pass that releases the graph as it goes. A
/// loss node whose forward already computed its input's gradient for a unit seed (the fused
/// `cross_entropy`) then hands that over as it is, with no pass over it: the node is released
/// after it runs, so the gradient has no other owner. Any other `g` (a scaled loss, a loss used
/// twice, a seed passed by the caller, a retained graph) takes the general path.
pub(crate) fn is_unit_seed(g: &Tensor) -> bool {
    let seed = UNIT_SEED.with(std::cell::Cell::get);
    seed != 0 && Arc::as_ptr(g.storage()) as usize == seed
}

/// Marks a backward pass's unit seed for [`is_unit_seed`] until dropped; holds the seed's
/// storage so that its address names no other storage while marked.
struct UnitSeed {
    _storage: Arc<crate::Storage>,
}

impl UnitSeed {
    fn mark(seed: &Tensor) -> UnitSeed {
        let storage = Arc::clone(seed.storage());
        UNIT_SEED.with(|s| s.set(Arc::as_ptr(&storage) as usize));
        UnitSeed { _storage: storage }
    }
}

impl Drop for UnitSeed {
    fn drop(&mut self) {
        UNIT_SEED.with(|s| s.set(0));
    }
}

/// Marks this thread as running a backward pass until dropped.
struct Running;

impl Running {
    /// Refuse a backward started on a thread already running one (from a gradient hook): it
    /// would recurse without end or see half-accumulated gradients.
    fn enter() -> Result<Running> {
        if RUNNING.with(|r| r.replace(true)) {
            return Err(Error::InvalidState {
                op: "backward",
                reason: "a backward pass was started while this thread runs one (from a gradient hook?); \
                         a hook must not call `backward`: record what it needs and run the next backward \
                         after the current one returns"
                    .into(),
            });
        }
        Ok(Running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

fn in_backward_of(node: &Node, e: Error) -> Error {
    tracing::debug!(op = node.name, site = %node.site, error = %e, "backward of a node failed");
    e
}
