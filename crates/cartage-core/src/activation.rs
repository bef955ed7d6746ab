//! [`Activation`]: the element-wise function a fused [`crate::Kernel::Linear`] applies after its
//! bias (a matmul *epilogue*). The conformance suite holds its f64 reference.

/// The activation of a fused linear layer, applied to `x·Wᵀ + b` element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// No activation: the product plus the bias.
    Identity,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// The exact GELU, `x · Φ(x) = x/2 · (1 + erf(x/√2))`, as [`crate::UnaryOp::Gelu`] and
    /// PyTorch's `gelu(approximate="none")`.
    Gelu,
    /// The tanh approximation `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`, as PyTorch's
    /// `gelu(approximate="tanh")` (GPT-2's MLP); cuBLASLt's GELU epilogue computes this one.
    GeluTanh,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 4] = [
        Activation::Identity,
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
    ];

    /// The name used in kernel and test names (`identity`, `relu`, `gelu`, `gelu_tanh`).
    pub const fn name(self) -> &'static str {
        match self {
            Activation::Identity => "identity",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_tanh",
        }
    }
}
