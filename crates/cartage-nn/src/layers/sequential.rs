//! [`Sequential`]: modules applied in order, and the activations as modules.

use cartage::{Result, Tensor};

use crate::Module;

/// Modules applied one after the other.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module + Send + Sync>>,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// This sequence with `layer` appended.
    pub fn push(mut self, layer: impl Module + Send + Sync + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }
}

/// An element-wise activation as a module.
#[derive(Clone, Copy, Debug)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// The exact (erf) GELU.
    Gelu,
    /// `x·sigmoid(x)`.
    Silu,
    /// `tanh(x)`.
    Tanh,
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
        }
    }
}
