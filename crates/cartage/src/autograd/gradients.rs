//! [`Gradients`]: what one backward call reached, variable by variable.

use std::collections::HashMap;

use super::var::{Var, VarId};
use crate::Tensor;

/// The gradients one [`Tensor::backward`] call reached: for each variable it reached, the
/// gradient accumulated so far (the same tensor [`Var::grad`] returns right after the call).
/// Variables that no path reached are absent.
///
/// ```
/// use cartage::{DType, Device, Tensor, Var};
/// let cpu = Device::cpu();
/// let a = Var::new(Tensor::full(&[2], 3.0, DType::F32, &cpu)?)?;
/// let b = Var::new(Tensor::full(&[2], 4.0, DType::F32, &cpu)?)?;
/// let unused = Var::new(Tensor::ones(&[2], DType::F32, &cpu)?)?;
/// let grads = a.tensor().mul(&b.tensor())?.sum_all()?.backward()?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, vec![4.0, 4.0]);
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, vec![3.0, 3.0]);
/// assert!(grads.get(&unused).is_none());
/// # Ok::<(), cartage::Error>(())
/// ```
#[derive(Default)]
pub struct Gradients {
    entries: Vec<(Var, Tensor)>,
    index: HashMap<VarId, usize>,
}

impl Gradients {
    pub(crate) fn insert(&mut self, var: Var, grad: Tensor) {
        self.index.insert(var.id(), self.entries.len());
        self.entries.push((var, grad));
    }

    /// The gradient of `var`, if this backward reached it.
    pub fn get(&self, var: &Var) -> Option<&Tensor> {
        self.get_id(var.id())
    }

    /// The gradient of the variable with this id, if this backward reached it.
    pub fn get_id(&self, id: VarId) -> Option<&Tensor> {
        self.index.get(&id).map(|&i| &self.entries[i].1)
    }

    /// Every variable reached, with its gradient, in the order backward finished them.
    pub fn iter(&self) -> impl Iterator<Item = (&Var, &Tensor)> {
        self.entries.iter().map(|(v, g)| (v, g))
    }

    /// How many variables were reached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when backward reached no variable.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl std::fmt::Debug for Gradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(v, g)| (v.id(), g.shape().to_vec())))
            .finish()
    }
}
