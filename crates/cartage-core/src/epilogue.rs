//! [`Epilogue`]: the element-wise function a fused [`crate::Kernel::Linear`] applies after its
//! bias (a matmul *epilogue*). The conformance suite holds its f64 reference.

/// The epilogue of a fused linear layer: the activation applied to `x·Wᵀ + b` element by
/// element.
///
/// The layer-level activations of a model (`Relu`, `Tanh`, `Silu` as modules of their own) are a
/// different concept; this enum only names what a matmul can fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
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

/// The former name of [`Epilogue`].
#[deprecated(since = "0.2.0", note = "renamed to `Epilogue` (the fused matmul epilogue)")]
pub type Activation = Epilogue;

impl Epilogue {
    /// Every epilogue.
    pub const ALL: [Epilogue; 4] = [Epilogue::Identity, Epilogue::Relu, Epilogue::Gelu, Epilogue::GeluTanh];

    /// The name used in kernel and test names (`identity`, `relu`, `gelu`, `gelu_tanh`).
    pub const fn name(self) -> &'static str {
        match self {
            Epilogue::Identity => "identity",
            Epilogue::Relu => "relu",
            Epilogue::Gelu => "gelu",
            Epilogue::GeluTanh => "gelu_tanh",
        }
    }
}
