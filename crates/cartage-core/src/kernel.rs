//! The [`Kernel`] vocabulary: one value per operation a backend launches.
//!
//! Adding an op adds a variant here and one match arm per backend, never a trait method. Every
//! tensor operand is a [`TensorArg`]: a buffer, a strided [`Layout`] (broadcast = stride 0) and a
//! dtype. Backends read strided operands in place; none makes a hidden contiguous copy.
//!
//! # Semantics every backend follows (the conformance suite checks them)
//! - f16/bf16 are computed in f32 and rounded once on store.
//! - Integer add/sub/mul/neg/abs wrap. Integer `Div` truncates toward zero; `x / 0` is 0.
//!   Integer `Pow` wraps too: for an exponent ≥ 0 it is repeated multiplication in the dtype's
//!   width, two's complement (`base.wrapping_pow(exp)` for every exponent the dtype holds: `2^31`
//!   is `i32::MIN` in i32, `2^64` is 0 in i64, `x^0` is 1, `0^0` included). With a negative
//!   exponent it is 0 unless the base is 1 (1) or -1 (±1).
//! - Float `Maximum`/`Minimum` propagate NaN: the result is NaN when either operand is NaN
//!   (PyTorch's `maximum`/`minimum`, not IEEE `fmax`); ±inf order as usual.
//! - Bool takes part in `Fill`, `Arange` (non-zero → true), `Cast`, `Copy`, `Where`, `Compare`,
//!   `Maximum`/`Minimum` (or/and), `Reduce` Max/Min/ArgMax/ArgMin, `Gather`, `IndexSelect`.
//! - `Cast` follows Rust `as`: float→int truncates toward zero and saturates, NaN → 0;
//!   anything→bool is `!= 0`; bool→number is 0 or 1.
//! - `Arange`: `out[i] = start + i * step` evaluated in f64, then cast.
//! - `Random`: element `i` (row-major position in `out`) draws from Philox4x32-10 at counter
//!   `offset + i` with key `seed` ([`crate::random`]), so one seed gives the same values on every
//!   backend.
//! - `Reduce`: `out` has the input's rank with reduced dimensions of size 1. Sum, Max and Min
//!   keep the input dtype (integer sums wrap); Mean and LogSumExp are float-only; ArgMax/ArgMin
//!   reduce exactly one dimension, write i64, and pick the first extreme index. Max/Min propagate
//!   NaN. ArgMax/ArgMin count NaN as the extreme (for both), so a slice holding a NaN gives the
//!   index of its first NaN, as PyTorch does. A sum over zero elements is 0, a mean is NaN;
//!   Max/Min/Arg* of zero elements is an error raised by the frontend before launch.
//! - `Softmax` (and log-softmax) over one dimension, float only, max-subtracted; `causal` masks
//!   the elements above the diagonal of the last two dimensions (softmax over the last).
//! - `Matmul`: `lhs` [B, M, K] × `rhs` [B, K, N] → `out` [B, M, N], any strides (batch stride 0
//!   broadcasts), float dtypes only; `out` is contiguous.
//! - `Gather` (torch.gather): `out[i..] = input[.. index[i..] ..]` along `dim`, `out` shaped like
//!   `index`. `IndexSelect`: rows of `input` along `dim` chosen by a 1-D `index`. Indices are i32
//!   or i64; negative or ≥ size → [`crate::Error::IndexOutOfRange`], never garbage and never a
//!   read outside `input`. A kernel reads each index value once and checks that very value
//!   before using it, so another writer of the index tensor cannot make it read out of bounds.
//!   When the error is returned, `out` may be partly written: its contents are unspecified.
//! - `Unary` rounding ops: `Round` rounds half to even (PyTorch, numpy); `Floor`, `Ceil`,
//!   `Round`, `Trunc` are the identity on integers. `Sign` is -1, 0 or 1 (NaN stays NaN, ±0
//!   stays ±0). `Square` wraps on integers. `Softplus` is `log1p(exp(x))`, and `x` itself above
//!   20 (PyTorch's threshold). `Silu` is `x * sigmoid(x)`. `Rsqrt`/`Recip` of 0 are +inf.
//! - `Reduce` Prod keeps the dtype (integers wrap); the product of zero elements is 1.
//! - `Scan` (cumsum, cumprod) along one dim, inclusive, `out` shaped and typed like `input`
//!   (integers wrap; the frontend widens integers to i64 first, as PyTorch does). Float scans
//!   accumulate in f32 (f64 for f64) in order along the dim; a backend may use a parallel scan
//!   whose rounding differs by the usual reassociation error.
//! - `Sort` along one dim is stable: equal keys keep their input order, in both directions.
//!   NaN sorts above +inf (last ascending, first descending), as PyTorch does; -0.0 and +0.0
//!   are equal keys (IEEE comparison), so they keep their input order. `values` holds
//!   the sorted keys, `indices` (i64) their positions along `dim` in `input`.
//! - `Scatter` writes `src` into `out` at positions chosen by `index` along `dim`, in place:
//!   for every position `p` of `index` (shaped like a prefix box of `src`),
//!   `out[p with p[dim] = index[p]] (=|+=) src[p]`. `Assign` with duplicate indices keeps one of
//!   the written values (unspecified which); `Add` sums them all (in an unspecified order for
//!   floats). Indices are checked like `Gather`'s: negative or ≥ `out.shape[dim]` →
//!   [`crate::Error::IndexOutOfRange`], and `out`'s contents are then unspecified.
//!   `index_add` is `Add` with an index broadcast (stride 0) over every dim but `dim`.
//! - `Norm` normalises over the last dim, computing in f32 (f64 for f64): layer norm is
//!   `(x - mean) / sqrt(var + eps) * weight + bias` with the biased variance; RMS norm is
//!   `x / sqrt(mean(x²) + eps) * weight`. `weight` and `bias` are optional, 1-D of the last
//!   dim's size, of the input's dtype.
//! - `CrossEntropy`: `logits` `[N, C]` and integer `target` `[N]` give `out` `[N]` (logits' dtype):
//!   `-(1 - s) * logp[target] - s / C * Σ_c logp[c]` with `logp = log_softmax(logits)` and label
//!   smoothing `s`. Rows whose target equals `ignore_index` give 0; any other target outside
//!   `[0, C)` → [`crate::Error::IndexOutOfRange`] naming dim 1 and size C.
//! - `Conv2d` and `Attention` are *optional fused kernels* ([`Op::optional`]): a backend lists
//!   them only where it has a fused implementation (cuDNN, a flash-attention kernel), and the
//!   frontend composes the same result from other kernels elsewhere.
//!   `Conv2d`: input [N, C, H, W] and weight [O, C/groups, kh, kw] (both any strides) give the
//!   contiguous `out` [N, O, OH, OW], `OH = (H + 2·pad − dil·(kh − 1) − 1) / stride + 1`;
//!   cross-correlation as PyTorch; f32 may use TF32 under [`crate::MatmulPrecision`]'s setting.
//!   `Attention`: q [B, L, E], k [B, S, E], v [B, S, Ev] give the contiguous `out` [B, L, Ev] =
//!   `softmax(scale · q kᵀ) v`, with position (i, j) masked out when `causal` and `j > i`
//!   (top-left aligned, as PyTorch's `is_causal`), and the optional additive `mask`
//!   ([`AttentionMask`]) added to the scaled scores. A row whose keys the mask (with `causal`)
//!   removes is 0; with no key at all (S = 0) a row is NaN (0 / 0; the frontend composes that
//!   case, where PyTorch gives 0). The optional `lse` [B, L] (f32, contiguous) receives each
//!   row's `ln Σ_j exp(scale · q_i·k_j + mask_ij)` over its unmasked keys (−inf for none); a
//!   backend that cannot write it refuses the kernel. The batch may also come as two dimensions
//!   that need not merge into one stride: q [B1, B2, L, E], k [B1, B2, S, E], v [B1, B2, S, Ev]
//!   and `out` [B1, B2, L, Ev], B = B1·B2 for `lse` and the mask (batch entry `b1·B2 + b2`):
//!   the heads of a packed `[B, T, 3, H, E]` projection read in place. Such an `out` may be any
//!   non-overlapping view with a dense last dimension (the heads of a `[B1, L, B2, Ev]` block,
//!   written where the next layer reads them). A backend that reads only one batch stride, or
//!   writes only a contiguous output, refuses such operands with `Unsupported` (the frontend then
//!   copies them into `[B, L, E]`).
//!   `Pool2d`: input [N, C, H, W] (any strides) gives the contiguous `out` [N, C, OH, OW] under a
//!   [`crate::PoolWindow`] (`OH` as `Conv2d`'s; padding at most half the kernel per axis, and
//!   every window must have a tap inside the input, which dilation can break; average pooling
//!   takes dilation 1 only). Max: the
//!   largest tap inside the input, NaN when any of them is NaN; the optional `indices` (i64,
//!   contiguous [N, C, OH, OW]) get the flat index `y·W + x` in the input plane of the first
//!   NaN tap, else of the first largest tap, in row-major window order. Average: the sum of the
//!   taps inside the input divided by `kh·kw` (`count_include_pad`) or by their number,
//!   accumulated in f32 (f64 for f64) and rounded once.
//!   `Pool2dBackward`: from the output gradient `grad` [N, C, OH, OW] (any strides) into the
//!   contiguous input gradient `out` [N, C, H, W], whose shape fixes H and W (`[OH, OW]` must
//!   be the window's output size for them). Max, with the forward's `indices` (i64, `grad`'s
//!   shape, any strides): `out[n, c, p] = Σ grad[n, c, i, j]` over the windows `(i, j)` that
//!   contain tap `p` and whose index is `p`; an index that names no tap of its window adds
//!   nothing (it is compared, never used as an address). Average: `out[n, c, y, x] = Σ
//!   grad[n, c, i, j] / divisor(i, j)` over the windows that contain `(y, x)`. Positions no
//!   window reads get 0; sums are in f32 (f64 for f64), in an unspecified order, rounded once.
//!   `AttentionBackward`: from the same q, k, v, scale and mask and the incoming `grad` dO
//!   [B, L, Ev], with `P = softmax(scale · q kᵀ)` (masked as the forward) and `D_i = Σ_j P_ij ·
//!   (dO_i · v_j)`, the contiguous gradients `grad_v = Pᵀ dO` [B, S, Ev], `grad_q = scale ·
//!   dS k` [B, L, E] and `grad_k = scale · dSᵀ q` [B, S, E] with `dS_ij = P_ij · (dO_i · v_j −
//!   D_i)`; a query row that sees no key (S = 0) has a zero `grad_q`, a key no query sees (L = 0,
//!   or `j ≥ L` when causal) zero `grad_k` and `grad_v`. It computes in f32 (f64 for f64) and
//!   keeps no L × S matrix. The optional `saved` forward output and `lse` let a backend recompute
//!   `P = exp(scale · q kᵀ − lse)` directly (a tiled kernel may round P and dS to a 16-bit dtype
//!   for its products); a backend may ignore them. With a mask and without them, a backend may
//!   run its own forward first and then the saved path (its output rounded to the dtype, as a
//!   saved one is). As the forward's, the operands may carry two
//!   batch dimensions [B1, B2, ..] (q, k, v, `grad`, the saved output and the three gradients
//!   alike; the gradients contiguous, the saved `lse` [B1·B2, L]).
//! - `Linear` is an optional fused kernel too (a matmul with its epilogue, cuBLASLt's bias and
//!   activation): `input` `[M, K]` and `weight` `[N, K]` (both any strides), the optional `bias`
//!   `[N]` (any stride) give the contiguous `out` `[M, N]` = `act(input · weightᵀ + bias)` with
//!   [`crate::Epilogue`]'s function, all of one float dtype. The product accumulates as
//!   `Matmul`'s (f32 may use TF32 under [`crate::MatmulPrecision`]); a backend may round the
//!   product to the dtype before adding the bias and applying the activation, or not.
//! - The backward kernels and the optimizer update are optional fused kernels too; the frontend
//!   composes the same result from other kernels where a backend lists none. They compute in f32
//!   (f64 for f64) and round once on store:
//!   - `SoftmaxBackward`: from the forward's `output` y and the incoming `grad` g along `dim`,
//!     `out = y·(g − Σ g·y)` for softmax and `out = g − exp(y)·Σ g` for log-softmax.
//!   - `NormBackward`: the gradients of `Norm` in one call (weight optional, no bias: it does not
//!     enter them). With `x̂` the normalised row, `ĝ = g·weight`, `r` = 1/std (layer) or 1/rms
//!     (RMS) over the last dim of size D, the input gradient is, for layer norm,
//!     `r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))`, for RMS norm `r·(ĝ − x̂·mean(ĝ·x̂))`. The optional
//!     `grad_weight` `[D]` is `Σ g·x̂` and the optional `grad_bias` `[D]` (layer norm only) `Σ g`,
//!     summed over every row, in f32 (f64 for f64) in an order fixed by the shape (a backend may
//!     sum per-block partials and then the partials, never in an order set by thread timing),
//!     rounded once; with no rows they are 0.
//!   - `GeluBackward`: the input gradient of the exact GELU, from the forward's `input` x and
//!     the incoming `grad` g, element by element: `g·(Φ(x) + x·φ(x))`, with Φ the standard
//!     normal distribution function and φ its density.
//!   - `CrossEntropyBackward`: the logits gradient of `CrossEntropy` for a per-row incoming
//!     `grad` `[N]`: `g[n]·(softmax(logits[n]) − (1 − s)·onehot(target[n]) − s / C)`, a zero row
//!     where the target is `ignore_index`; other targets outside `[0, C)` →
//!     [`crate::Error::IndexOutOfRange`].
//!   - `Conv2dBackwardInput`: the input gradient of `Conv2d` (the adjoint of the convolution in
//!     its input), from `grad` [N, O, OH, OW] and `weight` [O, C/groups, kh, kw] (both any
//!     strides) into the contiguous `out` [N, C, H, W]: `out[n, c, y, x] = Σ grad[n, o, i, j] ·
//!     weight[o, c mod C/g, p, q]` over the output channels `o` of `c`'s group and every
//!     `(i, j, p, q)` with `i·stride + p·dilation − padding = y` (likewise `x`); positions no
//!     window reads get 0. `out`'s shape fixes H and W, which the window alone does not when
//!     stride > 1 (`OH` must be `Conv2d`'s output size for them).
//!   - `Conv2dBackwardWeight`: the weight gradient of `Conv2d`, from `input` [N, C, H, W] and
//!     `grad` [N, O, OH, OW] (both any strides) into the contiguous `out` [O, C/g, kh, kw]:
//!     `out[o, c, p, q] = Σ_{n, i, j} grad[n, o, i, j] · input[n, g·C/g + c, i·stride +
//!     p·dilation − padding, …]` with `g` the group of `o` and the padding read as zeros.
//!     Both conv2d backward kernels may use TF32 for f32 as `Conv2d` does, and the summation
//!     order is unspecified (a backend may accumulate with atomics).
//!   - `Update`: one optimizer step in place on `param` and its state, from `grad`
//!     ([`crate::UpdateRule`] gives the formulas). All operands share one shape and dtype and are
//!     contiguous; the parameter and the state are written, the gradient only read.
//!   - `UpdateMany`: the same step over many parameters at once (a multi-tensor kernel: one
//!     pass, or one launch per group of sets, instead of one per parameter). One rule for every
//!     [`UpdateSet`]; each set obeys `Update`'s rules, all sets share one dtype, and no set's
//!     written operands (parameter, state) overlap any other operand of any set, since the sets
//!     run in parallel ([`crate::Error::InvalidArgument`] naming both sets otherwise). Two sets
//!     may read one gradient. Each element is computed by `Update`'s per-element code, so a
//!     backend gives it the value `Update` gives its set alone.

use crate::allocator::BufferSlice;
use crate::dtype::{DType, Scalar};
use crate::epilogue::Epilogue;
use crate::layout::{Dims, Layout};
use crate::pool::{PoolKind, PoolMode, PoolWindow};
use crate::update_rule::{UpdateKind, UpdateRule};

/// One tensor operand of a kernel.
#[derive(Clone, Debug)]
pub struct TensorArg {
    /// Where the data lives (segment, byte offset of element 0 of the buffer, byte length).
    pub buffer: BufferSlice,
    /// The strided view into `buffer`, in elements.
    pub layout: Layout,
    /// The element type.
    pub dtype: DType,
}

impl TensorArg {
    /// Byte offset of the view's first element inside the segment.
    pub fn byte_offset(&self) -> usize {
        self.buffer.offset() + self.layout.offset() * self.dtype.size_in_bytes()
    }
}

/// The operands of one parameter of a [`Kernel::UpdateMany`] (those of a [`Kernel::Update`]).
#[derive(Clone, Debug)]
pub struct UpdateSet {
    /// The gradient (read).
    pub grad: TensorArg,
    /// The rule's state, read and written (as [`Kernel::Update`]'s).
    pub state: [Option<TensorArg>; 2],
    /// The parameter, read and written.
    pub param: TensorArg,
}

/// The operands of a [`Kernel::AttentionBackward`].
#[derive(Clone, Debug)]
pub struct AttentionBackwardArgs {
    /// The forward's queries [B, L, E] (or [B1, B2, L, E], every operand alike: see the module
    /// docs of [`Kernel`]).
    pub q: TensorArg,
    /// The forward's keys [B, S, E].
    pub k: TensorArg,
    /// The forward's values [B, S, Ev].
    pub v: TensorArg,
    /// The gradient reaching the forward's output [B, L, Ev].
    pub grad: TensorArg,
    /// The forward's scale.
    pub scale: f64,
    /// The forward's causal mask.
    pub causal: bool,
    /// The forward's additive mask, if it had one (a backend that cannot apply it refuses with
    /// `Unsupported`). Its own gradient is not computed here: the frontend composes the
    /// backward when the mask needs one.
    pub mask: Option<AttentionMask>,
    /// The query gradient [B, L, E], contiguous.
    pub grad_q: TensorArg,
    /// The key gradient [B, S, E], contiguous.
    pub grad_k: TensorArg,
    /// The value gradient [B, S, Ev], contiguous.
    pub grad_v: TensorArg,
    /// The forward's output [B, L, Ev] and its per-row log-sum-exp [B, L] (f32, contiguous),
    /// both from one [`Kernel::Attention`] with `lse` on these q, k and v: with them a backend
    /// may recompute the probabilities tile by tile (`P = exp(scale · q kᵀ − lse)`) instead of
    /// from scratch. A backend may ignore them; it may refuse with `Unsupported` only where it
    /// would refuse without them too.
    pub saved: Option<AttentionSaved>,
}

/// An additive mask on attention scores: `score_ij = scale · q_i·k_j + mask[b / inner, b % inner,
/// i, j]` for batch entry `b` of q's merged batch `[B, L, E]`. `values` is `[outer, inner, L, S]`
/// with `outer · inner = B`, in q's dtype, any strides (0 along a broadcast dimension: a
/// `[batch, 1, 1, S]` padding mask over `[batch, heads, L, S]` scores has inner = heads and
/// strides `(S, 0, 0, 1)`). −inf removes a key (a boolean mask is turned into 0 / −inf by the
/// frontend); a row whose scores are all −inf sees no key. Applied together with `causal`.
#[derive(Clone, Debug)]
pub struct AttentionMask {
    /// The mask `[outer, inner, L, S]`.
    pub values: TensorArg,
}

impl AttentionMask {
    /// `(outer, inner)`: how the batch entry `b` splits to index the mask.
    pub fn batch_split(&self) -> (usize, usize) {
        let shape = self.values.layout.shape();
        (shape[0], shape[1])
    }
}

/// What a [`Kernel::Attention`] run leaves for its backward ([`AttentionBackwardArgs::saved`]).
#[derive(Clone, Debug)]
pub struct AttentionSaved {
    /// The forward's output [B, L, Ev] (any strides).
    pub out: TensorArg,
    /// The forward's per-row natural log-sum-exp of the scaled, masked scores [B, L], f32,
    /// contiguous.
    pub lse: TensorArg,
}

/// The operands of a [`Kernel::NormBackward`].
#[derive(Clone, Debug)]
pub struct NormBackwardArgs {
    /// Which normalisation.
    pub kind: NormKind,
    /// The forward's input, rank ≥ 1.
    pub input: TensorArg,
    /// The forward's scale, if any (1-D of the last dim's size, the input's dtype).
    pub weight: Option<TensorArg>,
    /// The gradient reaching the forward's output (shape and dtype of `input`).
    pub grad: TensorArg,
    /// The forward's eps.
    pub eps: f64,
    /// The input gradient (shape and dtype of `input`).
    pub grad_input: TensorArg,
    /// The weight gradient `Σ g·x̂` over the rows, if wanted (1-D of the last dim's size, the
    /// input's dtype); it does not need a `weight`.
    pub grad_weight: Option<TensorArg>,
    /// The bias gradient `Σ g` over the rows, if wanted (layer norm only; 1-D of the last dim's
    /// size, the input's dtype).
    pub grad_bias: Option<TensorArg>,
}

/// Element-wise functions of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Relu,
    Tanh,
    Sigmoid,
    /// The exact (erf) form: `x * 0.5 * (1 + erf(x / sqrt 2))`.
    Gelu,
    Sin,
    Cos,
    Floor,
    Ceil,
    /// Half to even.
    Round,
    Trunc,
    Sign,
    Rsqrt,
    Recip,
    Square,
    Erf,
    Log1p,
    Expm1,
    /// `x * sigmoid(x)`.
    Silu,
    /// `log1p(exp(x))`, `x` above 20.
    Softplus,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 24] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Sign,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Square,
        UnaryOp::Erf,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Silu,
        UnaryOp::Softplus,
    ];

    /// Lower-case name (kernel names are `<op>_<dtype>`).
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Relu => "relu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Trunc => "trunc",
            UnaryOp::Sign => "sign",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Square => "square",
            UnaryOp::Erf => "erf",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Silu => "silu",
            UnaryOp::Softplus => "softplus",
        }
    }

    /// True for ops defined on integers too (neg, abs, relu, sign, square, and the rounding ops,
    /// which are the identity there).
    pub const fn integer_ok(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Trunc
        )
    }

    /// True for the transcendental functions (Vulkan has no f64 versions of them).
    pub const fn transcendental(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Gelu
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::Log1p
                | UnaryOp::Expm1
                | UnaryOp::Silu
                | UnaryOp::Softplus
        )
    }
}

/// Element-wise functions of two operands (same dtype; the output has that dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

/// Comparisons; the output is bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    /// Every comparison.
    pub const ALL: [CompareOp; 6] = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// Reductions over chosen dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    ArgMax,
    ArgMin,
    LogSumExp,
    Prod,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
        ReduceOp::LogSumExp,
        ReduceOp::Prod,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::LogSumExp => "logsumexp",
            ReduceOp::Prod => "prod",
        }
    }

    /// The dtype of the result for an input of `dtype`.
    pub const fn output_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
            _ => dtype,
        }
    }
}

/// Inclusive scans along one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ScanOp {
    Sum,
    Prod,
}

impl ScanOp {
    /// Every scan.
    pub const ALL: [ScanOp; 2] = [ScanOp::Sum, ScanOp::Prod];

    /// Lower-case name (`cumsum`, `cumprod`).
    pub const fn name(self) -> &'static str {
        match self {
            ScanOp::Sum => "cumsum",
            ScanOp::Prod => "cumprod",
        }
    }
}

/// How [`Kernel::Scatter`] combines a source value with the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterMode {
    /// `out[..] = src[..]`.
    Assign,
    /// `out[..] += src[..]`.
    Add,
}

impl ScatterMode {
    /// Every mode.
    pub const ALL: [ScatterMode; 2] = [ScatterMode::Assign, ScatterMode::Add];

    /// Lower-case name (`scatter`, `scatter_add`).
    pub const fn name(self) -> &'static str {
        match self {
            ScatterMode::Assign => "scatter",
            ScatterMode::Add => "scatter_add",
        }
    }
}

/// Which normalisation a [`Kernel::Norm`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * weight + bias`.
    Layer,
    /// `x / sqrt(mean(x²) + eps) * weight`.
    Rms,
}

impl NormKind {
    /// Lower-case name (`layer_norm`, `rms_norm`).
    pub const fn name(self) -> &'static str {
        match self {
            NormKind::Layer => "layer_norm",
            NormKind::Rms => "rms_norm",
        }
    }
}

/// The distribution of a `Random` kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound (inclusive).
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// Normal with `mean` and standard deviation `std` (Box–Muller).
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
}

/// One operation, with its operands, ready to launch on a backend.
#[derive(Clone, Debug)]
pub enum Kernel {
    /// Write `value` to every element of `out`.
    Fill {
        /// Destination.
        out: TensorArg,
        /// The value (cast to `out.dtype`).
        value: Scalar,
    },
    /// `out[i] = start + i * step`.
    Arange {
        /// Destination.
        out: TensorArg,
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// Counter-based random numbers (float dtypes).
    Random {
        /// Destination.
        out: TensorArg,
        /// Distribution and its parameters.
        distribution: Distribution,
        /// Philox key.
        seed: u64,
        /// Philox counter of element 0.
        offset: u64,
    },
    /// Convert dtypes (`input.dtype` → `out.dtype`), same shape.
    Cast {
        /// Source.
        input: TensorArg,
        /// Destination.
        out: TensorArg,
    },
    /// Strided copy, same dtype and shape (makes views contiguous, writes into views).
    Copy {
        /// Source.
        input: TensorArg,
        /// Destination.
        out: TensorArg,
    },
    /// Element-wise unary function.
    Unary {
        /// The function.
        op: UnaryOp,
        /// Source.
        input: TensorArg,
        /// Destination (same dtype and shape).
        out: TensorArg,
    },
    /// Element-wise binary function; `lhs`/`rhs` layouts are already broadcast to `out`'s shape.
    Binary {
        /// The function.
        op: BinaryOp,
        /// First operand.
        lhs: TensorArg,
        /// Second operand.
        rhs: TensorArg,
        /// Destination.
        out: TensorArg,
    },
    /// Element-wise comparison to bool; operands broadcast to `out`'s shape.
    Compare {
        /// The comparison.
        op: CompareOp,
        /// First operand.
        lhs: TensorArg,
        /// Second operand.
        rhs: TensorArg,
        /// Destination (bool).
        out: TensorArg,
    },
    /// `out = cond ? on_true : on_false`; all broadcast to `out`'s shape; `cond` is bool.
    Where {
        /// Condition (bool).
        cond: TensorArg,
        /// Taken where `cond` is true.
        on_true: TensorArg,
        /// Taken where `cond` is false.
        on_false: TensorArg,
        /// Destination.
        out: TensorArg,
    },
    /// Reduce `dims` of `input` (sorted, distinct); `out` keeps them with size 1.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Source.
        input: TensorArg,
        /// Dimensions to reduce.
        dims: Dims,
        /// Destination.
        out: TensorArg,
    },
    /// Softmax (or log-softmax) along `dim`.
    Softmax {
        /// Source.
        input: TensorArg,
        /// The dimension.
        dim: usize,
        /// Log-softmax when true.
        log: bool,
        /// A causal mask: `dim` is the last of at least two, and of the last two `[.., L, S]`
        /// element `(i, j)` with `j > i` takes no part: its output is 0 (−inf for log-softmax)
        /// and the row's other elements are normalised without it, as if the input there were
        /// −inf (attention's `is_causal`, aligned to the top left).
        causal: bool,
        /// Destination (same shape and dtype).
        out: TensorArg,
    },
    /// Batched matrix product `[B, M, K] × [B, K, N] → [B, M, N]`.
    Matmul {
        /// Left operand, rank 3.
        lhs: TensorArg,
        /// Right operand, rank 3.
        rhs: TensorArg,
        /// Destination, rank 3, contiguous.
        out: TensorArg,
    },
    /// torch.gather along `dim`.
    Gather {
        /// Source.
        input: TensorArg,
        /// Indices (i32/i64), same rank as `input`.
        index: TensorArg,
        /// The gathered dimension.
        dim: usize,
        /// Destination, shaped like `index`.
        out: TensorArg,
    },
    /// Select entries of `input` along `dim` by a 1-D `index`.
    IndexSelect {
        /// Source.
        input: TensorArg,
        /// Indices (i32/i64), rank 1.
        index: TensorArg,
        /// The indexed dimension.
        dim: usize,
        /// Destination.
        out: TensorArg,
    },
    /// Inclusive scan (cumsum, cumprod) along `dim`.
    Scan {
        /// The scan.
        op: ScanOp,
        /// Source.
        input: TensorArg,
        /// The scanned dimension.
        dim: usize,
        /// Destination (same shape and dtype).
        out: TensorArg,
    },
    /// Stable sort along `dim`.
    Sort {
        /// Source.
        input: TensorArg,
        /// The sorted dimension.
        dim: usize,
        /// Largest first when true.
        descending: bool,
        /// Sorted values (shape and dtype of `input`).
        values: TensorArg,
        /// Positions along `dim` in `input` (i64, shape of `input`).
        indices: TensorArg,
    },
    /// Scatter `src` into `out` (in place) at `index` along `dim`.
    Scatter {
        /// Assign or add.
        mode: ScatterMode,
        /// Values to write (dtype of `out`).
        src: TensorArg,
        /// Indices (i32/i64), rank of `src`, each dim ≤ `src`'s (and ≤ `out`'s but `dim`).
        index: TensorArg,
        /// The scattered dimension.
        dim: usize,
        /// Destination, read and written.
        out: TensorArg,
    },
    /// Layer norm or RMS norm over the last dimension.
    Norm {
        /// Which normalisation.
        kind: NormKind,
        /// Source, rank ≥ 1.
        input: TensorArg,
        /// Optional scale, 1-D of the last dim's size.
        weight: Option<TensorArg>,
        /// Optional shift (layer norm only), 1-D of the last dim's size.
        bias: Option<TensorArg>,
        /// Added to the variance (mean square) before the square root.
        eps: f64,
        /// Destination (same shape and dtype).
        out: TensorArg,
    },
    /// 2-D convolution (an optional fused kernel; see the module docs).
    Conv2d {
        /// Input [N, C, H, W].
        input: TensorArg,
        /// Filters [O, C/groups, kh, kw].
        weight: TensorArg,
        /// Step of the window, (height, width).
        stride: [usize; 2],
        /// Zeros added on each side, (height, width).
        padding: [usize; 2],
        /// Spacing of the window's taps, (height, width).
        dilation: [usize; 2],
        /// Channel groups (C and O divisible by it).
        groups: usize,
        /// Destination [N, O, OH, OW], contiguous.
        out: TensorArg,
    },
    /// The input gradient of [`Kernel::Conv2d`] (an optional fused kernel; see the module docs).
    Conv2dBackwardInput {
        /// The gradient reaching the forward's output [N, O, OH, OW].
        grad: TensorArg,
        /// The forward's filters [O, C/groups, kh, kw].
        weight: TensorArg,
        /// The forward's stride, (height, width).
        stride: [usize; 2],
        /// The forward's padding, (height, width).
        padding: [usize; 2],
        /// The forward's dilation, (height, width).
        dilation: [usize; 2],
        /// The forward's channel groups.
        groups: usize,
        /// The input gradient [N, C, H, W] (the forward input's shape), contiguous.
        out: TensorArg,
    },
    /// The weight gradient of [`Kernel::Conv2d`] (an optional fused kernel; see the module docs).
    Conv2dBackwardWeight {
        /// The forward's input [N, C, H, W].
        input: TensorArg,
        /// The gradient reaching the forward's output [N, O, OH, OW].
        grad: TensorArg,
        /// The forward's stride, (height, width).
        stride: [usize; 2],
        /// The forward's padding, (height, width).
        padding: [usize; 2],
        /// The forward's dilation, (height, width).
        dilation: [usize; 2],
        /// The forward's channel groups.
        groups: usize,
        /// The weight gradient [O, C/groups, kh, kw] (the forward weight's shape), contiguous.
        out: TensorArg,
    },
    /// Fused scaled dot-product attention (an optional fused kernel; see the module docs).
    Attention {
        /// Queries [B, L, E] (or [B1, B2, L, E]: see the module docs).
        q: TensorArg,
        /// Keys [B, S, E] (or [B1, B2, S, E]).
        k: TensorArg,
        /// Values [B, S, Ev] (or [B1, B2, S, Ev]).
        v: TensorArg,
        /// Multiplies q·kᵀ before the softmax.
        scale: f64,
        /// Mask out keys after the query's position.
        causal: bool,
        /// Optional additive mask on the scaled scores (see [`AttentionMask`]; boxed, so that
        /// every kernel stays small). A backend that cannot apply it refuses the kernel with
        /// `Unsupported`.
        mask: Option<Box<AttentionMask>>,
        /// Destination [B, L, Ev], contiguous (or [B1, B2, L, Ev], contiguous or a
        /// non-overlapping view with a dense last dimension). A row whose keys the mask removes
        /// is 0.
        out: TensorArg,
        /// Optional destination [B, L] (f32, contiguous) for each query row's natural
        /// log-sum-exp `ln Σ_j exp(scale · q_i·k_j + mask_ij)` over its unmasked keys (−inf for
        /// a row that sees none), for the backward ([`AttentionSaved`]). A backend that cannot
        /// write it refuses the kernel with `Unsupported`.
        lse: Option<TensorArg>,
    },
    /// `act(input · weightᵀ + bias)`: a matmul with its epilogue (an optional fused kernel; see
    /// the module docs).
    Linear {
        /// Input `[M, K]`.
        input: TensorArg,
        /// Weight `[N, K]` (PyTorch's `nn.Linear` layout).
        weight: TensorArg,
        /// Optional bias `[N]`.
        bias: Option<TensorArg>,
        /// Applied after the bias.
        activation: Epilogue,
        /// Destination `[M, N]`, contiguous.
        out: TensorArg,
    },
    /// The gradients of [`Kernel::Attention`] with respect to q, k and v (an optional fused
    /// kernel; see the module docs). Boxed: its seven operands would make every kernel value
    /// half as large again.
    AttentionBackward(Box<AttentionBackwardArgs>),
    /// 2-D max or average pooling (an optional fused kernel; see the module docs).
    Pool2d {
        /// Max or average (and the average's divisor).
        mode: PoolMode,
        /// Taps, stride, padding and dilation.
        window: PoolWindow,
        /// Input [N, C, H, W].
        input: TensorArg,
        /// Destination [N, C, OH, OW], contiguous.
        out: TensorArg,
        /// Max only, optional: where each maximum was (i64, contiguous [N, C, OH, OW], flat
        /// `y·W + x` in the input plane).
        indices: Option<TensorArg>,
    },
    /// The input gradient of [`Kernel::Pool2d`] (an optional fused kernel; see the module docs).
    Pool2dBackward {
        /// The forward's mode.
        mode: PoolMode,
        /// The forward's window.
        window: PoolWindow,
        /// The gradient reaching the forward's output [N, C, OH, OW].
        grad: TensorArg,
        /// Max only, required: the forward's indices (i64, `grad`'s shape).
        indices: Option<TensorArg>,
        /// The input gradient [N, C, H, W] (the forward input's shape), contiguous.
        out: TensorArg,
    },
    /// Per-row cross-entropy of `logits` `[N, C]` against integer `target` `[N]`.
    CrossEntropy {
        /// Unnormalised scores [N, C] (float).
        logits: TensorArg,
        /// Class indices `[N]` (i32/i64).
        target: TensorArg,
        /// Rows with this target give 0.
        ignore_index: i64,
        /// Label smoothing in `[0, 1]`.
        label_smoothing: f64,
        /// Per-row loss `[N]`, logits' dtype.
        out: TensorArg,
    },
    /// The input gradient of softmax (or log-softmax) along `dim`, from the forward's output.
    SoftmaxBackward {
        /// The forward's output (softmax or log-softmax values).
        output: TensorArg,
        /// The gradient reaching the output (same shape and dtype).
        grad: TensorArg,
        /// The dimension.
        dim: usize,
        /// The forward was log-softmax.
        log: bool,
        /// The input gradient (same shape and dtype).
        out: TensorArg,
    },
    /// The input gradient of the exact GELU, element by element.
    GeluBackward {
        /// The forward's input.
        input: TensorArg,
        /// The gradient reaching the output (same shape and dtype).
        grad: TensorArg,
        /// The input gradient (same shape and dtype).
        out: TensorArg,
    },
    /// The gradients of `Norm` over the last dimension: the input's, and optionally the weight's
    /// and the bias's, in one call (see the module docs). Boxed: its six operands would make
    /// every kernel value half as large again.
    NormBackward(Box<NormBackwardArgs>),
    /// The logits gradient of `CrossEntropy`.
    CrossEntropyBackward {
        /// The forward's logits [N, C].
        logits: TensorArg,
        /// The forward's class indices `[N]` (i32/i64).
        target: TensorArg,
        /// The gradient reaching each row's loss `[N]`, logits' dtype.
        grad: TensorArg,
        /// Rows with this target get a zero gradient.
        ignore_index: i64,
        /// The forward's label smoothing in `[0, 1]`.
        label_smoothing: f64,
        /// The logits gradient [N, C].
        out: TensorArg,
    },
    /// One optimizer step, in place (see [`UpdateRule`]).
    Update {
        /// The update and its hyperparameters.
        rule: UpdateRule,
        /// The gradient (read).
        grad: TensorArg,
        /// The rule's state, read and written: `[exp_avg, exp_avg_sq]` for Adam, `[momentum
        /// buffer, None]` for SGD with momentum, none for plain SGD.
        state: [Option<TensorArg>; 2],
        /// The parameter, read and written.
        param: TensorArg,
    },
    /// One optimizer step over many parameters in one multi-tensor kernel (see [`UpdateRule`]).
    UpdateMany {
        /// The update and its hyperparameters, shared by every set.
        rule: UpdateRule,
        /// One set of operands per parameter.
        sets: Vec<UpdateSet>,
    },
}

impl Kernel {
    /// The op this kernel performs, for capability checks and error messages.
    #[inline]
    pub fn op(&self) -> Op {
        match self {
            Kernel::Fill { .. } => Op::Fill,
            Kernel::Arange { .. } => Op::Arange,
            Kernel::Random {
                distribution: Distribution::Uniform { .. },
                ..
            } => Op::RandomUniform,
            Kernel::Random {
                distribution: Distribution::Normal { .. },
                ..
            } => Op::RandomNormal,
            Kernel::Cast { out, .. } => Op::Cast(out.dtype),
            Kernel::Copy { .. } => Op::Copy,
            Kernel::Unary { op, .. } => Op::Unary(*op),
            Kernel::Binary { op, .. } => Op::Binary(*op),
            Kernel::Compare { op, .. } => Op::Compare(*op),
            Kernel::Where { .. } => Op::Where,
            Kernel::Reduce { op, .. } => Op::Reduce(*op),
            Kernel::Softmax { log: false, .. } => Op::Softmax,
            Kernel::Softmax { log: true, .. } => Op::LogSoftmax,
            Kernel::Matmul { .. } => Op::Matmul,
            Kernel::Gather { .. } => Op::Gather,
            Kernel::IndexSelect { .. } => Op::IndexSelect,
            Kernel::Scan { op, .. } => Op::Scan(*op),
            Kernel::Sort { .. } => Op::Sort,
            Kernel::Scatter { mode, .. } => Op::Scatter(*mode),
            Kernel::Norm { kind, .. } => Op::Norm(*kind),
            Kernel::CrossEntropy { .. } => Op::CrossEntropy,
            Kernel::Conv2d { .. } => Op::Conv2d,
            Kernel::Conv2dBackwardInput { .. } => Op::Conv2dBackwardInput,
            Kernel::Conv2dBackwardWeight { .. } => Op::Conv2dBackwardWeight,
            Kernel::Attention { .. } => Op::Attention,
            Kernel::Linear { .. } => Op::Linear,
            Kernel::AttentionBackward(_) => Op::AttentionBackward,
            Kernel::Pool2d { mode, .. } => Op::Pool2d(mode.kind()),
            Kernel::Pool2dBackward { mode, .. } => Op::Pool2dBackward(mode.kind()),
            Kernel::SoftmaxBackward { log: false, .. } => Op::SoftmaxBackward,
            Kernel::SoftmaxBackward { log: true, .. } => Op::LogSoftmaxBackward,
            Kernel::GeluBackward { .. } => Op::GeluBackward,
            Kernel::NormBackward(a) => Op::NormBackward(a.kind),
            Kernel::CrossEntropyBackward { .. } => Op::CrossEntropyBackward,
            Kernel::Update { rule, .. } => Op::Update(rule.kind()),
            Kernel::UpdateMany { rule, .. } => Op::UpdateMany(rule.kind()),
        }
    }

    /// The dtype that selects the kernel (the input's for casts, reductions and selections; the
    /// compared operands' for comparisons; the values' for `Where`).
    #[inline]
    pub fn dtype(&self) -> DType {
        match self {
            Kernel::Fill { out, .. } | Kernel::Arange { out, .. } | Kernel::Random { out, .. } => out.dtype,
            Kernel::Cast { input, .. }
            | Kernel::Copy { input, .. }
            | Kernel::Unary { input, .. }
            | Kernel::Reduce { input, .. }
            | Kernel::Softmax { input, .. }
            | Kernel::Gather { input, .. }
            | Kernel::IndexSelect { input, .. }
            | Kernel::Scan { input, .. }
            | Kernel::Sort { input, .. }
            | Kernel::Norm { input, .. } => input.dtype,
            Kernel::Scatter { src, .. } => src.dtype,
            Kernel::CrossEntropy { logits, .. } => logits.dtype,
            Kernel::Conv2d { input, .. } => input.dtype,
            Kernel::Conv2dBackwardInput { grad, .. } => grad.dtype,
            Kernel::Conv2dBackwardWeight { input, .. } => input.dtype,
            Kernel::Attention { q, .. } => q.dtype,
            Kernel::Linear { input, .. } => input.dtype,
            Kernel::AttentionBackward(a) => a.q.dtype,
            Kernel::Pool2d { input, .. } => input.dtype,
            Kernel::Pool2dBackward { grad, .. } => grad.dtype,
            Kernel::SoftmaxBackward { output, .. } => output.dtype,
            Kernel::NormBackward(a) => a.input.dtype,
            Kernel::GeluBackward { input, .. } => input.dtype,
            Kernel::CrossEntropyBackward { logits, .. } => logits.dtype,
            Kernel::Update { param, .. } => param.dtype,
            // No set at all is refused by `validate`; any float dtype names the op meanwhile.
            Kernel::UpdateMany { sets, .. } => sets.first().map_or(DType::F32, |s| s.param.dtype),
            Kernel::Binary { lhs, .. } | Kernel::Compare { lhs, .. } | Kernel::Matmul { lhs, .. } => lhs.dtype,
            Kernel::Where { on_true, .. } => on_true.dtype,
        }
    }

    /// Every operand, outputs last (backends use it for bounds checks and buffer binding);
    /// `UpdateMany` lists each set's operands in turn (gradient, state, parameter).
    pub fn operands(&self) -> Vec<&TensorArg> {
        self.operand_slots().into_iter().flatten().collect()
    }

    /// The operands in order, outputs last, without allocating (the launch path runs this for
    /// every kernel, so it must stay cheap for tiny ops): four slots for every kernel but the
    /// attention and norm-backward kernels (ten) and `UpdateMany`, which has four per set.
    #[inline]
    pub fn operand_slots(&self) -> OperandSlots<'_> {
        match self {
            Kernel::UpdateMany { sets, .. } => OperandSlots(OperandIter::Sets { sets, next: 0 }),
            Kernel::AttentionBackward(a) => OperandSlots(OperandIter::Ten(
                [
                    Some(&a.q),
                    Some(&a.k),
                    Some(&a.v),
                    Some(&a.grad),
                    a.saved.as_ref().map(|s| &s.out),
                    a.saved.as_ref().map(|s| &s.lse),
                    a.mask.as_ref().map(|m| &m.values),
                    Some(&a.grad_q),
                    Some(&a.grad_k),
                    Some(&a.grad_v),
                ]
                .into_iter(),
            )),
            Kernel::Attention {
                q,
                k,
                v,
                mask,
                out,
                lse,
                ..
            } => OperandSlots(OperandIter::Ten(
                [
                    Some(q),
                    Some(k),
                    Some(v),
                    mask.as_ref().map(|m| &m.values),
                    Some(out),
                    lse.as_ref(),
                    None,
                    None,
                    None,
                    None,
                ]
                .into_iter(),
            )),
            Kernel::NormBackward(a) => OperandSlots(OperandIter::Ten(
                [
                    Some(&a.input),
                    a.weight.as_ref(),
                    Some(&a.grad),
                    Some(&a.grad_input),
                    a.grad_weight.as_ref(),
                    a.grad_bias.as_ref(),
                    None,
                    None,
                    None,
                    None,
                ]
                .into_iter(),
            )),
            _ => OperandSlots(OperandIter::Fixed(self.fixed_operand_slots().into_iter())),
        }
    }

    /// The four operand slots of every kernel but `UpdateMany` and the boxed ones (which have
    /// none here).
    #[inline]
    fn fixed_operand_slots(&self) -> [Option<&TensorArg>; 4] {
        match self {
            Kernel::UpdateMany { .. }
            | Kernel::AttentionBackward(_)
            | Kernel::Attention { .. }
            | Kernel::NormBackward(_) => [None; 4],
            Kernel::Fill { out, .. } | Kernel::Arange { out, .. } | Kernel::Random { out, .. } => {
                [Some(out), None, None, None]
            }
            Kernel::Cast { input, out }
            | Kernel::Copy { input, out }
            | Kernel::Unary { input, out, .. }
            | Kernel::Reduce { input, out, .. }
            | Kernel::Softmax { input, out, .. }
            | Kernel::Scan { input, out, .. } => [Some(input), Some(out), None, None],
            Kernel::Sort {
                input, values, indices, ..
            } => [Some(input), Some(values), Some(indices), None],
            Kernel::Scatter { src, index, out, .. } => [Some(src), Some(index), Some(out), None],
            Kernel::Norm {
                input,
                weight,
                bias,
                out,
                ..
            } => [Some(input), weight.as_ref(), bias.as_ref(), Some(out)],
            Kernel::CrossEntropy {
                logits, target, out, ..
            } => [Some(logits), Some(target), Some(out), None],
            Kernel::Conv2d { input, weight, out, .. } => [Some(input), Some(weight), Some(out), None],
            Kernel::Conv2dBackwardInput { grad, weight, out, .. } => [Some(grad), Some(weight), Some(out), None],
            Kernel::Conv2dBackwardWeight { input, grad, out, .. } => [Some(input), Some(grad), Some(out), None],
            Kernel::Linear {
                input,
                weight,
                bias,
                out,
                ..
            } => [Some(input), Some(weight), bias.as_ref(), Some(out)],
            Kernel::Pool2d {
                input, out, indices, ..
            } => [Some(input), Some(out), indices.as_ref(), None],
            Kernel::Pool2dBackward { grad, indices, out, .. } => [Some(grad), indices.as_ref(), Some(out), None],
            Kernel::SoftmaxBackward { output, grad, out, .. } => [Some(output), Some(grad), Some(out), None],
            Kernel::CrossEntropyBackward {
                logits,
                target,
                grad,
                out,
                ..
            } => [Some(logits), Some(target), Some(grad), Some(out)],
            Kernel::GeluBackward { input, grad, out } => [Some(input), Some(grad), Some(out), None],
            Kernel::Update { grad, state, param, .. } => {
                [Some(grad), state[0].as_ref(), state[1].as_ref(), Some(param)]
            }
            Kernel::Binary { lhs, rhs, out, .. }
            | Kernel::Compare { lhs, rhs, out, .. }
            | Kernel::Matmul { lhs, rhs, out } => [Some(lhs), Some(rhs), Some(out), None],
            Kernel::Where {
                cond,
                on_true,
                on_false,
                out,
            } => [Some(cond), Some(on_true), Some(on_false), Some(out)],
            Kernel::Gather { input, index, out, .. } | Kernel::IndexSelect { input, index, out, .. } => {
                [Some(input), Some(index), Some(out), None]
            }
        }
    }

    /// Check that every operand's layout fits inside its buffer; a backend calls this before
    /// touching memory so that a malformed kernel is an error, never an out-of-bounds access.
    #[inline]
    pub fn check_bounds(&self) -> crate::Result<()> {
        for arg in self.operand_slots().into_iter().flatten() {
            let extent = arg.layout.checked_extent().ok_or_else(|| crate::Error::SizeOverflow {
                shape: arg.layout.shape().to_vec(),
                dtype: arg.dtype,
            })?;
            let needed = extent.saturating_mul(arg.dtype.size_in_bytes());
            if needed > arg.buffer.len() {
                return Err(crate::Error::invalid(
                    "launch",
                    format!(
                        "`{}` operand of shape {:?} needs {needed} bytes but its buffer holds {}",
                        self.op().name(),
                        arg.layout.shape(),
                        arg.buffer.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The operand slots of a [`Kernel`] ([`Kernel::operand_slots`]), iterated with `into_iter`:
/// `None` for an absent optional operand.
#[derive(Clone, Debug)]
pub struct OperandSlots<'a>(OperandIter<'a>);

impl<'a> IntoIterator for OperandSlots<'a> {
    type Item = Option<&'a TensorArg>;
    type IntoIter = OperandIter<'a>;

    #[inline]
    fn into_iter(self) -> OperandIter<'a> {
        self.0
    }
}

/// The iterator over [`OperandSlots`].
#[derive(Clone, Debug)]
pub enum OperandIter<'a> {
    /// The four slots of a kernel with a fixed operand list.
    Fixed(std::array::IntoIter<Option<&'a TensorArg>, 4>),
    /// The ten slots of a kernel with many operands: [`Kernel::AttentionBackward`] (q, k, v,
    /// grad, the saved output and log-sum-exp, the mask, then the gradients),
    /// [`Kernel::Attention`] (q, k, v, the mask, out, lse, then four empty slots) or
    /// [`Kernel::NormBackward`] (input, weight, grad, then the gradients of the input, weight
    /// and bias, and four empty slots).
    Ten(std::array::IntoIter<Option<&'a TensorArg>, 10>),
    /// Gradient, two state slots and parameter of each [`UpdateSet`] in turn.
    Sets {
        /// The sets.
        sets: &'a [UpdateSet],
        /// The next slot, counted over all sets (four per set).
        next: usize,
    },
}

impl<'a> Iterator for OperandIter<'a> {
    type Item = Option<&'a TensorArg>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            OperandIter::Fixed(slots) => slots.next(),
            OperandIter::Ten(slots) => slots.next(),
            OperandIter::Sets { sets, next } => {
                let set = sets.get(*next / 4)?;
                let slot = match *next % 4 {
                    0 => Some(&set.grad),
                    1 => set.state[0].as_ref(),
                    2 => set.state[1].as_ref(),
                    _ => Some(&set.param),
                };
                *next += 1;
                Some(slot)
            }
        }
    }
}

/// An op without operands: the unit of [`crate::Capabilities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Op {
    Fill,
    Arange,
    RandomUniform,
    RandomNormal,
    /// A cast *to* this dtype (the table's dtype is the source).
    Cast(DType),
    Copy,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    Where,
    Reduce(ReduceOp),
    Softmax,
    LogSoftmax,
    Matmul,
    Gather,
    IndexSelect,
    Scan(ScanOp),
    Sort,
    Scatter(ScatterMode),
    Norm(NormKind),
    CrossEntropy,
    Conv2d,
    Conv2dBackwardInput,
    Conv2dBackwardWeight,
    Attention,
    AttentionBackward,
    /// Not a kernel of its own: listed where `Attention` and `AttentionBackward` (where listed)
    /// also apply an additive mask ([`AttentionMask`]); elsewhere a masked attention kernel is
    /// refused with `Unsupported`.
    AttentionMask,
    /// A matmul with a bias and activation epilogue.
    Linear,
    Pool2d(PoolKind),
    Pool2dBackward(PoolKind),
    SoftmaxBackward,
    LogSoftmaxBackward,
    NormBackward(NormKind),
    CrossEntropyBackward,
    /// `Kernel::GeluBackward` (optional).
    GeluBackward,
    Update(UpdateKind),
    UpdateMany(UpdateKind),
}

impl Op {
    /// Every op, casts included.
    pub fn all() -> Vec<Op> {
        let mut ops = vec![Op::Fill, Op::Arange, Op::RandomUniform, Op::RandomNormal, Op::Copy];
        ops.extend(DType::ALL.iter().map(|&d| Op::Cast(d)));
        ops.extend(UnaryOp::ALL.iter().map(|&o| Op::Unary(o)));
        ops.extend(BinaryOp::ALL.iter().map(|&o| Op::Binary(o)));
        ops.extend(CompareOp::ALL.iter().map(|&o| Op::Compare(o)));
        ops.push(Op::Where);
        ops.extend(ReduceOp::ALL.iter().map(|&o| Op::Reduce(o)));
        ops.extend([Op::Softmax, Op::LogSoftmax, Op::Matmul, Op::Gather, Op::IndexSelect]);
        ops.extend(ScanOp::ALL.iter().map(|&o| Op::Scan(o)));
        ops.push(Op::Sort);
        ops.extend(ScatterMode::ALL.iter().map(|&m| Op::Scatter(m)));
        ops.extend([Op::Norm(NormKind::Layer), Op::Norm(NormKind::Rms), Op::CrossEntropy]);
        ops.extend([
            Op::Conv2d,
            Op::Conv2dBackwardInput,
            Op::Conv2dBackwardWeight,
            Op::Attention,
        ]);
        ops.extend([Op::AttentionBackward, Op::AttentionMask]);
        ops.push(Op::Linear);
        ops.extend(PoolKind::ALL.iter().map(|&k| Op::Pool2d(k)));
        ops.extend(PoolKind::ALL.iter().map(|&k| Op::Pool2dBackward(k)));
        ops.extend([Op::SoftmaxBackward, Op::LogSoftmaxBackward, Op::CrossEntropyBackward]);
        ops.extend([Op::NormBackward(NormKind::Layer), Op::NormBackward(NormKind::Rms)]);
        ops.push(Op::GeluBackward);
        ops.extend(UpdateKind::ALL.iter().map(|&k| Op::Update(k)));
        ops.extend(UpdateKind::ALL.iter().map(|&k| Op::UpdateMany(k)));
        ops
    }

    /// The op's name (`add`, `sum`, `cast_to_f16`, …).
    pub fn name(&self) -> String {
        match self {
            Op::Fill => "fill".into(),
            Op::Arange => "arange".into(),
            Op::RandomUniform => "rand".into(),
            Op::RandomNormal => "randn".into(),
            Op::Cast(d) => format!("cast_to_{d}"),
            Op::Copy => "copy".into(),
            Op::Unary(o) => o.name().into(),
            Op::Binary(o) => o.name().into(),
            Op::Compare(o) => o.name().into(),
            Op::Where => "where".into(),
            Op::Reduce(o) => o.name().into(),
            Op::Softmax => "softmax".into(),
            Op::LogSoftmax => "log_softmax".into(),
            Op::Matmul => "matmul".into(),
            Op::Gather => "gather".into(),
            Op::IndexSelect => "index_select".into(),
            Op::Scan(o) => o.name().into(),
            Op::Sort => "sort".into(),
            Op::Scatter(m) => m.name().into(),
            Op::Norm(k) => k.name().into(),
            Op::CrossEntropy => "cross_entropy".into(),
            Op::Conv2d => "conv2d".into(),
            Op::Conv2dBackwardInput => "conv2d_backward_input".into(),
            Op::Conv2dBackwardWeight => "conv2d_backward_weight".into(),
            Op::Attention => "attention".into(),
            Op::AttentionBackward => "attention_backward".into(),
            Op::AttentionMask => "attention_mask".into(),
            Op::Linear => "linear".into(),
            Op::Pool2d(k) => k.name().into(),
            Op::Pool2dBackward(k) => k.backward_name().into(),
            Op::SoftmaxBackward => "softmax_backward".into(),
            Op::LogSoftmaxBackward => "log_softmax_backward".into(),
            Op::NormBackward(k) => format!("{}_backward", k.name()),
            Op::CrossEntropyBackward => "cross_entropy_backward".into(),
            Op::GeluBackward => "gelu_backward".into(),
            Op::Update(k) => k.name().into(),
            Op::UpdateMany(k) => k.many_name().into(),
        }
    }

    /// True for the optional fused kernels (`Conv2d`, `Attention`, the backward kernels and the
    /// optimizer update): a backend lists them only
    /// where it has a fused implementation ([`crate::Capabilities::all_defined`] leaves them
    /// out), and the frontend composes them from other kernels elsewhere.
    pub const fn optional(&self) -> bool {
        matches!(
            self,
            Op::Conv2d
                | Op::Conv2dBackwardInput
                | Op::Conv2dBackwardWeight
                | Op::Attention
                | Op::AttentionBackward
                | Op::AttentionMask
                | Op::Linear
                | Op::Pool2d(_)
                | Op::Pool2dBackward(_)
                | Op::SoftmaxBackward
                | Op::LogSoftmaxBackward
                | Op::NormBackward(_)
                | Op::CrossEntropyBackward
                | Op::GeluBackward
                | Op::Update(_)
                | Op::UpdateMany(_)
        )
    }

    /// Whether the op is defined for `dtype` at all (independent of any backend; see the
    /// module docs). Backends support a subset of this.
    #[inline]
    pub fn defined_for(&self, dtype: DType) -> bool {
        let float = dtype.is_float();
        let boolean = dtype == DType::Bool;
        match self {
            Op::Fill | Op::Arange | Op::Cast(_) | Op::Copy | Op::Where | Op::Gather | Op::IndexSelect => true,
            Op::Sort | Op::Scatter(ScatterMode::Assign) => true,
            Op::Scan(_) | Op::Scatter(ScatterMode::Add) => !boolean,
            Op::Norm(_) | Op::CrossEntropy | Op::Conv2d | Op::Attention => float,
            Op::AttentionBackward | Op::AttentionMask | Op::Pool2d(_) | Op::Pool2dBackward(_) | Op::Linear => float,
            Op::Conv2dBackwardInput | Op::Conv2dBackwardWeight => float,
            Op::SoftmaxBackward | Op::LogSoftmaxBackward | Op::NormBackward(_) => float,
            Op::CrossEntropyBackward | Op::GeluBackward | Op::Update(_) | Op::UpdateMany(_) => float,
            Op::Compare(_) => true,
            Op::RandomUniform | Op::RandomNormal | Op::Softmax | Op::LogSoftmax | Op::Matmul => float,
            Op::Unary(u) => float || (u.integer_ok() && !boolean),
            Op::Binary(BinaryOp::Maximum | BinaryOp::Minimum) => true,
            Op::Binary(_) => !boolean,
            Op::Reduce(ReduceOp::Mean | ReduceOp::LogSumExp) => float,
            Op::Reduce(ReduceOp::Sum | ReduceOp::Prod) => !boolean,
            Op::Reduce(_) => true,
        }
    }
}
