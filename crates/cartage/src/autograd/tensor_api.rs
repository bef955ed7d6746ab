//! The autograd side of [`Tensor`]: `backward`, `detach`, `requires_grad`, `requires_grad_`,
//! `grad`, and the conversions between a [`Var`] and its recorded value.

use cartage_core::{Error, Result};

use super::engine;
use super::gradients::Gradients;
use super::graph::GradLink;
use super::var::Var;
use crate::Tensor;

impl Tensor {
    /// True when a variable leads to this tensor (its ops are recorded).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let x = Tensor::ones(&[2], DType::F32, &Device::cpu())?;
    /// assert!(!x.requires_grad());
    /// let w = Var::new(x)?;
    /// assert!(w.tensor().requires_grad());
    /// assert!(!w.tensor().detach().requires_grad());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn requires_grad(&self) -> bool {
        self.link().is_some_and(GradLink::flows)
    }

    /// This tensor as a new leaf that gradients are computed for: PyTorch's
    /// `x.requires_grad_()`. The result is the recorded value of a new [`Var`] (as
    /// `Var::new(self)?.tensor()`), so it is used like any tensor, without `.tensor()` at each
    /// use; after a backward, [`Tensor::grad`] reads its gradient and [`Tensor::as_var`] gives
    /// the variable (to zero its gradient, or to [`Var::set`] it: the tensor shares the
    /// variable's memory and sees the new values). Only float tensors can have gradients
    /// ([`Error::WrongDType`] otherwise); a tensor already recorded is detached first, as
    /// [`Var::new`] does.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let w = Tensor::from_slice(&[1.0f32, -2.0], &[2], &cpu)?.requires_grad_()?;
    /// let x = Tensor::from_slice(&[3.0f32, 4.0], &[2], &cpu)?;
    /// w.mul(&x)?.sum_all()?.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![3.0, 4.0]);
    /// w.as_var().unwrap().zero_grad();
    /// assert!(w.grad().is_none());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn requires_grad_(self) -> Result<Tensor> {
        Ok(Var::new(self)?.tensor())
    }

    /// The same values, cut from the graph: ops on the result are not recorded, and it holds no
    /// recorded op alive. Keep `loss.detach()`, not `loss`, to log a running loss (LESSONS R23).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let w = Var::new(Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// let loss = w.tensor().sum_all()?;
    /// let logged = loss.detach();
    /// assert!(loss.requires_grad() && !logged.requires_grad());
    /// assert!(logged.shares_storage(&loss));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn detach(&self) -> Tensor {
        self.clone().with_link(None)
    }

    /// The variable behind this tensor, when it is a variable's value (`var.tensor()`).
    pub fn as_var(&self) -> Option<Var> {
        match self.link() {
            Some(GradLink::Leaf(cell)) => Some(Var::from_cell(cell.clone())),
            _ => None,
        }
    }

    /// The accumulated gradient of the variable this tensor is the value of (`None` for
    /// computed tensors, whose gradients are not kept, and before the first backward).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let x = Var::new(Tensor::full(&[2], 3.0, DType::F32, &Device::cpu())?)?.tensor();
    /// x.mul(&x)?.sum_all()?.backward()?;
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![6.0, 6.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn grad(&self) -> Option<Tensor> {
        self.as_var().and_then(|v| v.grad())
    }

    /// The name of the op that made this tensor, when it was recorded (`"mul"`, `"matmul"`).
    pub fn grad_fn(&self) -> Option<&'static str> {
        match self.link() {
            Some(GradLink::Node(node)) => Some(node.name),
            _ => None,
        }
    }

    /// Back-propagate from this one-element tensor (a loss): the gradient of every variable
    /// that leads to it is computed, added to the variable's accumulated gradient, and returned.
    /// The graph is released as backward passes it; see [`Tensor::backward_with`] to keep it.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let cpu = Device::cpu();
    /// let w = Var::new(Tensor::from_slice(&[1.0f32, -2.0], &[2], &cpu)?)?;
    /// let x = Tensor::from_slice(&[3.0f32, 4.0], &[2], &cpu)?;
    /// let loss = w.tensor().mul(&x)?.sum_all()?;
    /// let grads = loss.backward()?;
    /// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, vec![3.0, 4.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn backward(&self) -> Result<Gradients> {
        self.backward_with(None, false)
    }

    /// Back-propagate with an explicit output gradient, PyTorch's
    /// `y.backward(gradient, retain_graph=..)`: each variable receives the vector-Jacobian
    /// product `gradᵀ · ∂y/∂var`. The gradient is required when this tensor has more than one
    /// element and must have its shape ([`Error::ShapeMismatch`] otherwise), dtype and device.
    /// With `retain_graph`, the graph is kept, so a second backward can go through it again.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor, Var};
    /// let cpu = Device::cpu();
    /// let w = Var::new(Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?)?;
    /// let y = w.tensor().mul_scalar(3.0)?;
    /// let seed = Tensor::from_slice(&[1.0f32, 10.0], &[2], &cpu)?;
    /// y.backward_with(Some(&seed), true)?;
    /// y.backward_with(Some(&seed), false)?; // the graph was retained
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![6.0, 60.0]);
    /// assert!(y.backward_with(Some(&seed), false).is_err()); // now it is freed
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn backward_with(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<Gradients> {
        let unit_seed = grad.is_none();
        let seed = match grad {
            Some(g) => {
                check_seed(self, g)?;
                g.detach()
            }
            None => {
                if self.numel() != 1 {
                    return Err(Error::Autograd {
                        op: "backward",
                        reason: format!(
                            "backward from a tensor of shape {:?} needs its output gradient: reduce it \
                             to one element first (e.g. `.mean_all()?`), or pass one of the same shape \
                             to `backward_with(Some(&grad), ..)`",
                            self.shape()
                        ),
                    });
                }
                let _guard = super::no_grad();
                Tensor::ones(self.shape(), self.dtype(), &self.device())?
            }
        };
        engine::run(self, seed, retain_graph, unit_seed)
    }
}

/// A variable's recorded value, as [`Var::tensor`].
impl From<&Var> for Tensor {
    fn from(var: &Var) -> Tensor {
        var.tensor()
    }
}

/// A variable's recorded value, as [`Var::tensor`].
impl From<Var> for Tensor {
    fn from(var: Var) -> Tensor {
        var.tensor()
    }
}

/// A new variable holding the tensor, as [`Var::new`] (float tensors only).
impl TryFrom<Tensor> for Var {
    type Error = Error;

    fn try_from(value: Tensor) -> Result<Var> {
        Var::new(value)
    }
}

fn check_seed(out: &Tensor, g: &Tensor) -> Result<()> {
    if g.shape() != out.shape() {
        return Err(Error::ShapeMismatch {
            op: "backward",
            lhs: out.shape().to_vec(),
            rhs: g.shape().to_vec(),
            reason: "the output gradient must have the output's shape".into(),
        });
    }
    if g.dtype() != out.dtype() {
        return Err(Error::WrongDType {
            op: "backward",
            dtype: g.dtype(),
            expected: "the output's dtype (convert the gradient with `.to_dtype(..)`)",
        });
    }
    if g.device() != out.device() {
        return Err(Error::Autograd {
            op: "backward",
            reason: format!(
                "the output gradient is on {} but the output on {}; move it with `.to(&device)`",
                g.device(),
                out.device()
            ),
        });
    }
    Ok(())
}
