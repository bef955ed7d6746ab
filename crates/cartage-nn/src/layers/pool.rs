//! [`MaxPool2d`] and [`AvgPool2d`]: pooling layers (no parameters).

use cartage::{Result, Tensor};

use crate::Module;

/// Max pooling over `kernel` windows moved by `stride`, with `padding`.
pub struct MaxPool2d {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding (with -inf) on each side.
    pub padding: [usize; 2],
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Average pooling; `count_include_pad` as in PyTorch.
pub struct AvgPool2d {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zero padding on each side.
    pub padding: [usize; 2],
    /// Divide by the whole window (true) or by the taps inside the input.
    pub count_include_pad: bool,
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.kernel, self.stride, self.padding, self.count_include_pad)
    }
}
