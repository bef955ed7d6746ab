//! Initial values drawn from a [`Generator`], as PyTorch's defaults draw them.

use cartage::{DType, Device, Generator, Result, Tensor};

/// Uniform on `[-bound, bound)`: PyTorch's default for linear and convolution weights and
/// biases, with `bound = 1 / sqrt(fan_in)`.
pub fn uniform(shape: &[usize], bound: f64, dtype: DType, rng: &mut Generator, device: &Device) -> Result<Tensor> {
    let _plain = cartage::no_grad();
    Tensor::rand_with(shape, dtype, rng, device)?
        .mul_scalar(2.0 * bound)?
        .sub_scalar(bound)
}

/// Standard normal: PyTorch's default for embeddings.
pub fn normal(shape: &[usize], dtype: DType, rng: &mut Generator, device: &Device) -> Result<Tensor> {
    Tensor::randn_with(shape, dtype, rng, device)
}
