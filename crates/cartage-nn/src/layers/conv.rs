//! [`Conv2d`]: 2-D convolution with a learned kernel.

use cartage::tensor::nn::Conv2dOptions;
use cartage::{DType, Generator, Result, Tensor, Var};

use super::{uniform, wrong_input};
use crate::{Module, Scope};

/// A convolution `[N, C, H, W]` → `[N, O, OH, OW]` with weight `[O, C/groups, kh, kw]` and an
/// optional bias `[O]`, drawn uniformly from `±1/√(C/groups·kh·kw)` (PyTorch's `nn.Conv2d`).
pub struct Conv2d {
    weight: Var,
    bias: Option<Var>,
    options: Conv2dOptions,
    in_channels: usize,
}

impl Conv2d {
    /// A convolution named `scope.weight`/`scope.bias`, in f32.
    pub fn new(
        scope: &Scope,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: Conv2dOptions,
        bias: bool,
        rng: &mut Generator,
    ) -> Result<Conv2d> {
        let device = scope.device();
        let groups = options.groups.max(1);
        let fan_in = (in_channels / groups) * kernel[0] * kernel[1];
        let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
        let shape = [out_channels, in_channels / groups, kernel[0], kernel[1]];
        let weight = scope.var("weight", uniform(&shape, bound, DType::F32, rng, &device)?)?;
        let bias = if bias {
            Some(scope.var("bias", uniform(&[out_channels], bound, DType::F32, rng, &device)?)?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            options,
            in_channels,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let channels = if x.rank() == 4 {
            x.shape()[1]
        } else if x.rank() == 3 {
            x.shape()[0]
        } else {
            0
        };
        if channels != self.in_channels {
            return Err(wrong_input(
                "Conv2d",
                x,
                format!("it needs [N, {c}, H, W] or [{c}, H, W]", c = self.in_channels),
            ));
        }
        let bias = self.bias.as_ref().map(Var::tensor);
        x.conv2d(&self.weight.tensor(), bias.as_ref(), self.options)
    }
}
