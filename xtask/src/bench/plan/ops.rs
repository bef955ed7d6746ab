//! The ops section's shapes for the full report and for `--quick`, and its task list: on a GPU
//! every op against PyTorch, forward and forward + backward; on the CPU `layer_norm`, `softmax`
//! and `exp` against numpy, forward and forward + backward.

use cartage::{DType, NormKind, Op, ReduceOp, ScanOp, UnaryOp};

use crate::bench::cases::{Case, ModelOp};

/// The shapes of the ops section.
#[derive(Clone, Debug)]
pub struct OpsSizes {
    /// Rows of the norms, softmaxes, cross-entropy and `exp` (each row holds `cols`).
    pub rows: usize,
    /// Elements per row (4096, a transformer's hidden size).
    pub cols: usize,
    /// Rows of the CPU's rows-of-4096 cases (CPU memory bandwidth is far lower).
    pub cpu_rows: usize,
    /// (parts, rows of each part) of `cat`, each part `[rows, cols]`.
    pub cat: (usize, usize),
    /// Elements sorted.
    pub sort: usize,
    /// (rows, cols) of `cumsum` along the last dim.
    pub cumsum: (usize, usize),
    /// (batch, channels, side) of the 3×3 convolution (channels in = out, padding 1).
    pub conv: (usize, usize, usize),
    /// (batch, heads, seq, head dim) of causal attention in bf16.
    pub sdpa: (usize, usize, usize, usize),
    /// (batch, heads, seq, head dim) of causal attention in f32.
    pub sdpa_f32: (usize, usize, usize, usize),
    /// (rows, classes) of the cross-entropy over a language model's vocabulary.
    pub cross_entropy_vocab: (usize, usize),
    /// (rows of the table, width, sequences, ids per sequence) of the embedding lookup.
    pub embedding: (usize, usize, usize, usize),
    /// (layers, width, batch) of the training steps: compute-bound, then launch-bound.
    pub mlp: [(usize, usize, usize); 2],
    /// (layers, width, batch) of the whole training step with AdamW.
    pub mlp_train: (usize, usize, usize),
    /// (elements, tensors) of the AdamW step alone, on a GPU and on the CPU.
    pub adamw: [(usize, usize); 2],
    /// (layers, width, heads, context, batch) of the GPT step, on a GPU and on the CPU.
    pub gpt: [(usize, usize, usize, usize, usize); 2],
    /// (layers, width, heads, context, batch, vocab) of the second GPT step, on a GPU only:
    /// longer sequences and a vocabulary of sub-word size, where attention and the head weigh
    /// more.
    pub gpt_wide: (usize, usize, usize, usize, usize, usize),
}

impl OpsSizes {
    /// The shapes, or small ones for the smoke run.
    pub fn new(quick: bool) -> OpsSizes {
        if quick {
            OpsSizes {
                rows: 64,
                cols: 4096,
                cpu_rows: 64,
                cat: (4, 64),
                sort: 1 << 16,
                cumsum: (64, 4096),
                conv: (2, 16, 28),
                sdpa: (1, 2, 256, 64),
                sdpa_f32: (1, 2, 128, 64),
                cross_entropy_vocab: (64, 32000),
                embedding: (1024, 64, 2, 64),
                mlp: [(4, 512, 64), (4, 64, 64)],
                mlp_train: (3, 128, 64),
                adamw: [(1 << 20, 8), (1 << 18, 4)],
                gpt: [(1, 64, 2, 32, 4), (1, 32, 2, 16, 2)],
                gpt_wide: (1, 64, 2, 64, 4, 256),
            }
        } else {
            OpsSizes {
                rows: 8192,
                cols: 4096,
                cpu_rows: 2048,
                // 8 parts of 32 MiB in f32.
                cat: (8, 2048),
                sort: 1 << 20,
                cumsum: (4096, 4096),
                conv: (32, 64, 56),
                sdpa: (8, 16, 1024, 64),
                sdpa_f32: (8, 16, 512, 64),
                // A GPT-2-sized vocabulary's logits, rounded.
                cross_entropy_vocab: (8192, 32000),
                // GPT-2's token table (50257 rounded up to a multiple of 64), 16 × 1024 ids.
                embedding: (50304, 768, 16, 1024),
                mlp: [(4, 4096, 256), (4, 256, 256)],
                mlp_train: (4, 1024, 512),
                // The 100M parameters, as 100 tensors of 1M.
                adamw: [(100_000_000, 100), (1 << 24, 16)],
                // The GPT: 6 layers, d = 384, 6 heads, context 256, batch 64.
                gpt: [(6, 384, 6, 256, 64), (2, 128, 4, 64, 8)],
                gpt_wide: (4, 512, 8, 512, 16, 8192),
            }
        }
    }

    /// The training section's cases: the MLP steps in f32 and bf16 on a GPU, the launch-bound
    /// one in f32 on the CPU; the whole AdamW step in f32 everywhere and under bf16 autocast on
    /// a GPU; the R31 breakdown of the f32 step; the AdamW update alone.
    pub fn training_cases(&self, cpu: bool) -> Vec<(DType, Case, Vec<Op>)> {
        let needs = [Op::Matmul, Op::Unary(UnaryOp::Relu), Op::Reduce(ReduceOp::Mean)];
        let mut out = Vec::new();
        for (i, &(layers, width, batch)) in self.mlp.iter().enumerate() {
            let dtypes: &[DType] = if cpu { &[DType::F32] } else { &[DType::F32, DType::BF16] };
            if cpu && i == 0 {
                continue;
            }
            for &dtype in dtypes {
                out.push((
                    dtype,
                    Case::Model(ModelOp::MlpStep { layers, width, batch }),
                    needs.to_vec(),
                ));
            }
        }
        let (layers, width, batch) = self.mlp_train;
        for autocast in [false, true] {
            if cpu && autocast {
                continue;
            }
            let op = ModelOp::MlpTrain {
                layers,
                width,
                batch,
                autocast,
            };
            let mut needs = needs.to_vec();
            needs.push(Op::CrossEntropy);
            out.push((DType::F32, Case::Model(op), needs.clone()));
            if !autocast {
                let pipeline = ModelOp::TrainPipeline { layers, width, batch };
                out.push((DType::F32, Case::Model(pipeline), needs));
            }
        }
        let gpt_needs = vec![Op::Matmul, Op::Norm(NormKind::Layer), Op::CrossEntropy, Op::Softmax];
        let (layers, dim, heads, context, batch) = self.gpt[usize::from(cpu)];
        for (autocast, graph) in [(false, false), (true, false), (false, true), (true, true)] {
            // The CPU runs f32 eagerly only (no bf16 matmul worth timing, no graphs).
            if cpu && (autocast || graph) {
                continue;
            }
            let op = ModelOp::GptTrain {
                layers,
                dim,
                heads,
                context,
                batch,
                vocab: 128,
                autocast,
                graph,
            };
            out.push((DType::F32, Case::Model(op), gpt_needs.clone()));
        }
        if !cpu {
            let (layers, dim, heads, context, batch, vocab) = self.gpt_wide;
            for autocast in [false, true] {
                let op = ModelOp::GptTrain {
                    layers,
                    dim,
                    heads,
                    context,
                    batch,
                    vocab,
                    autocast,
                    graph: false,
                };
                out.push((DType::F32, Case::Model(op), gpt_needs.clone()));
            }
        }
        let (params, tensors) = self.adamw[usize::from(cpu)];
        out.push((
            DType::F32,
            Case::Model(ModelOp::AdamW { params, tensors }),
            vec![Op::Binary(cartage::BinaryOp::Mul)],
        ));
        out
    }

    /// The section's cases on a device (`cpu` or not), each with its dtype and the kernels it
    /// needs. Every op with a gradient ([`ModelOp::differentiable`]) comes twice, forward alone
    /// and then forward + backward ([`Case::ForwardBackward`]), so the report can set the two
    /// side by side.
    pub fn cases(&self, cpu: bool) -> Vec<(DType, Case, Vec<Op>)> {
        let cols = self.cols;
        let mut out = Vec::new();
        let mut add = |dtype: DType, op: ModelOp, needs: &[Op]| {
            let differentiable = op.differentiable();
            out.push((dtype, Case::Model(op.clone()), needs.to_vec()));
            if differentiable {
                out.push((dtype, Case::ForwardBackward(op), needs.to_vec()));
            }
        };
        if cpu {
            let rows = self.cpu_rows;
            add(
                DType::F32,
                ModelOp::LayerNorm { rows, cols },
                &[Op::Norm(NormKind::Layer)],
            );
            add(DType::F32, ModelOp::Softmax { rows, cols }, &[Op::Softmax]);
            add(DType::F32, ModelOp::Exp { rows, cols }, &[Op::Unary(UnaryOp::Exp)]);
            return out;
        }
        let rows = self.rows;
        let (ce_rows, vocab) = self.cross_entropy_vocab;
        let cross_entropy_needs = [Op::CrossEntropy, Op::Reduce(ReduceOp::Mean)];
        for dtype in [DType::F32, DType::BF16] {
            add(dtype, ModelOp::LayerNorm { rows, cols }, &[Op::Norm(NormKind::Layer)]);
            add(dtype, ModelOp::RmsNorm { rows, cols }, &[Op::Norm(NormKind::Rms)]);
            add(dtype, ModelOp::Softmax { rows, cols }, &[Op::Softmax]);
            add(dtype, ModelOp::LogSoftmax { rows, cols }, &[Op::LogSoftmax]);
            add(dtype, ModelOp::CrossEntropy { rows, cols }, &cross_entropy_needs);
            let vocab = ModelOp::CrossEntropy {
                rows: ce_rows,
                cols: vocab,
            };
            add(dtype, vocab, &cross_entropy_needs);
        }
        let (parts, part_rows) = self.cat;
        add(DType::F32, ModelOp::Cat { parts, part_rows, cols }, &[Op::Copy]);
        add(DType::F32, ModelOp::Sort { numel: self.sort }, &[Op::Sort]);
        let (rows, cols) = self.cumsum;
        add(DType::F32, ModelOp::Cumsum { rows, cols }, &[Op::Scan(ScanOp::Sum)]);
        let (batch, channels, side) = self.conv;
        for dtype in [DType::F32, DType::BF16] {
            let conv = ModelOp::Conv2d {
                batch,
                channels_in: channels,
                channels_out: channels,
                side,
                kernel: 3,
                padding: 1,
            };
            add(dtype, conv, &[Op::Matmul]);
        }
        for dtype in [DType::F32, DType::BF16] {
            // The stem pooling of a ResNet: 3×3, stride 2, padding 1, after the 7×7 convolution.
            let pool = ModelOp::MaxPool2d {
                batch,
                channels,
                side: 2 * side,
                kernel: 3,
                stride: 2,
                padding: 1,
            };
            add(dtype, pool, &[Op::Reduce(ReduceOp::Max)]);
        }
        for (dtype, (batch, heads, seq, head_dim)) in [(DType::BF16, self.sdpa), (DType::F32, self.sdpa_f32)] {
            let sdpa = ModelOp::Sdpa {
                batch,
                heads,
                seq,
                head_dim,
                causal: true,
                padded: false,
            };
            add(dtype, sdpa, &[Op::Matmul, Op::Softmax]);
            // The same shape with a key-padding mask (an encoder's padded batch, no causal mask).
            let padded = ModelOp::Sdpa {
                batch,
                heads,
                seq,
                head_dim,
                causal: false,
                padded: true,
            };
            add(dtype, padded, &[Op::Matmul, Op::Softmax]);
        }
        let (num, dim, batch, seq) = self.embedding;
        add(
            DType::F32,
            ModelOp::Embedding { num, dim, batch, seq },
            &[Op::IndexSelect],
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ops of `cases` as (forward, with backward) pairs in order: every forward case of a
    /// differentiable op must be followed by its forward + backward case.
    fn paired(cases: &[(DType, Case, Vec<Op>)]) -> Vec<(DType, ModelOp)> {
        let mut out = Vec::new();
        let mut iter = cases.iter().peekable();
        while let Some((dtype, case, _)) = iter.next() {
            let Case::Model(op) = case else {
                panic!("a forward + backward case without its forward one: {case:?}");
            };
            if op.differentiable() {
                let next = iter.next().map(|(d, c, _)| (*d, c.clone()));
                assert_eq!(
                    next,
                    Some((*dtype, Case::ForwardBackward(op.clone()))),
                    "{op:?} is not followed by its backward"
                );
                out.push((*dtype, op.clone()));
            }
        }
        out
    }

    #[test]
    fn every_differentiable_op_comes_forward_and_with_its_backward() {
        for quick in [false, true] {
            let sizes = OpsSizes::new(quick);
            let gpu = paired(&sizes.cases(false));
            let has = |name: &str, dtype: DType| gpu.iter().any(|(d, op)| op.name() == name && *d == dtype);
            for dtype in [DType::F32, DType::BF16] {
                for name in [
                    "layer_norm",
                    "rms_norm",
                    "cross_entropy",
                    "conv2d",
                    "sdpa_causal",
                    "softmax",
                ] {
                    assert!(has(name, dtype), "{name} {dtype} (quick: {quick})");
                }
            }
            assert!(has("embedding", DType::F32) && has("cat", DType::F32) && has("max_pool2d", DType::BF16));
            let vocab = gpu
                .iter()
                .filter(|(_, op)| matches!(op, ModelOp::CrossEntropy { cols: 32000, .. }))
                .count();
            assert_eq!(vocab, 2, "the vocabulary-sized cross-entropy in f32 and bf16");
            let cpu = paired(&sizes.cases(true));
            let names: Vec<&str> = cpu.iter().map(|(_, op)| op.name()).collect();
            assert_eq!(names, ["layer_norm", "softmax", "exp"]);
        }
        let full = OpsSizes::new(false);
        let shapes: Vec<ModelOp> = paired(&full.cases(false)).into_iter().map(|(_, op)| op).collect();
        for wanted in [
            ModelOp::Sdpa {
                batch: 8,
                heads: 16,
                seq: 1024,
                head_dim: 64,
                causal: true,
                padded: false,
            },
            ModelOp::Sdpa {
                batch: 8,
                heads: 16,
                seq: 512,
                head_dim: 64,
                causal: true,
                padded: false,
            },
            ModelOp::Embedding {
                num: 50304,
                dim: 768,
                batch: 16,
                seq: 1024,
            },
            ModelOp::CrossEntropy {
                rows: 8192,
                cols: 32000,
            },
            ModelOp::LayerNorm { rows: 8192, cols: 4096 },
        ] {
            assert!(shapes.contains(&wanted), "{wanted:?}");
        }
    }

    #[test]
    fn the_second_gpt_runs_on_a_gpu_in_f32_and_under_autocast_only() {
        let wide = |cases: Vec<(DType, Case, Vec<Op>)>| -> Vec<bool> {
            cases
                .into_iter()
                .filter_map(|(_, case, _)| match case {
                    Case::Model(ModelOp::GptTrain {
                        layers: 4,
                        dim: 512,
                        heads: 8,
                        context: 512,
                        batch: 16,
                        vocab: 8192,
                        autocast,
                        graph: false,
                    }) => Some(autocast),
                    _ => None,
                })
                .collect()
        };
        let full = OpsSizes::new(false);
        assert_eq!(wide(full.training_cases(false)), [false, true]);
        assert!(wide(full.training_cases(true)).is_empty(), "not on the CPU");
    }
}
