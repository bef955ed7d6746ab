//! The cases the report measures, as plain data: what runs ([`Case`]), on which device and in
//! which section ([`Task`]), and how much work one iteration does ([`Work`]).
//!
//! The same task list drives cartage's measurements and, serialised to JSON, the PyTorch/numpy
//! reference runner (`xtask/python/reference.py`), so both sides run identical cases.

use serde::{Deserialize, Serialize};

mod distributed;
mod matmul_algo;
mod model;

pub use distributed::{DistOp, busbw_gbps};
pub use matmul_algo::{MatmulAlgo, MatmulShape};
pub use model::{ModelOp, gpt_recompute, key_padding_len};

/// The report's sections, in order (the issue's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// 1. Devices and their measured ceilings.
    Devices,
    /// 2. Matmul size sweep and crossover.
    Sweep,
    /// 3. Many tiny matmuls against one batched matmul.
    SmallTensors,
    /// 4. Host↔device transfers, per-field moves, prefetching.
    Transfers,
    /// 5. Reading the loss every step against accumulating on the device.
    Syncs,
    /// 6. `empty_cache` every step against keeping the cache.
    Memory,
    /// 7. Matmul precision: f32, TF32, f16, bf16.
    Precision,
    /// 8. Elementwise ops and reductions against the bandwidth ceiling.
    Elementwise,
    /// 9. The ops a model needs (norms, losses, joins, sorts, scans, convolution, attention,
    ///    embedding), forward and forward + backward, against PyTorch, and on the CPU against numpy.
    Ops,
    /// 10. Training: whole MLP and GPT steps against PyTorch (each run three times per side,
    ///     interleaved), and what backward holds.
    Training,
    /// 11. Several GPUs: all-reduce bus bandwidth and data-parallel scaling.
    Distributed,
}

impl Section {
    /// Every section, in order.
    pub const ALL: [Section; 11] = [
        Section::Devices,
        Section::Sweep,
        Section::SmallTensors,
        Section::Transfers,
        Section::Syncs,
        Section::Memory,
        Section::Precision,
        Section::Elementwise,
        Section::Ops,
        Section::Training,
        Section::Distributed,
    ];

    /// The section's number in the report.
    pub fn number(self) -> usize {
        Section::ALL.iter().position(|&s| s == self).unwrap_or(0) + 1
    }

    /// The section's title.
    pub fn title(self) -> &'static str {
        match self {
            Section::Devices => "Devices and ceilings",
            Section::Sweep => "Matmul size sweep",
            Section::SmallTensors => "Small tensors: 1000 separate 8×8 matmuls against one batched matmul",
            Section::Transfers => "Transfers: pageable against pinned, per-field against packed, prefetching",
            Section::Syncs => "Host syncs: reading the loss every step against accumulating on the device",
            Section::Memory => "Memory: empty_cache every step against keeping the cache",
            Section::Precision => "Precision: matmul in f32, TF32, f16 and bf16",
            Section::Elementwise => "Elementwise ops and reductions against the bandwidth ceiling",
            Section::Ops => {
                "Ops a model needs, forward and forward + backward: norms, losses, cat, sort, cumsum, conv2d, \
                 attention and embedding"
            }
            Section::Training => "Training: MLP and GPT steps, their spread across runs, and backward memory",
            Section::Distributed => "Several GPUs: all-reduce bus bandwidth and data-parallel scaling",
        }
    }

    /// The lessons (docs/LESSONS.md) the section shows.
    pub fn requirements(self) -> &'static str {
        match self {
            Section::Devices => "R1",
            Section::Sweep => "R30",
            Section::SmallTensors => "R3",
            Section::Transfers => "R4, R9, R10",
            Section::Syncs => "R5, R31",
            Section::Memory => "R21",
            Section::Precision => "R24, R32",
            Section::Elementwise => "R1",
            Section::Ops => "R1",
            Section::Training => "R19, R23, R31",
            Section::Distributed => "R1, R19",
        }
    }
}

/// Elementwise and reduction ops of section 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorOp {
    /// `out = x` (a device-to-device copy: the bandwidth ceiling).
    Copy,
    /// `out = x + y`.
    Add,
    /// `out = x * y`.
    Mul,
    /// `out = exp(x)`.
    Exp,
    /// `out = max(x, 0)`.
    Relu,
    /// `out = gelu(x)`.
    Gelu,
    /// The sum of all elements.
    SumAll,
    /// The sum of each row of a square matrix.
    SumRows,
    /// Softmax of each row of a square matrix.
    Softmax,
}

impl VectorOp {
    /// The op's name in case names.
    pub fn name(self) -> &'static str {
        match self {
            VectorOp::Copy => "copy",
            VectorOp::Add => "add",
            VectorOp::Mul => "mul",
            VectorOp::Exp => "exp",
            VectorOp::Relu => "relu",
            VectorOp::Gelu => "gelu",
            VectorOp::SumAll => "sum_all",
            VectorOp::SumRows => "sum_rows",
            VectorOp::Softmax => "softmax",
        }
    }

    /// (elements read, elements written, flops) per element of the input.
    fn traffic(self) -> (f64, f64, f64) {
        match self {
            VectorOp::Copy => (1.0, 1.0, 0.0),
            VectorOp::Add | VectorOp::Mul => (2.0, 1.0, 1.0),
            VectorOp::Exp | VectorOp::Relu => (1.0, 1.0, 1.0),
            VectorOp::Gelu => (1.0, 1.0, 8.0),
            VectorOp::SumAll | VectorOp::SumRows => (1.0, 0.0, 1.0),
            VectorOp::Softmax => (1.0, 1.0, 5.0),
        }
    }
}

/// What one iteration runs. Sizes are in elements unless the name says bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Case {
    /// `[n, n] × [n, n]`; `tf32` asks for the device's fast f32 mode.
    Matmul {
        /// The side.
        n: usize,
        /// TF32 (matmul precision `high`) instead of full f32.
        tf32: bool,
    },
    /// `count` separate `[n, n] × [n, n]` products, one op each.
    MatmulLoop {
        /// How many products.
        count: usize,
        /// The side.
        n: usize,
    },
    /// The same `count` separate products captured once in a CUDA graph and replayed.
    MatmulGraph {
        /// How many products.
        count: usize,
        /// The side.
        n: usize,
    },
    /// The same `count` products as one batched `[count, n, n]` op.
    MatmulBatched {
        /// Batch size.
        count: usize,
        /// The side.
        n: usize,
    },
    /// Host memory to a new device tensor.
    HostToDevice {
        /// Bytes moved.
        bytes: usize,
        /// From pinned memory (asynchronous copy) instead of ordinary pageable memory.
        pinned: bool,
    },
    /// A device tensor back to host memory.
    DeviceToHost {
        /// Bytes moved.
        bytes: usize,
        /// Into pinned memory instead of ordinary pageable memory.
        pinned: bool,
    },
    /// A batch of `fields` small tensors moved one by one, or packed in one buffer and moved once.
    MoveBatch {
        /// Number of fields.
        fields: usize,
        /// Bytes of each field.
        field_bytes: usize,
        /// One move of the packed batch instead of one move per field.
        packed: bool,
    },
    /// `batches` steps of: fill a pinned buffer, copy it to the device, compute on it.
    Pipeline {
        /// Steps per iteration.
        batches: usize,
        /// Bytes per batch (f32 rows of `cols`).
        batch_bytes: usize,
        /// Columns of each batch matrix and side of the weight; 0 until sized at run time
        /// so that one batch's matmul takes about as long as its copy ([`pipeline_cols`]).
        cols: usize,
        /// What each step does: the copy alone, the compute alone, both in series, or both
        /// with the next batch's copy overlapping this batch's compute.
        mode: PipelineMode,
    },
    /// `steps` training-like steps (`loss = sum(x × w)`), reading the loss every step or
    /// accumulating it on the device and reading once.
    LossLoop {
        /// Steps per iteration.
        steps: usize,
        /// Side of the matrices.
        n: usize,
        /// Read the loss back every step (`item()`).
        read_every_step: bool,
    },
    /// `steps` steps allocating temporaries of mixed sizes, with `empty_cache` every step or not.
    AllocLoop {
        /// Steps per iteration.
        steps: usize,
        /// Elements of the largest temporary.
        numel: usize,
        /// Call `empty_cache` at the end of every step.
        empty_cache: bool,
    },
    /// An elementwise op or reduction over `numel` elements (a square matrix for row ops).
    Vector {
        /// The op.
        op: VectorOp,
        /// Elements of the input.
        numel: usize,
    },
    /// An op of the ops section, with its shape.
    Model(ModelOp),
    /// The same op with its backward: the inputs PyTorch computes gradients for are variables,
    /// and each call runs the forward, then backward from a fixed output gradient (from the loss
    /// itself for `cross_entropy`), then frees the gradients.
    ForwardBackward(ModelOp),
    /// A case of the distributed section (several GPUs).
    Distributed(DistOp),
    /// One `[M, K] × [K, N]` product on a chosen matmul library (CUDA's GemmEx/cuBLASLt A/B).
    MatmulShape(MatmulShape),
}

/// What a [`Case::ForwardBackward`]'s name adds to its op's (`layer_norm_fwd_bwd`).
pub const FORWARD_BACKWARD: &str = "_fwd_bwd";

impl Case {
    /// The ops-section op of a [`Case::Model`] or [`Case::ForwardBackward`], with whether the
    /// case runs its backward too.
    pub fn model_op(&self) -> Option<(&ModelOp, bool)> {
        match self {
            Case::Model(op) => Some((op, false)),
            Case::ForwardBackward(op) => Some((op, true)),
            _ => None,
        }
    }
}

/// The parts of a [`Pipeline`](Case::Pipeline) step that run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineMode {
    /// Fill and copy only.
    CopyOnly,
    /// Compute only (the batch already on the device).
    ComputeOnly,
    /// Fill, copy, wait, compute, wait: one after the other.
    Serial,
    /// The next batch's copy runs while this batch computes (double buffers).
    Prefetch,
    /// cartage's `PrefetchLoader` feeding the same compute.
    Loader,
}

impl PipelineMode {
    /// The mode's name in case names.
    pub fn name(self) -> &'static str {
        match self {
            PipelineMode::CopyOnly => "copy_only",
            PipelineMode::ComputeOnly => "compute_only",
            PipelineMode::Serial => "serial",
            PipelineMode::Prefetch => "prefetch",
            PipelineMode::Loader => "loader",
        }
    }
}

/// The work of one iteration, for rates and the roofline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes read and written in device memory.
    pub device_bytes: f64,
    /// Bytes moved between host and device.
    pub link_bytes: f64,
    /// Device operations (launches, copies, host reads) issued: each pays a fixed cost.
    pub ops: f64,
}

/// One measurement to make: a case on a device, in a section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Unique name: `<backend>/<device>/<case>_<dtype>_<size>`.
    pub id: String,
    /// The section it belongs to.
    pub section: Section,
    /// The device (`cpu`, `cuda:0`, `wgpu:0`).
    pub device: String,
    /// The element type.
    pub dtype: String,
    /// What runs.
    pub case: Case,
}

impl Case {
    /// The case's short name, without size or dtype (`matmul`, `h2d_pinned`, `loss_item_every_step`).
    pub fn name(&self) -> String {
        match self {
            Case::Matmul { tf32: false, .. } => "matmul".into(),
            Case::Matmul { tf32: true, .. } => "matmul_tf32".into(),
            Case::MatmulLoop { .. } => "matmul_loop".into(),
            Case::MatmulGraph { .. } => "matmul_graph".into(),
            Case::MatmulBatched { .. } => "matmul_batched".into(),
            Case::HostToDevice { pinned, .. } => format!("h2d_{}", pinned_name(*pinned)),
            Case::DeviceToHost { pinned, .. } => format!("d2h_{}", pinned_name(*pinned)),
            Case::MoveBatch { packed: false, .. } => "move_per_field".into(),
            Case::MoveBatch { packed: true, .. } => "move_packed".into(),
            Case::Pipeline { mode, .. } => format!("pipeline_{}", mode.name()),
            Case::LossLoop {
                read_every_step: true, ..
            } => "loss_item_every_step".into(),
            Case::LossLoop {
                read_every_step: false, ..
            } => "loss_accumulate_on_device".into(),
            Case::AllocLoop { empty_cache: true, .. } => "alloc_empty_cache_every_step".into(),
            Case::AllocLoop { empty_cache: false, .. } => "alloc_keep_cache".into(),
            Case::Vector { op, .. } => op.name().into(),
            Case::Model(op) => op.name().into(),
            Case::ForwardBackward(op) => format!("{}{FORWARD_BACKWARD}", op.name()),
            Case::Distributed(op) => op.name(),
            Case::MatmulShape(s) => s.algo.name().into(),
        }
    }

    /// The case's characteristic size (matrix side, bytes moved, steps or elements).
    pub fn size(&self) -> usize {
        match self {
            Case::Matmul { n, .. } => *n,
            Case::MatmulLoop { count, .. } | Case::MatmulGraph { count, .. } | Case::MatmulBatched { count, .. } => {
                *count
            }
            Case::HostToDevice { bytes, .. } | Case::DeviceToHost { bytes, .. } => *bytes,
            Case::MoveBatch {
                fields, field_bytes, ..
            } => fields * field_bytes,
            Case::Pipeline { batch_bytes, .. } => *batch_bytes,
            Case::LossLoop { steps, .. } | Case::AllocLoop { steps, .. } => *steps,
            Case::Vector { numel, .. } => *numel,
            Case::Model(op) | Case::ForwardBackward(op) => op.numel(),
            Case::Distributed(op) => op.size(),
            Case::MatmulShape(s) => s.n,
        }
    }

    /// What [`Case::size`] counts.
    pub fn size_unit(&self) -> &'static str {
        match self {
            Case::Matmul { .. } => "n",
            Case::MatmulLoop { .. } | Case::MatmulGraph { .. } | Case::MatmulBatched { .. } => "products",
            Case::HostToDevice { .. } | Case::DeviceToHost { .. } | Case::MoveBatch { .. } | Case::Pipeline { .. } => {
                "bytes"
            }
            Case::LossLoop { .. } | Case::AllocLoop { .. } => "steps",
            Case::Vector { .. } | Case::Model(_) | Case::ForwardBackward(_) => "elements",
            Case::Distributed(op) => op.size_unit(),
            Case::MatmulShape(_) => "n (M = K = 4096)",
        }
    }

    /// The work of one iteration for elements of `element_bytes` bytes.
    pub fn work(&self, element_bytes: usize) -> Work {
        let s = element_bytes as f64;
        let matmul = |n: usize, times: usize| {
            let (n, times) = (n as f64, times as f64);
            Work {
                flops: 2.0 * n * n * n * times,
                device_bytes: 3.0 * n * n * s * times,
                link_bytes: 0.0,
                ops: times,
            }
        };
        let link = |bytes: usize, ops: usize| Work {
            link_bytes: bytes as f64,
            ops: ops as f64,
            ..Work::default()
        };
        match self {
            Case::Matmul { n, .. } => matmul(*n, 1),
            Case::MatmulLoop { count, n } => matmul(*n, *count),
            // One launch replays every product.
            Case::MatmulGraph { count, n } => Work {
                ops: 1.0,
                ..matmul(*n, *count)
            },
            Case::MatmulBatched { count, n } => Work {
                ops: 1.0,
                ..matmul(*n, *count)
            },
            Case::HostToDevice { bytes, .. } | Case::DeviceToHost { bytes, .. } => link(*bytes, 1),
            Case::MoveBatch {
                fields,
                field_bytes,
                packed,
            } => link(fields * field_bytes, if *packed { 1 } else { *fields }),
            Case::Pipeline {
                batches,
                batch_bytes,
                cols,
                mode,
            } => {
                let cols = (*cols).max(1);
                let rows = (batch_bytes / 4 / cols) as f64;
                let (batches, cols) = (*batches as f64, cols as f64);
                let compute = Work {
                    flops: 2.0 * rows * cols * cols * batches,
                    device_bytes: 4.0 * (2.0 * rows * cols + cols * cols) * batches,
                    link_bytes: 0.0,
                    ops: batches,
                };
                let copy = link(*batch_bytes * batches as usize, batches as usize);
                match mode {
                    PipelineMode::CopyOnly => copy,
                    PipelineMode::ComputeOnly => compute,
                    PipelineMode::Serial | PipelineMode::Prefetch | PipelineMode::Loader => Work {
                        link_bytes: copy.link_bytes,
                        ops: copy.ops + compute.ops,
                        ..compute
                    },
                }
            }
            // Each step: a matmul, a sum, and an `item()` or an `add`.
            Case::LossLoop { steps, n, .. } => Work {
                ops: 3.0 * *steps as f64,
                ..matmul(*n, *steps)
            },
            // Each step: two fills and an add (and `empty_cache`).
            Case::AllocLoop {
                steps,
                numel,
                empty_cache,
            } => {
                let per_step = 2.0 * (numel + numel / 3) as f64 + 3.0 * (numel / 3) as f64;
                Work {
                    device_bytes: per_step * s * *steps as f64,
                    ops: (if *empty_cache { 4.0 } else { 3.0 }) * *steps as f64,
                    ..Work::default()
                }
            }
            Case::Vector { op, numel } => {
                let (read, written, flops) = op.traffic();
                let n = *numel as f64;
                Work {
                    flops: flops * n,
                    device_bytes: (read + written) * n * s,
                    link_bytes: 0.0,
                    ops: 1.0,
                }
            }
            Case::Model(op) => op.work(s),
            Case::ForwardBackward(op) => op.forward_backward_work(s),
            // Rates of their own (bus bandwidth, tokens/s), reported as counters.
            Case::Distributed(_) => Work::default(),
            Case::MatmulShape(shape) => shape.work(s),
        }
    }
}

/// The pipeline's matrix width for a device with `gflops` of f32 matmul and `link_gbps` of
/// host→device bandwidth: a `[rows, cols] × [cols, cols]` product over a batch of B bytes takes
/// `B · cols / (2 · rate)` seconds and its copy `B / bandwidth`, so `cols = 2 · rate / bandwidth`
/// balances them (a power of two in 16..=4096).
pub fn pipeline_cols(gflops: f64, link_gbps: f64) -> usize {
    let balanced = 2.0 * gflops / link_gbps.max(1e-9);
    let cols = if balanced.is_finite() {
        balanced.clamp(16.0, 4096.0)
    } else {
        256.0
    };
    (cols as usize).next_power_of_two().min(4096)
}

fn pinned_name(pinned: bool) -> &'static str {
    if pinned { "pinned" } else { "pageable" }
}

impl Task {
    /// A task named `<backend>/<device>/<case>_<dtype>_<size>`.
    pub fn new(section: Section, device: &str, device_name: &str, dtype: &str, case: Case) -> Task {
        let op = case.name().replace('_', "-");
        let id = match device.parse::<cartage::Device>() {
            Ok(d) => cartage::bench::bench_name(&d, device_name, &op, dtype, case.size()),
            Err(_) => format!(
                "{device}/{}/{op}_{dtype}_{}",
                cartage::bench::name_segment(device_name),
                case.size()
            ),
        };
        Task {
            id,
            section,
            device: device.to_string(),
            dtype: dtype.to_string(),
            case,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_join_backend_device_case_dtype_and_size() {
        let task = Task::new(
            Section::Sweep,
            "cuda:0",
            "NVIDIA H200",
            "f32",
            Case::Matmul { n: 1024, tf32: false },
        );
        assert_eq!(task.id, "cuda/NVIDIA-H200/matmul_f32_1024");
        let second = Task::new(Section::Sweep, "cuda:1", "NVIDIA H200", "f32", task.case.clone());
        assert_eq!(
            second.id, "cuda/NVIDIA-H200-1/matmul_f32_1024",
            "two identical GPUs get distinct names"
        );
    }

    #[test]
    fn the_pipeline_balances_compute_with_the_copy() {
        // 50 TFLOP/s against 50 GB/s: 2000 columns, as a power of two.
        assert_eq!(pipeline_cols(50_000.0, 50.0), 2048);
        assert_eq!(pipeline_cols(2.0, 3.0), 16, "a slow device gets the narrowest batch");
        assert_eq!(pipeline_cols(1e9, 1.0), 4096);
    }

    #[test]
    fn matmul_work_counts_two_flops_per_multiply_add() {
        let w = Case::Matmul { n: 100, tf32: false }.work(4);
        assert_eq!(w.flops, 2e6);
        assert_eq!(w.device_bytes, 120_000.0);
        let add = Case::Vector {
            op: VectorOp::Add,
            numel: 10,
        }
        .work(2);
        assert_eq!(add.device_bytes, 60.0, "two reads and one write of 2-byte elements");
    }

    #[test]
    fn tasks_round_trip_through_json_for_the_reference_runner() {
        let task = Task::new(
            Section::Transfers,
            "cpu",
            "cpu",
            "f32",
            Case::HostToDevice {
                bytes: 1 << 20,
                pinned: true,
            },
        );
        assert_eq!(
            task.id, "cpu/cpu/h2d-pinned_f32_1048576",
            "`_` separates the fields of a name"
        );
        let json = serde_json::to_string(&task).unwrap();
        assert!(json.contains(r#""kind":"host_to_device""#), "{json}");
        assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), task);
    }
}
