//! `Tensor::activation_linear`: `activation(x) · Wᵀ + b` recorded by autograd as one node that
//! saves `x` (and `W`) and recomputes `activation(x)` in its backward. The composed
//! `activation` then `linear` would save both `x` (for the activation's derivative) and
//! `activation(x)` (for the weight's gradient); in a transformer's MLP that second tensor is
//! four times the model's width per position, the largest activation a block keeps.

use cartage_core::{Epilogue, Result};

use crate::autograd::{formulas, graph};
use crate::tensor::Tensor;

const NAME: &str = "activation_linear";

impl Tensor {
    /// `activation(self) · weightᵀ + bias` for `self` `[.., in]`, `weight` `[out, in]` and
    /// `bias` `[out]` — the same values as `linear` over the activation's output — recorded by
    /// autograd as one node that keeps only `self` and the weight: its backward recomputes
    /// `activation(self)` for the weight's gradient (`gW = gᵀ·activation(x)`) and multiplies
    /// `g·W` by the activation's derivative at `self` for the input's. The activation's output
    /// is never kept, so a tracked call holds one `[.., in]` tensor fewer until backward than
    /// the composed pair, at the price of one more element-wise pass in backward.
    ///
    /// Under [`crate::autocast`], the input, weight and bias run in the autocast dtype, as in
    /// [`Tensor::linear`]. [`Epilogue::Identity`] is `linear` itself.
    ///
    /// ```
    /// use cartage::{Epilogue, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let h = Tensor::new([[1.0f32, -2.0], [3.0, 4.0]], &cpu)?;
    /// let w = Tensor::new([[1.0f32, 1.0]], &cpu)?;
    /// let y = h.activation_linear(&w, None, Epilogue::Relu)?;
    /// assert_eq!(y.to_vec2::<f32>()?, vec![vec![1.0], vec![7.0]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn activation_linear(&self, weight: &Tensor, bias: Option<&Tensor>, activation: Epilogue) -> Result<Tensor> {
        if activation == Epilogue::Identity {
            return self.linear(weight, bias, activation);
        }
        if crate::autocast::autocast_dtype().is_some() {
            let (x, w) = (crate::autocast::lower(self)?, crate::autocast::lower(weight)?);
            let b = bias.map(crate::autocast::lower).transpose()?;
            let lowered = |t: &Tensor, l: &Tensor| t.dtype() != l.dtype();
            if lowered(self, &x) || lowered(weight, &w) || bias.zip(b.as_ref()).is_some_and(|(b, l)| lowered(b, l)) {
                return x.activation_linear(&w, b.as_ref(), activation);
            }
        }
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let out = {
            // Plain ops: the node below stands for all of them. `linear` checks the operands.
            let _plain = graph::tracking(&inputs).then(crate::autograd::no_grad);
            self.activate(activation)?.linear(weight, bias, Epilogue::Identity)?
        };
        Ok(graph::record(out, NAME, &inputs, |_| {
            formulas::linalg::activation_linear(self, weight, bias, activation)
        }))
    }

    /// `activation(self)`, element-wise, through the recorded ops ([`Epilogue::GeluTanh`] as
    /// PyTorch's tanh approximation, composed): the activation a fused `linear` would apply.
    ///
    /// ```
    /// use cartage::{Device, Epilogue, Tensor};
    /// let x = Tensor::from_slice(&[-1.0f32, 0.0, 2.0], &[3], &Device::cpu())?;
    /// assert_eq!(x.activate(Epilogue::Relu)?.to_vec::<f32>()?, vec![0.0, 0.0, 2.0]);
    /// let tanh_gelu = x.activate(Epilogue::GeluTanh)?.to_vec::<f32>()?;
    /// assert!((tanh_gelu[2] - 1.9546).abs() < 1e-4);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn activate(&self, activation: Epilogue) -> Result<Tensor> {
        match activation {
            Epilogue::Identity => Ok(self.clone()),
            Epilogue::Relu => self.relu(),
            Epilogue::Gelu => self.gelu(),
            Epilogue::GeluTanh => {
                // x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
                let x = self;
                let inner = x
                    .mul(x)?
                    .mul(x)?
                    .mul_scalar(GELU_TANH_CUBIC)?
                    .add(x)?
                    .mul_scalar(gelu_tanh_scale())?;
                inner.tanh()?.add_scalar(1.0)?.mul(x)?.mul_scalar(0.5)
            }
        }
    }

    /// `grad · activation'(self)`: the input gradient of [`Tensor::activate`] at `self`.
    pub(crate) fn activate_backward(&self, grad: &Tensor, activation: Epilogue) -> Result<Tensor> {
        let x = self;
        match activation {
            Epilogue::Identity => Ok(grad.clone()),
            Epilogue::Relu => grad.mul(&x.relu()?.sign()?),
            Epilogue::Gelu => {
                if let Some(gx) = x.gelu_backward_fused(grad)? {
                    return Ok(gx);
                }
                // Φ(x) + x·φ(x), with Φ the normal CDF and φ its density.
                let cdf = x
                    .mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?
                    .erf()?
                    .add_scalar(1.0)?
                    .mul_scalar(0.5)?;
                let pdf = x
                    .square()?
                    .mul_scalar(-0.5)?
                    .exp()?
                    .mul_scalar(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)?;
                grad.mul(&cdf.add(&x.mul(&pdf)?)?)
            }
            Epilogue::GeluTanh => {
                // With u = c(x + a x³) and t = tanh(u): ½(1 + t) + ½x(1 − t²)·c(1 + 3a x²).
                let c = gelu_tanh_scale();
                let x2 = x.square()?;
                let t = x2
                    .mul_scalar(GELU_TANH_CUBIC)?
                    .add_scalar(1.0)?
                    .mul(x)?
                    .mul_scalar(c)?
                    .tanh()?;
                let du = x2.mul_scalar(3.0 * GELU_TANH_CUBIC)?.add_scalar(1.0)?.mul_scalar(c)?;
                let sech2 = t.square()?.neg()?.add_scalar(1.0)?;
                let slope = sech2.mul(&du)?.mul(x)?.add(&t)?.add_scalar(1.0)?.mul_scalar(0.5)?;
                grad.mul(&slope)
            }
        }
    }
}

/// The cubic term's coefficient in PyTorch's tanh GELU.
const GELU_TANH_CUBIC: f64 = 0.044715;

/// √(2/π).
fn gelu_tanh_scale() -> f64 {
    (2.0 / std::f64::consts::PI).sqrt()
}
