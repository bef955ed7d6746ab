//! [`Module`]: something with parameters (or none) that maps a tensor to a tensor.

use cartage::{Result, Tensor};

/// A layer or a model: `forward` maps an input to an output, reading its parameters afresh from
/// their variables on every call (so a store moved in place is seen at once).
pub trait Module {
    /// The output for `x`. A wrong input shape is a typed error naming the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
}

impl<M: Module + ?Sized> Module for &M {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
}
