//! The cases of the ops section: the fused NN primitives, joins, sorts, scans, convolution and
//! attention a model needs, each with the shape it runs at and the work one call does.

use serde::{Deserialize, Serialize};

use super::Work;

/// One op of the ops section, with its shape. The PyTorch counterpart of each is named in its
/// doc; on the CPU the reference is numpy composed from its primitives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ModelOp {
    /// `x.layer_norm(Some(&w), Some(&b), 1e-5)` over rows of `cols` (`F.layer_norm`).
    LayerNorm {
        /// Rows.
        rows: usize,
        /// Elements per row (the normalised dim).
        cols: usize,
    },
    /// `x.rms_norm(Some(&w), 1e-6)` over rows of `cols` (`F.rms_norm`).
    RmsNorm {
        /// Rows.
        rows: usize,
        /// Elements per row.
        cols: usize,
    },
    /// `x.softmax(-1)` (`torch.softmax`).
    Softmax {
        /// Rows.
        rows: usize,
        /// Elements per row.
        cols: usize,
    },
    /// `x.log_softmax(-1)` (`torch.log_softmax`).
    LogSoftmax {
        /// Rows.
        rows: usize,
        /// Elements per row.
        cols: usize,
    },
    /// `logits.cross_entropy(&target, ..)`, mean over rows of `cols` classes (`F.cross_entropy`).
    CrossEntropy {
        /// Rows (samples).
        rows: usize,
        /// Classes.
        cols: usize,
    },
    /// `x.exp()` over rows of `cols` (`np.exp` on the CPU).
    Exp {
        /// Rows.
        rows: usize,
        /// Elements per row.
        cols: usize,
    },
    /// `Tensor::cat` of `parts` tensors `[part_rows, cols]` along dim 0 (`torch.cat`).
    Cat {
        /// Tensors joined.
        parts: usize,
        /// Rows of each part.
        part_rows: usize,
        /// Columns of every part.
        cols: usize,
    },
    /// `x.sort(-1, false)` of a 1-D tensor (`torch.sort`), values and i64 indices.
    Sort {
        /// Elements.
        numel: usize,
    },
    /// `x.cumsum(-1)` of `[rows, cols]` (`torch.cumsum`).
    Cumsum {
        /// Rows.
        rows: usize,
        /// Elements per row (the scanned dim).
        cols: usize,
    },
    /// `x.conv2d(&w, None, ..)`: `[batch, channels_in, side, side]` with a square kernel, stride
    /// 1 (`F.conv2d`).
    Conv2d {
        /// Batch.
        batch: usize,
        /// Input channels.
        channels_in: usize,
        /// Output channels.
        channels_out: usize,
        /// Height and width of the input.
        side: usize,
        /// Height and width of the kernel.
        kernel: usize,
        /// Zero padding on every side.
        padding: usize,
    },
    /// `x.max_pool2d([k, k], [stride, stride], [padding, padding])` of `[batch, channels, side,
    /// side]` (`F.max_pool2d`).
    MaxPool2d {
        /// Batch.
        batch: usize,
        /// Channels.
        channels: usize,
        /// Height and width of the input.
        side: usize,
        /// Height and width of the window.
        kernel: usize,
        /// Step of the window.
        stride: usize,
        /// `-inf` padding on every side.
        padding: usize,
    },
    /// `Tensor::scaled_dot_product_attention(&q, &k, &v, mask, causal, None)` with q, k, v of
    /// `[batch, heads, seq, head_dim]` (`F.scaled_dot_product_attention`), the mask a key-padding
    /// one when `padded`.
    Sdpa {
        /// Batch.
        batch: usize,
        /// Heads.
        heads: usize,
        /// Sequence length (queries and keys).
        seq: usize,
        /// Head dimension.
        head_dim: usize,
        /// Causal mask.
        causal: bool,
        /// A key-padding mask ([`key_padding_len`]): a bool `[batch, 1, 1, seq]` (PyTorch's
        /// `attn_mask`), broadcast over heads and queries.
        #[serde(default)]
        padded: bool,
    },
    /// `table.embedding(&ids)`: rows of an f32 table `[num, dim]` picked by i64 ids `[batch,
    /// seq]` (`F.embedding`), the ids spread over the table (`i · 7919 mod num`).
    Embedding {
        /// Rows of the table (the vocabulary).
        num: usize,
        /// Width of each row.
        dim: usize,
        /// Sequences of ids.
        batch: usize,
        /// Ids per sequence.
        seq: usize,
    },
    /// One training step of an MLP: `layers` linear layers `[width, width]` (weights are
    /// variables) with ReLU between them, the mean square of the output as the loss, backward,
    /// and the gradients freed (`torch.nn.Linear` without bias, `loss.backward()`,
    /// `zero_grad(set_to_none=True)`).
    MlpStep {
        /// Linear layers.
        layers: usize,
        /// Input, hidden and output width.
        width: usize,
        /// Rows of the batch.
        batch: usize,
    },
    /// A whole training step of an MLP classifier with `cartage-nn`: `layers - 1` hidden
    /// `Linear(width, width)` + ReLU, a `Linear(width, 10)` head, cross-entropy, backward,
    /// AdamW, gradients freed; under bf16 autocast when `autocast` (PyTorch: `nn.Linear`,
    /// `torch.optim.AdamW`, `torch.autocast`).
    MlpTrain {
        /// Linear layers (the head included).
        layers: usize,
        /// Input and hidden width.
        width: usize,
        /// Rows of the batch.
        batch: usize,
        /// Run under bf16 autocast (master weights f32).
        autocast: bool,
    },
    /// One AdamW step (lr 1e-3, weight decay 0.01) over `tensors` f32 parameters of
    /// `params / tensors` elements each, gradients given: cartage's fused `adam_step_` per
    /// parameter against `torch.optim.AdamW(fused=True)` on CUDA (the default
    /// implementation on the CPU) or numpy.
    #[serde(rename = "adamw")]
    AdamW {
        /// Elements of all parameters together.
        params: usize,
        /// Parameter tensors.
        tensors: usize,
    },
    /// A whole training step of a character-level GPT (`cartage_nn::models::Gpt`: token and
    /// position embeddings, pre-norm blocks with causal attention and a GELU MLP four times as
    /// wide, a final LayerNorm and a linear head), cross-entropy over every position, backward,
    /// AdamW, gradients freed; under bf16 autocast when `autocast` (PyTorch: the same modules
    /// from `torch.nn`, `scaled_dot_product_attention(is_causal=True)`).
    GptTrain {
        /// Transformer blocks.
        layers: usize,
        /// Width.
        dim: usize,
        /// Attention heads.
        heads: usize,
        /// Tokens per sequence.
        context: usize,
        /// Sequences per batch.
        batch: usize,
        /// Token ids run over `0..vocab`.
        vocab: usize,
        /// Run under bf16 autocast (master weights f32).
        autocast: bool,
        /// Capture forward and backward once in a CUDA graph and replay it each step (the
        /// optimizer steps eagerly after the replay); PyTorch runs the same step eagerly.
        #[serde(default)]
        graph: bool,
    },
    /// LESSONS R31: where one real training step's time goes. The `MlpTrain` model fed from host
    /// batches: building the batch on the host, copying it to the device, the step's kernels and
    /// their launch overhead, and the host sync that reads the loss, each measured (see
    /// `exec::pipeline`). cartage only: the shares are the result.
    TrainPipeline {
        /// Linear layers (the head included).
        layers: usize,
        /// Input and hidden width.
        width: usize,
        /// Rows of the batch.
        batch: usize,
    },
}

impl ModelOp {
    /// The op's name in case names (`layer_norm`, `sdpa_causal`).
    pub fn name(&self) -> &'static str {
        match self {
            ModelOp::LayerNorm { .. } => "layer_norm",
            ModelOp::RmsNorm { .. } => "rms_norm",
            ModelOp::Softmax { .. } => "softmax",
            ModelOp::LogSoftmax { .. } => "log_softmax",
            ModelOp::CrossEntropy { .. } => "cross_entropy",
            ModelOp::Exp { .. } => "exp",
            ModelOp::Cat { .. } => "cat",
            ModelOp::Sort { .. } => "sort",
            ModelOp::Cumsum { .. } => "cumsum",
            ModelOp::Conv2d { .. } => "conv2d",
            ModelOp::MaxPool2d { .. } => "max_pool2d",
            ModelOp::Sdpa { causal, padded, .. } => match (causal, padded) {
                (false, false) => "sdpa",
                (true, false) => "sdpa_causal",
                (false, true) => "sdpa_padded",
                (true, true) => "sdpa_causal_padded",
            },
            ModelOp::Embedding { .. } => "embedding",
            ModelOp::MlpStep { .. } => "mlp_step",
            ModelOp::MlpTrain { autocast: false, .. } => "mlp_train",
            ModelOp::MlpTrain { autocast: true, .. } => "mlp_train_bf16_autocast",
            ModelOp::AdamW { .. } => "adamw_step",
            ModelOp::GptTrain {
                autocast: false,
                graph: false,
                ..
            } => "gpt_train",
            ModelOp::GptTrain {
                autocast: true,
                graph: false,
                ..
            } => "gpt_train_bf16_autocast",
            ModelOp::GptTrain {
                autocast: false,
                graph: true,
                ..
            } => "gpt_train_graph",
            ModelOp::GptTrain {
                autocast: true,
                graph: true,
                ..
            } => "gpt_train_bf16_autocast_graph",
            ModelOp::TrainPipeline { .. } => "train_pipeline",
        }
    }

    /// Elements of the main input (of the output for `cat`).
    pub fn numel(&self) -> usize {
        match *self {
            ModelOp::LayerNorm { rows, cols }
            | ModelOp::RmsNorm { rows, cols }
            | ModelOp::Softmax { rows, cols }
            | ModelOp::LogSoftmax { rows, cols }
            | ModelOp::CrossEntropy { rows, cols }
            | ModelOp::Exp { rows, cols }
            | ModelOp::Cumsum { rows, cols } => rows * cols,
            ModelOp::Cat { parts, part_rows, cols } => parts * part_rows * cols,
            ModelOp::Sort { numel } => numel,
            ModelOp::Conv2d {
                batch,
                channels_in,
                side,
                ..
            } => batch * channels_in * side * side,
            ModelOp::MaxPool2d {
                batch, channels, side, ..
            } => batch * channels * side * side,
            ModelOp::Sdpa {
                batch,
                heads,
                seq,
                head_dim,
                ..
            } => batch * heads * seq * head_dim,
            ModelOp::Embedding { dim, batch, seq, .. } => batch * seq * dim,
            ModelOp::MlpStep { width, batch, .. }
            | ModelOp::MlpTrain { width, batch, .. }
            | ModelOp::TrainPipeline { width, batch, .. } => batch * width,
            ModelOp::AdamW { params, .. } => params,
            ModelOp::GptTrain { context, batch, .. } => context * batch,
        }
    }

    /// The shape as the report shows it (`[8192, 4096]`, `8 × [2048, 4096]`).
    pub fn shape(&self) -> String {
        match *self {
            ModelOp::LayerNorm { rows, cols }
            | ModelOp::RmsNorm { rows, cols }
            | ModelOp::Softmax { rows, cols }
            | ModelOp::LogSoftmax { rows, cols }
            | ModelOp::CrossEntropy { rows, cols }
            | ModelOp::Exp { rows, cols }
            | ModelOp::Cumsum { rows, cols } => format!("[{rows}, {cols}]"),
            ModelOp::Cat { parts, part_rows, cols } => format!("{parts} × [{part_rows}, {cols}]"),
            ModelOp::Sort { numel } => format!("[{numel}]"),
            ModelOp::Conv2d {
                batch,
                channels_in,
                channels_out,
                side,
                kernel,
                padding,
            } => format!(
                "[{batch}, {channels_in}, {side}, {side}] ⊛ {kernel}×{kernel} → {channels_out}, padding {padding}"
            ),
            ModelOp::MaxPool2d {
                batch,
                channels,
                side,
                kernel,
                stride,
                padding,
            } => format!("[{batch}, {channels}, {side}, {side}], {kernel}×{kernel} stride {stride}, padding {padding}"),
            ModelOp::Sdpa {
                batch,
                heads,
                seq,
                head_dim,
                causal,
                padded,
            } => format!(
                "[{batch}, {heads}, {seq}, {head_dim}]{}{}",
                if causal { ", causal" } else { "" },
                if padded { ", key padding" } else { "" }
            ),
            ModelOp::Embedding { num, dim, batch, seq } => format!("[{num}, {dim}], ids [{batch}, {seq}]"),
            ModelOp::MlpStep { layers, width, batch } => {
                format!("{layers} × [{width}, {width}], batch {batch}")
            }
            ModelOp::MlpTrain {
                layers,
                width,
                batch,
                autocast,
            } => format!(
                "{} × [{width}, {width}] + head, batch {batch}, AdamW{}",
                layers - 1,
                if autocast { ", bf16 autocast" } else { "" }
            ),
            ModelOp::AdamW { params, tensors } => format!("{tensors} × [{}]", params / tensors.max(1)),
            ModelOp::GptTrain {
                layers,
                dim,
                heads,
                context,
                batch,
                vocab,
                autocast,
                graph,
            } => format!(
                "{layers} layer{}, d {dim}, {heads} heads, context {context}, batch {batch}, vocab {vocab}, AdamW{}{}{}",
                if layers == 1 { "" } else { "s" },
                match gpt_recompute() {
                    Ok(Some(r)) => format!(", recompute {}", r.name()),
                    _ => String::new(),
                },
                if autocast { ", bf16 autocast" } else { "" },
                if graph {
                    ", forward and backward replayed as a CUDA graph"
                } else {
                    ""
                }
            ),
            ModelOp::TrainPipeline { layers, width, batch } => {
                format!(
                    "{} × [{width}, {width}] + head, batch {batch}, AdamW, host batches",
                    layers - 1
                )
            }
        }
    }

    /// The speed the issue asks for against the reference library (its time ÷ ours), where it
    /// names one.
    pub fn target(&self) -> Option<f64> {
        match self {
            ModelOp::LayerNorm { .. }
            | ModelOp::RmsNorm { .. }
            | ModelOp::Softmax { .. }
            | ModelOp::CrossEntropy { .. }
            | ModelOp::Exp { .. } => Some(1.0),
            ModelOp::Cat { .. } | ModelOp::Sort { .. } | ModelOp::Cumsum { .. } | ModelOp::Conv2d { .. } => Some(0.9),
            ModelOp::Sdpa { .. } => Some(0.8),
            ModelOp::LogSoftmax { .. } | ModelOp::MaxPool2d { .. } | ModelOp::Embedding { .. } => None,
            // Launch-bound at small widths, where cartage's lower per-op cost must show.
            ModelOp::MlpStep { width, .. } => Some(if *width >= 1024 { 1.0 } else { 1.3 }),
            ModelOp::MlpTrain { .. } => Some(1.2),
            ModelOp::AdamW { .. } => Some(1.0),
            ModelOp::GptTrain { graph: true, .. } => Some(1.2),
            ModelOp::GptTrain { .. } => Some(0.9),
            ModelOp::TrainPipeline { .. } => None,
        }
    }

    /// The target on a device: the CPU's training step is held to 1.0× (its reference is
    /// PyTorch's CPU or numpy), every other row to [`ModelOp::target`].
    pub fn target_on(&self, device: &str) -> Option<f64> {
        match self {
            ModelOp::MlpStep { .. } if device == "cpu" => Some(1.0),
            _ => self.target(),
        }
    }

    /// True when arithmetic, not memory, bounds the op (its rate is shown in GFLOP/s).
    pub fn compute_bound(&self) -> bool {
        matches!(
            self,
            ModelOp::Conv2d { .. }
                | ModelOp::Sdpa { .. }
                | ModelOp::MlpStep { .. }
                | ModelOp::MlpTrain { .. }
                | ModelOp::GptTrain { .. }
                | ModelOp::TrainPipeline { .. }
        )
    }

    /// The dtype the op's products run in when it differs from the row's dtype: bf16 for the
    /// training steps under autocast (their parameters stay f32, their matmuls do not), so the
    /// report holds them to the bf16 matmul ceiling rather than the f32 one.
    pub fn compute_dtype(&self) -> Option<&'static str> {
        match self {
            ModelOp::MlpTrain { autocast: true, .. } | ModelOp::GptTrain { autocast: true, .. } => Some("bf16"),
            _ => None,
        }
    }

    /// The work of one call for elements of `s` bytes.
    pub fn work(&self, s: f64) -> Work {
        let n = self.numel() as f64;
        let streamed = |read: f64, written: f64, flops: f64, extra_bytes: f64| Work {
            flops: flops * n,
            device_bytes: (read + written) * n * s + extra_bytes,
            link_bytes: 0.0,
            ops: 1.0,
        };
        match *self {
            // Read x (the statistics pass stays in cache), write y; weight and bias are one row.
            ModelOp::LayerNorm { cols, .. } => streamed(1.0, 1.0, 8.0, 2.0 * cols as f64 * s),
            ModelOp::RmsNorm { cols, .. } => streamed(1.0, 1.0, 5.0, cols as f64 * s),
            ModelOp::Softmax { .. } | ModelOp::LogSoftmax { .. } => streamed(1.0, 1.0, 5.0, 0.0),
            // Read the logits and one i64 target per row; the loss is one value per row.
            ModelOp::CrossEntropy { rows, .. } => streamed(1.0, 0.0, 5.0, 8.0 * rows as f64),
            ModelOp::Exp { .. } => streamed(1.0, 1.0, 1.0, 0.0),
            ModelOp::Cat { .. } => streamed(1.0, 1.0, 0.0, 0.0),
            // One read and one write of values and i64 indices, at the least.
            ModelOp::Sort { .. } => Work {
                flops: n * n.log2().max(1.0),
                ..streamed(1.0, 1.0, 0.0, 8.0 * n)
            },
            ModelOp::Cumsum { .. } => streamed(1.0, 1.0, 1.0, 0.0),
            // Read the input once, write the pooled output; a comparison per tap.
            ModelOp::MaxPool2d {
                side,
                kernel,
                stride,
                padding,
                ..
            } => {
                let out_side = ((side + 2 * padding).saturating_sub(kernel) / stride.max(1) + 1) as f64;
                let shrink = out_side * out_side / (side * side).max(1) as f64;
                streamed(1.0, shrink, shrink * (kernel * kernel) as f64, 0.0)
            }
            ModelOp::Conv2d {
                batch,
                channels_in,
                channels_out,
                side,
                kernel,
                padding,
            } => {
                let out_side = (side + 2 * padding + 1).saturating_sub(kernel) as f64;
                let out = batch as f64 * channels_out as f64 * out_side * out_side;
                let weight = (channels_out * channels_in * kernel * kernel) as f64;
                Work {
                    flops: 2.0 * out * (channels_in * kernel * kernel) as f64,
                    device_bytes: (n + out + weight) * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            // Per layer, the forward product and the two backward ones (input and weight
            // gradients), each 2·batch·width² flops; the weights and activations are read.
            ModelOp::MlpStep { layers, width, batch } => {
                let (l, w, b) = (layers as f64, width as f64, batch as f64);
                Work {
                    flops: 6.0 * b * w * w * l,
                    device_bytes: 3.0 * l * (w * w + b * w) * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            // The hidden layers as in the step above, the head as a [width, 10] layer; AdamW
            // reads and writes parameters, gradients and two moments.
            ModelOp::MlpTrain {
                layers, width, batch, ..
            } => {
                let (l, w, b) = ((layers - 1) as f64, width as f64, batch as f64);
                let params = l * w * w + 10.0 * w;
                Work {
                    flops: 6.0 * b * (l * w * w + 10.0 * w),
                    device_bytes: (3.0 * (params + l * b * w) + 6.0 * params) * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            // Read parameter, gradient and both moments; write parameter and moments.
            ModelOp::AdamW { .. } => Work {
                flops: 12.0 * n,
                device_bytes: 7.0 * n * s,
                link_bytes: 0.0,
                ops: 1.0,
            },
            // 6 flop per parameter and token (forward and backward), plus the attention scores
            // (causal: half of 12·T·D per token and layer); AdamW streams the parameters.
            ModelOp::GptTrain {
                layers,
                dim,
                context,
                batch,
                vocab,
                ..
            } => {
                let (l, d, t, v) = (layers as f64, dim as f64, context as f64, vocab as f64);
                let params = l * 12.0 * d * d + (v + t) * d + d * v;
                let tokens = t * batch as f64;
                Work {
                    flops: 6.0 * params * tokens + 6.0 * l * tokens * t * d,
                    device_bytes: (3.0 * params + 16.0 * l * tokens * d + 6.0 * params) * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            // As `MlpTrain`, plus the batch crossing the link.
            ModelOp::TrainPipeline { layers, width, batch } => Work {
                link_bytes: (batch * width) as f64 * 4.0,
                ..ModelOp::MlpTrain {
                    layers,
                    width,
                    batch,
                    autocast: false,
                }
                .work(s)
            },
            // Two [seq, seq] products per head (half of each under a causal mask); q, k, v read
            // and the output written once.
            ModelOp::Sdpa {
                batch,
                seq,
                causal,
                padded,
                ..
            } => {
                let seen = if padded { key_padding_share(batch, seq) } else { 1.0 };
                let products = 4.0 * n * seq as f64 * seen;
                Work {
                    flops: if causal { products / 2.0 } else { products },
                    device_bytes: 4.0 * n * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            // The picked rows read and written once, and one i64 id per row.
            ModelOp::Embedding { batch, seq, .. } => streamed(1.0, 1.0, 0.0, 8.0 * (batch * seq) as f64),
        }
    }

    /// True for a model's whole training step (the MLP and GPT steps): the report runs these
    /// several times on each side, interleaved, and gives their spread across runs.
    pub fn is_model_step(&self) -> bool {
        matches!(
            self,
            ModelOp::MlpStep { .. } | ModelOp::MlpTrain { .. } | ModelOp::GptTrain { .. }
        )
    }

    /// True for the ops of the ops section that have a gradient in both cartage and PyTorch:
    /// they get a forward + backward row beside the forward one. The training steps (which
    /// contain their own backward) and `sort`'s indices aside, every op of the section does.
    pub fn differentiable(&self) -> bool {
        match self {
            ModelOp::LayerNorm { .. }
            | ModelOp::RmsNorm { .. }
            | ModelOp::Softmax { .. }
            | ModelOp::LogSoftmax { .. }
            | ModelOp::CrossEntropy { .. }
            | ModelOp::Exp { .. }
            | ModelOp::Cat { .. }
            | ModelOp::Sort { .. }
            | ModelOp::Cumsum { .. }
            | ModelOp::Conv2d { .. }
            | ModelOp::MaxPool2d { .. }
            | ModelOp::Sdpa { .. }
            | ModelOp::Embedding { .. } => true,
            ModelOp::MlpStep { .. }
            | ModelOp::MlpTrain { .. }
            | ModelOp::AdamW { .. }
            | ModelOp::GptTrain { .. }
            | ModelOp::TrainPipeline { .. } => false,
        }
    }

    /// The work of one forward + backward call (a fixed output gradient given, or the scalar
    /// loss's own for `cross_entropy`) for elements of `s` bytes: the forward's work plus what a
    /// fused backward must do at the least. Products: the backward of each is two more of the
    /// same size (the gradient of each operand), so a convolution or attention does three
    /// times its forward's flops. Streaming ops: the backward reads what it needs (the saved
    /// input or output and the incoming gradient) and writes each input's gradient once.
    pub fn forward_backward_work(&self, s: f64) -> Work {
        let forward = self.work(s);
        let n = self.numel() as f64;
        let backward = |bytes: f64, flops: f64| Work {
            flops: forward.flops + flops,
            device_bytes: forward.device_bytes + bytes,
            link_bytes: 0.0,
            ops: forward.ops + 1.0,
        };
        match *self {
            // Read x and the gradient, write dx; the weight (and bias) gradients come from the
            // same reads.
            ModelOp::LayerNorm { cols, .. } => backward(3.0 * n * s + 2.0 * cols as f64 * s, 12.0 * n),
            ModelOp::RmsNorm { cols, .. } => backward(3.0 * n * s + cols as f64 * s, 8.0 * n),
            // Read the output and the gradient, write dx.
            ModelOp::Softmax { .. } | ModelOp::LogSoftmax { .. } | ModelOp::Exp { .. } => {
                backward(3.0 * n * s, 3.0 * n)
            }
            // Read the logits again and write their gradient.
            ModelOp::CrossEntropy { .. } => backward(2.0 * n * s, 5.0 * n),
            ModelOp::Cat { .. } | ModelOp::Cumsum { .. } => backward(2.0 * n * s, 0.0),
            // Read the gradient and the i64 indices, write dx.
            ModelOp::Sort { .. } => backward(2.0 * n * s + 8.0 * n, 0.0),
            // Read the output gradient (and indices), write the input gradient.
            ModelOp::MaxPool2d { .. } => {
                let written = forward.device_bytes / s - n;
                backward((n + written) * s, 0.0)
            }
            ModelOp::Conv2d { .. } => Work {
                flops: 3.0 * forward.flops,
                device_bytes: 3.0 * forward.device_bytes,
                link_bytes: 0.0,
                ops: 3.0,
            },
            // q, k, v, the output and its gradient read, three gradients written.
            ModelOp::Sdpa { .. } => Work {
                flops: 3.0 * forward.flops,
                device_bytes: 12.0 * n * s,
                link_bytes: 0.0,
                ops: 2.0,
            },
            // The gradient read, the table's gradient zeroed and the rows added into it.
            ModelOp::Embedding { num, dim, .. } => backward(3.0 * n * s + (num * dim) as f64 * s, n),
            ModelOp::MlpStep { .. }
            | ModelOp::MlpTrain { .. }
            | ModelOp::AdamW { .. }
            | ModelOp::GptTrain { .. }
            | ModelOp::TrainPipeline { .. } => forward,
        }
    }
}

/// Keys batch entry `b` of an attention row with a key-padding mask sees: all `seq` for every
/// fourth entry, then 1/8, 2/8 and 3/8 of them masked at the end (sequences of four lengths, as
/// a padded batch has). The reference runner builds the same mask.
pub fn key_padding_len(b: usize, seq: usize) -> usize {
    seq - (b % 4) * seq / 8
}

/// The share of keys a key-padding mask leaves over `batch` entries of `seq` keys.
fn key_padding_share(batch: usize, seq: usize) -> f64 {
    let seen: usize = (0..batch).map(|b| key_padding_len(b, seq)).sum();
    seen as f64 / (batch * seq).max(1) as f64
}

/// The environment variable naming what the GPT rows' blocks recompute in backward.
pub const GPT_RECOMPUTE_VAR: &str = "CARTAGE_GPT_RECOMPUTE";

/// What [`GPT_RECOMPUTE_VAR`] asks the GPT rows' blocks to recompute: `None` when it is unset
/// or empty (the model's default), an error naming the choices for any other value.
pub fn gpt_recompute() -> Result<Option<cartage_nn::layers::Recompute>, String> {
    let Ok(value) = std::env::var(GPT_RECOMPUTE_VAR) else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    cartage_nn::layers::Recompute::from_name(&value)
        .map(Some)
        .ok_or_else(|| format!("{GPT_RECOMPUTE_VAR}={value}: expected nothing, norms or norms_and_activation"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_and_attention_count_their_multiply_adds() {
        let conv = ModelOp::Conv2d {
            batch: 1,
            channels_in: 2,
            channels_out: 3,
            side: 4,
            kernel: 3,
            padding: 1,
        };
        // 3 × 4 × 4 outputs, each 2 × 3 × 3 multiply-adds.
        assert_eq!(conv.work(4.0).flops, 2.0 * 48.0 * 18.0);
        let full = ModelOp::Sdpa {
            batch: 1,
            heads: 1,
            seq: 8,
            head_dim: 4,
            causal: false,
            padded: false,
        };
        // QKᵀ and PV: 2 × (8 × 8 × 4) multiply-adds.
        assert_eq!(full.work(2.0).flops, 2.0 * 2.0 * 256.0);
        let causal = ModelOp::Sdpa {
            batch: 1,
            heads: 1,
            seq: 8,
            head_dim: 4,
            causal: true,
            padded: false,
        };
        assert_eq!(causal.work(2.0).flops * 2.0, full.work(2.0).flops);
        assert_eq!(causal.name(), "sdpa_causal");
    }

    #[test]
    fn ops_round_trip_through_json_for_the_reference_runner() {
        let op = ModelOp::Cat {
            parts: 8,
            part_rows: 2048,
            cols: 4096,
        };
        let json = serde_json::to_string(&op).unwrap();
        assert!(json.contains(r#""op":"cat""#), "{json}");
        assert_eq!(serde_json::from_str::<ModelOp>(&json).unwrap(), op);
        assert_eq!(op.numel(), 8 * 2048 * 4096);
    }
}
