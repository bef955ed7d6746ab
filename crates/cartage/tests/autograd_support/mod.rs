//! The gradient cases shared by the finite-difference check (f64 on the CPU) and the device
//! comparison (each GPU against the CPU on the same inputs): one case per differentiable op or
//! variant, each a function of float inputs with a fixed value profile. Index and mask
//! operands are built inside the case on the inputs' device.

#![allow(dead_code)]

pub mod cases;

use cartage::{DType, Device, Result, Tensor, Var};

/// How an input's values are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Profile {
    /// Roughly normal, in (-2, 2).
    Normal,
    /// In (0.5, 2): logs, roots, divisors, powers.
    Positive,
    /// |x| in (0.3, 2) with random signs: away from kinks at 0.
    AwayFromZero,
}

/// One differentiable computation.
pub struct Case {
    pub name: &'static str,
    pub inputs: Vec<(Vec<usize>, Profile)>,
    pub f: fn(&[Tensor]) -> Result<Tensor>,
    /// Also compared in bf16 on the GPUs (ops whose composed backward is stable in bf16).
    pub bf16: bool,
}

impl Case {
    /// True when the case computes in f32 inside, so f64 finite differences see f32 rounding.
    pub fn through_f32(&self) -> bool {
        self.name.contains("cast")
    }
}

/// Deterministic values for input `which` of case `name`.
pub fn values(name: &str, which: usize, n: usize, profile: Profile) -> Vec<f64> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15 ^ (which as u64).wrapping_mul(0x1000_0000_01B3);
    for b in name.bytes() {
        state = (state ^ b as u64).wrapping_mul(0x1000_0000_01B3);
    }
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let u = next();
            match profile {
                Profile::Normal => 4.0 * u - 2.0,
                Profile::Positive => 0.5 + 1.5 * u,
                Profile::AwayFromZero => {
                    let m = 0.3 + 1.7 * u;
                    if next() < 0.5 { -m } else { m }
                }
            }
        })
        .collect()
}

/// The scalar a case is differentiated through: `Σ out · w` with fixed weights `w`, so every
/// output element matters with a different weight.
pub fn loss_of(out: &Tensor) -> Result<Tensor> {
    let w = values("loss-weights", out.numel(), out.numel(), Profile::Normal);
    let w = Tensor::from_vec(w, out.shape(), &Device::cpu())?.to_device_dtype(&out.device(), out.dtype())?;
    out.mul(&w)?.sum_all()
}

/// The case's inputs as tensors of `dtype` on `device`.
pub fn inputs(case: &Case, dtype: DType, device: &Device) -> Result<Vec<Tensor>> {
    case.inputs
        .iter()
        .enumerate()
        .map(|(i, (shape, profile))| {
            let n = shape.iter().product();
            Tensor::from_vec(values(case.name, i, n, *profile), shape, &Device::cpu())?.to_device_dtype(device, dtype)
        })
        .collect()
}

/// The gradients of the case's loss with respect to every input, as f64 host vectors.
pub fn analytic(case: &Case, dtype: DType, device: &Device) -> Result<Vec<Vec<f64>>> {
    let vars = inputs(case, dtype, device)?
        .into_iter()
        .map(Var::new)
        .collect::<Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(Var::tensor).collect();
    let loss = loss_of(&(case.f)(&tensors)?)?;
    loss.backward()?;
    vars.iter()
        .map(|v| match v.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>(),
            None => Ok(vec![0.0; v.value().numel()]),
        })
        .collect()
}

/// The loss at the given host values (f64, CPU, nothing recorded).
pub fn loss_at(case: &Case, values: &[Vec<f64>]) -> Result<f64> {
    let _guard = cartage::no_grad();
    let tensors = case
        .inputs
        .iter()
        .zip(values)
        .map(|((shape, _), v)| Tensor::from_vec(v.clone(), shape, &Device::cpu()))
        .collect::<Result<Vec<_>>>()?;
    loss_of(&(case.f)(&tensors)?)?.item::<f64>()
}
