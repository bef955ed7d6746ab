//! `Tensor::linear`: `act(x · Wᵀ + b)`, as one fused `Kernel::Linear` (a matmul with its bias and
//! activation epilogue, cuBLASLt's on CUDA) where the backend lists it for the dtype — recorded
//! by autograd as one node when there is no activation, run plain when nothing requires a
//! gradient — else composed from `matmul`, `add` and the activation, which autograd records.
//! Under autocast all three operands run in the autocast dtype, the bias too, as PyTorch's
//! `linear` does. Both give the same result within the dtype's rounding.

use cartage_core::{Epilogue, Error, Kernel, Op, Result, Site};

use crate::autograd::{formulas, graph};
use crate::tensor::{Tensor, caller, check};

const NAME: &str = "linear";

impl Tensor {
    /// `activation(self · weightᵀ + bias)` for `self` `[.., in]`, `weight` `[out, in]` (PyTorch's
    /// `nn.Linear` layout) and `bias` `[out]`, giving `[.., out]`. Float dtypes; all operands on
    /// one device with one dtype.
    ///
    /// Where the device lists the fused `linear` kernel for the dtype (CUDA: cuBLASLt's bias and
    /// ReLU/GELU epilogues), it runs as one kernel — with autograd too when `activation` is
    /// [`Epilogue::Identity`] (the backward is `g·W`, `gᵀ·x` over the batch-folded rows and the
    /// rows' sum of `g`); otherwise it is composed from `matmul`, `add` and the activation (and
    /// differentiable). Under [`crate::autocast`], the input, weight and bias all run in the
    /// autocast dtype.
    /// [`Epilogue::Gelu`] is the exact GELU of [`Tensor::gelu`]; [`Epilogue::GeluTanh`] is
    /// PyTorch's `gelu(approximate="tanh")`, the one cuBLASLt fuses.
    ///
    /// ```
    /// use cartage::{Epilogue, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::new([[1.0f32, 2.0], [3.0, -4.0]], &cpu)?;
    /// let w = Tensor::new([[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]], &cpu)?;
    /// let b = Tensor::new([0.5f32, 0.0, -1.0], &cpu)?;
    /// let y = x.linear(&w, Some(&b), Epilogue::Relu)?;
    /// assert_eq!(y.to_vec2::<f32>()?, vec![vec![1.5, 2.0, 2.0], vec![3.5, 0.0, 0.0]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>, activation: Epilogue) -> Result<Tensor> {
        let site = caller();
        if crate::autocast::autocast_dtype().is_some() {
            let (x, w) = (crate::autocast::lower(self)?, crate::autocast::lower(weight)?);
            let b = bias.map(crate::autocast::lower).transpose()?;
            let lowered = |t: &Tensor, l: &Tensor| t.dtype != l.dtype;
            if lowered(self, &x) || lowered(weight, &w) || bias.zip(b.as_ref()).is_some_and(|(b, l)| lowered(b, l)) {
                return x.linear(&w, b.as_ref(), activation);
            }
        }
        check::same_device_and_dtype(NAME, self, weight)?;
        check::float(NAME, self.dtype)?;
        if let Some(b) = bias {
            check::same_device_and_dtype(NAME, self, b)?;
        }
        let rank = self.rank();
        let features = if rank == 0 { 0 } else { self.shape()[rank - 1] };
        let shape_error = |lhs: &Tensor, rhs: &Tensor, reason: String| Error::ShapeMismatch {
            op: NAME,
            lhs: lhs.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
            reason,
        };
        if rank == 0 || weight.rank() != 2 || weight.shape()[1] != features {
            return Err(shape_error(
                self,
                weight,
                format!(
                    "the input [.., in] needs a weight [out, in] with in = {features}; check that the weight is not transposed"
                ),
            ));
        }
        let out_features = weight.shape()[0];
        if let Some(b) = bias
            && b.shape() != [out_features]
        {
            return Err(shape_error(
                b,
                weight,
                format!("the bias must be [out] = [{out_features}], one value per output feature"),
            ));
        }
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let tracked = graph::tracking(&inputs);
        // Recorded, the activation's derivative needs the pre-activation values, which a fused
        // epilogue does not keep: the product and bias run fused (one kernel, recorded as a
        // linear) and the activation runs after it (recorded on its own), as PyTorch's `addmm`
        // then `gelu`.
        let fused_activation = if tracked { Epilogue::Identity } else { activation };
        let fused = {
            let _plain = tracked.then(crate::autograd::no_grad);
            self.linear_fused(weight, bias, fused_activation, site)
        };
        match fused {
            Ok(Some(out)) => {
                let out = graph::record(out, NAME, &inputs, |_| formulas::linalg::linear(self, weight, bias));
                return if fused_activation == activation {
                    Ok(out)
                } else {
                    apply_activation(out, activation)
                };
            }
            Ok(None) | Err(Error::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
        self.linear_composed(weight, bias, activation)
    }

    /// One `Kernel::Linear` over the input with its batch dimensions merged; `None` when the
    /// backend does not list the op for the dtype.
    fn linear_fused(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        activation: Epilogue,
        site: Site,
    ) -> Result<Option<Tensor>> {
        if !self.backend().capabilities().supports(Op::Linear, self.dtype) {
            return Ok(None);
        }
        let rank = self.rank();
        let rows: usize = self.shape()[..rank - 1].iter().product();
        let (features, out_features) = (self.shape()[rank - 1], weight.shape()[0]);
        let x = self.reshape_internal(&[rows, features], site)?;
        let out = self.alloc_like(&[rows, out_features], self.dtype, site)?;
        let kernel = Kernel::Linear {
            input: x.as_arg(),
            weight: weight.as_arg(),
            bias: bias.map(Tensor::as_arg),
            activation,
            out: out.as_arg(),
        };
        let mut inputs = vec![&x, weight];
        inputs.extend(bias);
        out.launch(&kernel, &inputs, out.numel())?;
        let mut shape = self.shape()[..rank - 1].to_vec();
        shape.push(out_features);
        out.view_contiguous(&shape).map(Some)
    }

    /// `matmul`, `add` and the activation, each recorded by autograd.
    fn linear_composed(&self, weight: &Tensor, bias: Option<&Tensor>, activation: Epilogue) -> Result<Tensor> {
        let mut y = self.matmul(&weight.t()?)?;
        if let Some(b) = bias {
            y = y.add(b)?;
        }
        apply_activation(y, activation)
    }
}

/// `activation` of `y`, each op recorded by autograd.
fn apply_activation(y: Tensor, activation: Epilogue) -> Result<Tensor> {
    match activation {
        Epilogue::Identity => Ok(y),
        Epilogue::Relu => y.relu(),
        Epilogue::Gelu => y.gelu(),
        Epilogue::GeluTanh => {
            // x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))), PyTorch's tanh approximation.
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let inner = y.mul(&y)?.mul(&y)?.mul_scalar(0.044715)?.add(&y)?.mul_scalar(c)?;
            inner.tanh()?.add_scalar(1.0)?.mul(&y)?.mul_scalar(0.5)
        }
    }
}
