//! [`Dropout`]: zeroes elements with probability `p` in training mode.

use cartage::{Generator, Result, Tensor};

use crate::store::SharedGenerator;
use crate::{Module, ParamStore};

/// Drops each element with probability `p` and scales the rest by `1/(1-p)` while the store is
/// in training mode; passes the input through in evaluation mode. Draws from its own
/// [`Generator`], so a seed replays the same masks.
pub struct Dropout {
    p: f64,
    rng: SharedGenerator,
    store: ParamStore,
}

impl Dropout {
    /// Dropout with probability `p`, following `store`'s mode.
    pub fn new(store: &ParamStore, p: f64, rng: Generator) -> Dropout {
        Dropout {
            p,
            rng: store.register_generator("dropout", rng),
            store: store.clone(),
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut rng = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        x.dropout(self.p, &mut rng, self.store.is_training())
    }
}
