//! What ran for an ops-section row on cartage's side, in a few words for the report's `impl`
//! column: the fused kernel a backend lists for the op (its `Op::optional` kernels come and go
//! with the backend and the dtype, and the frontend composes the op where one is missing), or
//! the ops the frontend composes it from.
//!
//! The words come from what can be known at run time: the device's capabilities (the frontend
//! runs a fused kernel exactly where they list it, for every op here but attention), and, for
//! attention, what one call showed: the node its forward recorded (the fused kernel records
//! `scaled_dot_product_attention`, the composed path the final `matmul`) and how far allocated
//! memory rose during its backward (the composed backward materialises `[.., L, S]` score
//! matrices, the fused one holds none). Where neither settles it, the answer is `unknown`.

use cartage::{Capabilities, DType, NormKind, Op};
use cartage_core::PoolKind;

use super::cases::ModelOp;

/// The node name the fused attention forward records.
pub const FUSED_ATTENTION_NODE: &str = "scaled_dot_product_attention";

/// What one untimed call of a row's op showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The name of the autograd node that made the output (`Tensor::grad_fn`), where the
    /// inputs were variables.
    pub forward_node: Option<String>,
    /// How far allocated memory rose above its level during one backward, in bytes.
    pub backward_rise: Option<usize>,
    /// The cuDNN algorithm each convolution pass of the row's shape ran, as `(op, words)` with
    /// `op` one of `conv2d`, `conv2d_backward_input`, `conv2d_backward_weight` (CUDA only).
    pub conv_algorithms: Vec<(String, String)>,
    /// What ran each attention pass of the row's shape, where the backend told it, as `(op,
    /// words)` with `op` `attention` or `attention_backward` and words such as `cuDNN fused
    /// attention (graph engine 8)` or ``flash kernel `attention.cu` `` (CUDA only, where cuDNN
    /// was considered: `CudaBackend::attention_choices`).
    pub attention_implementations: Vec<(String, String)>,
}

/// The words for `op` in `dtype` on a device of `backend` (`cpu`, `cuda`, `wgpu`) with `caps`:
/// the forward, and with `backward` the backward after a `;`.
pub fn cartage(
    op: &ModelOp,
    backend: &str,
    dtype: DType,
    caps: &Capabilities,
    backward: bool,
    seen: &Observed,
) -> String {
    let listed = |op: Op| caps.supports(op, dtype);
    let fused_or = |op: Op, composed: &str| {
        if listed(op) {
            format!("fused `{}`", op.name())
        } else {
            composed.to_string()
        }
    };
    let (forward, back) = match *op {
        ModelOp::LayerNorm { .. } | ModelOp::RmsNorm { .. } => {
            let kind = if matches!(op, ModelOp::LayerNorm { .. }) {
                NormKind::Layer
            } else {
                NormKind::Rms
            };
            (
                format!("fused `{}`", Op::Norm(kind).name()),
                fused_or(Op::NormBackward(kind), "composed from elementwise ops and row sums"),
            )
        }
        ModelOp::Softmax { .. } => (
            "fused `softmax`".into(),
            fused_or(Op::SoftmaxBackward, "composed: mul, row sum, sub, mul"),
        ),
        ModelOp::LogSoftmax { .. } => (
            "fused `log_softmax`".into(),
            fused_or(Op::LogSoftmaxBackward, "composed: exp, row sum, mul, sub"),
        ),
        ModelOp::CrossEntropy { .. } => (
            "fused `cross_entropy` + mean".into(),
            if listed(Op::CrossEntropyBackward) {
                format!(
                    "fused `{}`, run in the forward pass and handed over by `backward()`",
                    Op::CrossEntropyBackward.name()
                )
            } else {
                "composed: softmax, scatter_add, mul".into()
            },
        ),
        ModelOp::Exp { .. } => ("`exp`".into(), "`mul` by the saved output".into()),
        ModelOp::Cat { .. } => (
            "one `copy` per part".into(),
            "a contiguous `copy` of each part's slice".into(),
        ),
        ModelOp::Sort { .. } => ("`sort`".into(), "the gradient scattered back by the indices".into()),
        ModelOp::Cumsum { .. } => ("`cumsum` scan".into(), "flip, `cumsum`, flip".into()),
        ModelOp::Conv2d { .. } => {
            let algos = &seen.conv_algorithms;
            let forward = if listed(Op::Conv2d) {
                library_conv(backend, &["conv2d"], algos)
            } else {
                "composed: im2col copy + batched matmul".into()
            };
            let back = match (listed(Op::Conv2dBackwardInput), listed(Op::Conv2dBackwardWeight)) {
                (true, true) => library_conv(backend, &["conv2d_backward_input", "conv2d_backward_weight"], algos),
                (false, false) => "composed: im2col + batched matmuls + fold".into(),
                (input, _) => format!(
                    "input grad {}, weight grad {}",
                    if input { "fused" } else { "composed" },
                    if input { "composed" } else { "fused" }
                ),
            };
            (forward, back)
        }
        ModelOp::MaxPool2d { .. } => {
            let kernel = Op::Pool2d(PoolKind::Max);
            let forward = fused_or(kernel, "composed: max over a window view");
            let back = if listed(kernel) && listed(Op::Pool2dBackward(PoolKind::Max)) {
                format!("fused `{}` from the indices", Op::Pool2dBackward(PoolKind::Max).name())
            } else {
                "composed: the argmax recomputed, then scattered".into()
            };
            (forward, back)
        }
        ModelOp::Sdpa {
            batch,
            heads,
            seq,
            head_dim,
            ..
        } => {
            let told = |op: &str| {
                seen.attention_implementations
                    .iter()
                    .find(|(o, _)| o == op)
                    .map(|(_, words)| words.as_str())
            };
            let (words, fused) = attention_forward(
                backend,
                listed(Op::Attention),
                seen.forward_node.as_deref(),
                told("attention"),
            );
            let back = attention_backward(
                fused,
                listed(Op::AttentionBackward),
                told("attention_backward"),
                seen.backward_rise,
                [batch * heads, seq, seq, head_dim],
                dtype.size_in_bytes(),
            );
            (words, back)
        }
        ModelOp::Embedding { .. } => ("`index_select`".into(), "`index_add` into a zeroed table".into()),
        ModelOp::MlpStep { .. }
        | ModelOp::MlpTrain { .. }
        | ModelOp::AdamW { .. }
        | ModelOp::GptTrain { .. }
        | ModelOp::TrainPipeline { .. } => ("unknown".into(), "unknown".into()),
    };
    if backward {
        format!("{forward}; backward: {back}")
    } else {
        forward
    }
}

/// A fused convolution kernel: cuDNN's on CUDA (the backend lists it only where cuDNN loads),
/// each pass with the algorithm it ran where the backend told it (`algos`, see
/// [`Observed::conv_algorithms`]).
fn library_conv(backend: &str, kernels: &[&str], algos: &[(String, String)]) -> String {
    let named = |k: &&str| match algos.iter().find(|(op, _)| op == k) {
        Some((_, words)) => format!("`{k}` {words}"),
        None => format!("`{k}`, algorithm unknown"),
    };
    let listed = kernels.iter().map(named).collect::<Vec<_>>().join(" + ");
    match backend {
        "cuda" => format!("cuDNN ({listed})"),
        _ => format!(
            "fused {}",
            kernels.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" + ")
        ),
    }
}

/// The attention forward, and whether it ran fused (`None`: unknown): the node it recorded
/// settles it; without one, a backend that does not list the kernel composes it, and one that
/// does may still refuse these sizes (then composes), so it is unknown. A fused forward is named
/// by what the backend `told` ran it (cuDNN's fused attention or cartage's flash kernel), where
/// it told.
fn attention_forward(backend: &str, listed: bool, node: Option<&str>, told: Option<&str>) -> (String, Option<bool>) {
    let fused = || match (backend, told) {
        (_, Some(words)) => words.to_string(),
        ("cuda", None) => "fused flash `attention`".to_string(),
        _ => "fused `attention`".to_string(),
    };
    let composed = || "composed: matmul, causal softmax, matmul".to_string();
    match node {
        Some(FUSED_ATTENTION_NODE) => (fused(), Some(true)),
        Some(_) => (composed(), Some(false)),
        None if !listed => (composed(), Some(false)),
        None => ("unknown".into(), None),
    }
}

/// The attention backward after a forward that ran fused or not (`None`: unknown). A composed
/// forward recorded its matmuls and softmax, whose own backward runs on the probabilities they
/// saved. A fused forward's backward is one fused kernel or composed on recomputed scores: the
/// frontend chooses by size where the backend lists the kernel, and the memory one backward took
/// tells which ran when the two are far apart (the composed backward holds at least one `[batch,
/// L, S]` matrix, the fused one the three gradients `[batch, L|S, E]` and a row statistic).
/// Where the backend `told` what ran the fused backward, those words settle it.
fn attention_backward(
    forward_fused: Option<bool>,
    listed: bool,
    told: Option<&str>,
    rise: Option<usize>,
    [batch, l, s, e]: [usize; 4],
    element: usize,
) -> String {
    let recomputed = "composed: 4 matmuls + softmax backward on the recomputed scores".to_string();
    match forward_fused {
        Some(false) => return "composed: 4 matmuls + softmax backward on the saved probabilities".into(),
        None if !listed => return "composed: 4 matmuls + softmax backward".into(),
        None => return "unknown".into(),
        Some(true) if !listed => return recomputed,
        Some(true) => {}
    }
    if let Some(words) = told {
        return words.to_string();
    }
    let scores = batch * l * s * element;
    let fused_at_most = batch * (l + 2 * s) * e * element.max(4) + batch * l * 8;
    match rise {
        Some(_) if fused_at_most >= scores => "unknown".into(),
        Some(rise) if rise >= scores => recomputed,
        Some(rise) if rise <= fused_at_most => "fused `attention_backward`".into(),
        _ => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdpa(seq: usize) -> ModelOp {
        ModelOp::Sdpa {
            batch: 8,
            heads: 16,
            seq,
            head_dim: 64,
            causal: true,
            padded: false,
        }
    }

    fn listing(ops: &[Op]) -> Capabilities {
        let mut caps = Capabilities::all_defined(|_, _| false);
        for &op in ops {
            for dtype in [DType::F32, DType::BF16] {
                caps.add(op, dtype);
            }
        }
        caps
    }

    #[test]
    fn the_fused_kernels_a_backend_lists_are_named_and_the_rest_composed() {
        let norm = ModelOp::LayerNorm { rows: 4, cols: 8 };
        let bare = listing(&[]);
        let fused = listing(&[Op::NormBackward(NormKind::Layer)]);
        let none = Observed::default();
        assert_eq!(
            cartage(&norm, "wgpu", DType::F32, &bare, false, &none),
            "fused `layer_norm`"
        );
        let composed = cartage(&norm, "wgpu", DType::F32, &bare, true, &none);
        assert!(
            composed.starts_with("fused `layer_norm`; backward: composed"),
            "{composed}"
        );
        let with_kernel = cartage(&norm, "cuda", DType::F32, &fused, true, &none);
        assert!(
            with_kernel.contains("backward: fused `layer_norm_backward`"),
            "{with_kernel}"
        );
        // Listed for f32 only: bf16 composes.
        let mut f32_only = Capabilities::all_defined(|_, _| false);
        f32_only.add(Op::NormBackward(NormKind::Layer), DType::F32);
        let bf16 = cartage(&norm, "cuda", DType::BF16, &f32_only, true, &none);
        assert!(bf16.contains("backward: composed"), "{bf16}");
    }

    #[test]
    fn convolution_names_cudnn_on_cuda_only_where_it_is_listed() {
        let conv = ModelOp::Conv2d {
            batch: 2,
            channels_in: 4,
            channels_out: 4,
            side: 8,
            kernel: 3,
            padding: 1,
        };
        let none = Observed::default();
        let cudnn = listing(&[Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight]);
        let fwd_bwd = cartage(&conv, "cuda", DType::BF16, &cudnn, true, &none);
        assert!(fwd_bwd.starts_with("cuDNN (`conv2d`"), "{fwd_bwd}");
        assert!(fwd_bwd.contains("backward: cuDNN"), "{fwd_bwd}");
        assert!(fwd_bwd.contains("algorithm unknown"), "{fwd_bwd}");
        let told = Observed {
            conv_algorithms: vec![
                (
                    "conv2d".into(),
                    "IMPLICIT_PRECOMP_GEMM (tensor_op math, searched)".into(),
                ),
                ("conv2d_backward_weight".into(), "1 (default math, heuristics)".into()),
            ],
            ..Observed::default()
        };
        let named = cartage(&conv, "cuda", DType::BF16, &cudnn, true, &told);
        assert_eq!(
            named,
            "cuDNN (`conv2d` IMPLICIT_PRECOMP_GEMM (tensor_op math, searched)); backward: cuDNN \
             (`conv2d_backward_input`, algorithm unknown + `conv2d_backward_weight` 1 (default math, heuristics))"
        );
        let without = cartage(&conv, "cuda", DType::F32, &listing(&[]), true, &none);
        assert!(without.starts_with("composed: im2col"), "{without}");
        assert!(without.contains("backward: composed"), "{without}");
    }

    #[test]
    fn attention_says_what_the_call_showed_and_unknown_otherwise() {
        let listed = listing(&[Op::Attention, Op::AttentionBackward]);
        let op = sdpa(1024);
        let fused_node = Observed {
            forward_node: Some(FUSED_ATTENTION_NODE.into()),
            backward_rise: None,
            ..Observed::default()
        };
        assert_eq!(
            cartage(&op, "cuda", DType::BF16, &listed, false, &fused_node),
            "fused flash `attention`"
        );
        let composed_node = Observed {
            forward_node: Some("matmul".into()),
            backward_rise: None,
            ..Observed::default()
        };
        assert!(cartage(&op, "cuda", DType::BF16, &listed, false, &composed_node).starts_with("composed"));
        // Listed but not observed: the kernel may refuse the sizes.
        assert_eq!(
            cartage(&op, "cuda", DType::BF16, &listed, false, &Observed::default()),
            "unknown"
        );
        // 128 × 1024 × 1024 bf16 scores are 256 MiB: a rise past them is the composed backward.
        let scores = 128 * 1024 * 1024 * 2;
        let rose = |rise: usize| Observed {
            forward_node: Some(FUSED_ATTENTION_NODE.into()),
            backward_rise: Some(rise),
            ..Observed::default()
        };
        let big = cartage(&op, "cuda", DType::BF16, &listed, true, &rose(3 * scores));
        assert!(
            big.ends_with("backward: composed: 4 matmuls + softmax backward on the recomputed scores"),
            "{big}"
        );
        let small = cartage(&op, "cuda", DType::BF16, &listed, true, &rose(48 << 20));
        assert!(small.ends_with("backward: fused `attention_backward`"), "{small}");
        let between = cartage(&op, "cuda", DType::BF16, &listed, true, &rose(scores / 2));
        assert!(between.ends_with("backward: unknown"), "{between}");
        // A short sequence: the fused kernel's gradients outweigh the scores, nothing to tell.
        let short = cartage(&sdpa(64), "cuda", DType::BF16, &listed, true, &rose(1 << 30));
        assert!(short.ends_with("backward: unknown"), "{short}");
        // What the backend told ran each pass names it.
        let told = Observed {
            forward_node: Some(FUSED_ATTENTION_NODE.into()),
            backward_rise: Some(3 * scores),
            attention_implementations: vec![
                ("attention".into(), "cuDNN fused attention (graph engine 8)".into()),
                (
                    "attention_backward".into(),
                    "flash kernel `attention_flash_backward.cu`".into(),
                ),
            ],
            ..Observed::default()
        };
        assert_eq!(
            cartage(&op, "cuda", DType::BF16, &listed, true, &told),
            "cuDNN fused attention (graph engine 8); backward: flash kernel `attention_flash_backward.cu`"
        );
        // A composed forward: its recorded ops' backward runs on the probabilities they saved.
        let bare = cartage(&op, "wgpu", DType::F32, &listing(&[]), true, &Observed::default());
        assert_eq!(
            bare,
            "composed: matmul, causal softmax, matmul; backward: composed: 4 matmuls + softmax backward on the \
             saved probabilities"
        );
        let composed_first = cartage(&op, "cuda", DType::BF16, &listed, true, &composed_node);
        assert!(
            composed_first.ends_with("on the saved probabilities"),
            "{composed_first}"
        );
        // A fused forward on a backend without the fused backward recomputes the scores.
        let forward_only = listing(&[Op::Attention]);
        let recomputed = cartage(&op, "cuda", DType::BF16, &forward_only, true, &fused_node);
        assert!(recomputed.ends_with("on the recomputed scores"), "{recomputed}");
        // Neither pass observed on a backend listing both: unknown.
        let blind = cartage(&op, "cuda", DType::BF16, &listed, true, &Observed::default());
        assert_eq!(blind, "unknown; backward: unknown");
    }
}
