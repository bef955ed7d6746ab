//! Reverse-mode automatic differentiation.
//!
//! - [`Var`]: a variable, the leaf gradients are computed for. Its cell holds the value and the
//!   accumulated gradient; [`Var::set`] writes new values in place and [`Var::rebind`] moves or
//!   casts the value, so modules and optimizers holding the `Var` (or its [`VarId`]) never see a
//!   stale one.
//! - Recording: an op records how its result was made only when an input has a link to a
//!   variable and recording is on. The record holds its inputs (and the tensors its backward
//!   needs) alive: a loss kept with its graph keeps every activation (LESSONS R23); keep
//!   `loss.detach()` instead. [`no_grad`] turns recording off on the thread.
//! - [`crate::Tensor::backward`]: gradients of the variables that lead to a one-element tensor,
//!   accumulated into each variable and returned as [`Gradients`]. Only gradients on a path to
//!   a variable are computed; intermediate gradients are dropped as soon as they are used; the
//!   graph is released as it is passed unless retained.
//! - `formulas`: each op's derivative, written with cartage's own ops, so it runs on every
//!   backend; the fused primitives (norms, cross-entropy, attention, convolution) have backward
//!   functions of their own.
//!
//! Gradients live in the variables rather than in a store returned by backward: the parameter
//! store of a model owns `Var`s, moves them in place (value and gradient together), and the
//! optimizer finds each gradient through the `Var` it was given, by id. A returned store would
//! be a second copy of those handles to keep in step.

mod engine;
pub(crate) mod formulas;
mod gradients;
pub(crate) mod graph;
mod mode;
mod tensor_api;
mod var;

pub use gradients::Gradients;
pub use graph::{GraphMemory, graph_memory, live_graph_nodes, saved_activation_bytes};
pub use mode::{NoGradGuard, is_grad_enabled, no_grad};
pub use var::{GradHook, GradHookId, Var, VarId};
