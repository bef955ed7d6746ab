//! Each op's derivative, written with cartage's own ops so that it runs on every backend.
//!
//! A formula gets the tensors its op saved (detached: they hold no graph) and returns a
//! [`BackwardFn`](super::graph::BackwardFn) that maps the output's gradient to the inputs'
//! gradients, computing only those asked for. Backward runs without recording, so these ops
//! build no graph of their own. Gradients come back in each input's dtype and shape: broadcast
//! inputs get theirs summed back ([`sum_to`]).

pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod linalg;
pub(crate) mod nn;
pub(crate) mod reduce;
pub(crate) mod shape;
pub(crate) mod view;

use cartage_core::{DType, Device, Result};

use crate::Tensor;

/// `g` summed over the dimensions that broadcasting added or stretched, down to `shape`.
pub(crate) fn sum_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank().saturating_sub(shape.len());
    let mut dims: Vec<isize> = (0..lead as isize).collect();
    for (i, &s) in shape.iter().enumerate() {
        if s == 1 && g.shape()[lead + i] != 1 {
            dims.push((lead + i) as isize);
        }
    }
    let reduced = if dims.is_empty() {
        g.clone()
    } else {
        g.sum(&dims, true)?
    };
    reduced.reshape(shape)
}

/// A zero tensor of `shape` with `g` written into the part `view` selects (the backward of a
/// view that picks some elements: narrow, select, slicing).
pub(crate) fn embed(
    shape: &[usize],
    dtype: DType,
    device: Device,
    g: &Tensor,
    view: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let zeros = Tensor::zeros(shape, dtype, &device)?;
    view(&zeros)?.copy_from(g)?;
    Ok(zeros)
}

/// The shape, dtype and device of a tensor, kept by formulas that need no values.
#[derive(Clone)]
pub(crate) struct Meta {
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl Meta {
    pub(crate) fn of(t: &Tensor) -> Meta {
        Meta {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            device: t.device(),
        }
    }

    pub(crate) fn zeros(&self) -> Result<Tensor> {
        Tensor::zeros(&self.shape, self.dtype, &self.device)
    }
}

/// `Some(f())` when `need`, else `None` (the gradient is not computed).
pub(crate) fn when(need: bool, f: impl FnOnce() -> Result<Tensor>) -> Result<Option<Tensor>> {
    if need { f().map(Some) } else { Ok(None) }
}

/// A zero of `like`'s dtype on its device, shape `[]` (it broadcasts against anything).
pub(crate) fn zero_like(like: &Tensor) -> Result<Tensor> {
    Tensor::zeros(&[], like.dtype(), &like.device())
}
