//! [`Embedding`]: rows of a table picked by integer ids.

use cartage::{DType, Generator, Result, Tensor, Var};

use super::{normal, wrong_input};
use crate::{Module, Scope};

/// A table `[num, dim]` drawn from N(0, 1) (PyTorch's `nn.Embedding`); ids of any shape give
/// `[.., dim]`. An id outside `[0, num)` is `Error::IndexOutOfRange`.
pub struct Embedding {
    weight: Var,
}

impl Embedding {
    /// A table named `scope.weight`, in f32.
    pub fn new(scope: &Scope, num: usize, dim: usize, rng: &mut Generator) -> Result<Embedding> {
        let weight = scope.var("weight", normal(&[num, dim], DType::F32, rng, &scope.device())?)?;
        Ok(Embedding { weight })
    }

    /// The table.
    pub fn weight(&self) -> &Var {
        &self.weight
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype().is_float() {
            return Err(wrong_input(
                "Embedding",
                ids,
                "it needs integer ids (i32 or i64)".into(),
            ));
        }
        self.weight.tensor().embedding(ids)
    }
}
