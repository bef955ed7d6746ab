//! What a run measures: sizes and budgets for the full report and for `--quick`, and the task
//! list for one device (with the tasks its capabilities rule out, as skips).

use std::time::Duration;

use cartage::bench::Bench;
use cartage::{BinaryOp, Capabilities, DType, Op, ReduceOp, UnaryOp};

use super::cases::{Case, MatmulShape, PipelineMode, Section, Task, VectorOp};
use super::report::Skip;

mod distributed;
mod ops;

pub use distributed::cuda_gpus;
pub use ops::OpsSizes;

/// Sizes and budgets of one run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Warm-up, budget and sample counts of every measurement.
    pub budget: Budget,
    /// A task predicted to take longer than this per call is skipped (sweeps stop there).
    pub max_call: Duration,
    /// Matmul sides of the sweep.
    pub sweep_sizes: Vec<usize>,
    /// (count, side) of the tiny-matmul comparison.
    pub small: (usize, usize),
    /// Bytes of each host↔device transfer measured.
    pub transfer_sizes: Vec<usize>,
    /// (fields, bytes per field) of the per-field/packed comparison.
    pub move_batch: (usize, usize),
    /// (batches, bytes per batch) of the pipeline comparison (the width is sized per device).
    pub pipeline: (usize, usize),
    /// (steps, side) of the host-sync loop.
    pub loss_loop: (usize, usize),
    /// (steps, elements of the largest temporary) of the `empty_cache` loop.
    pub alloc_loop: (usize, usize),
    /// Matmul side of the precision comparison.
    pub precision_n: usize,
    /// Elements of the elementwise and reduction inputs.
    pub vector_numel: usize,
    /// Shapes of the ops section.
    pub ops: OpsSizes,
}

/// How long each measurement warms up and samples (shared with the reference runner).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Warm-up time.
    pub warmup: Duration,
    /// At least this many warm-up calls.
    pub min_warmup: u64,
    /// Sampling time.
    pub measure: Duration,
    /// Fewest samples.
    pub min_samples: usize,
    /// Most samples.
    pub max_samples: usize,
    /// Shortest timed region.
    pub min_sample_time: Duration,
}

impl Budget {
    /// The harness configured with this budget.
    pub fn bench(&self) -> Bench {
        Bench::new()
            .warmup(self.warmup)
            .min_warmup_iters(self.min_warmup)
            .budget(self.measure)
            .samples(self.min_samples, self.max_samples)
            .min_sample_time(self.min_sample_time)
    }
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

impl Plan {
    /// The full report, or the smoke run (`quick`): under 3 minutes for CPU + lavapipe on 2 cores.
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                budget: Budget {
                    warmup: Duration::from_millis(10),
                    min_warmup: 2,
                    measure: Duration::from_millis(60),
                    min_samples: 3,
                    max_samples: 15,
                    min_sample_time: Duration::from_micros(500),
                },
                max_call: Duration::from_millis(400),
                sweep_sizes: vec![32, 64, 128, 256, 512],
                small: (1000, 8),
                transfer_sizes: vec![64 * KIB, MIB, 8 * MIB],
                move_batch: (32, 32 * KIB),
                pipeline: (4, MIB),
                loss_loop: (20, 128),
                alloc_loop: (10, MIB),
                precision_n: 512,
                vector_numel: MIB,
                ops: OpsSizes::new(true),
            }
        } else {
            Plan {
                budget: Budget {
                    warmup: Duration::from_millis(100),
                    min_warmup: 2,
                    measure: Duration::from_millis(500),
                    min_samples: 3,
                    max_samples: 100,
                    min_sample_time: Duration::from_millis(1),
                },
                max_call: Duration::from_secs(10),
                sweep_sizes: vec![32, 64, 128, 256, 512, 1024, 2048, 4096],
                small: (1000, 8),
                transfer_sizes: vec![64 * KIB, MIB, 16 * MIB, 256 * MIB],
                move_batch: (32, 32 * KIB),
                pipeline: (8, 16 * MIB),
                loss_loop: (100, 256),
                alloc_loop: (50, 4 * MIB),
                precision_n: 4096,
                vector_numel: 16 * MIB,
                ops: OpsSizes::new(false),
            }
        }
    }

    /// The tasks for one device, in section order, and the tasks its capabilities rule out.
    pub fn tasks(&self, device: &str, device_name: &str, caps: &Capabilities) -> (Vec<Task>, Vec<Skip>) {
        let mut tasks = Vec::new();
        let mut skips = Vec::new();
        let mut add = |section: Section, dtype: DType, case: Case, needs: &[Op]| {
            let task = Task::new(section, device, device_name, dtype.name(), case);
            match needs.iter().find(|op| !caps.supports(**op, dtype)) {
                None => tasks.push(task),
                Some(op) => skips.push(skip(
                    &task,
                    format!("the device has no `{}` kernel for {dtype}", op.name()),
                )),
            }
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &n in &self.sweep_sizes {
                add(Section::Sweep, dtype, Case::Matmul { n, tf32: false }, &[Op::Matmul]);
            }
        }
        let (count, n) = self.small;
        add(
            Section::SmallTensors,
            DType::F32,
            Case::MatmulLoop { count, n },
            &[Op::Matmul],
        );
        add(
            Section::SmallTensors,
            DType::F32,
            Case::MatmulGraph { count, n },
            &[Op::Matmul],
        );
        add(
            Section::SmallTensors,
            DType::F32,
            Case::MatmulBatched { count, n },
            &[Op::Matmul],
        );
        for &bytes in &self.transfer_sizes {
            for pinned in [false, true] {
                add(
                    Section::Transfers,
                    DType::F32,
                    Case::HostToDevice { bytes, pinned },
                    &[],
                );
                add(
                    Section::Transfers,
                    DType::F32,
                    Case::DeviceToHost { bytes, pinned },
                    &[],
                );
            }
        }
        let (fields, field_bytes) = self.move_batch;
        for packed in [false, true] {
            let case = Case::MoveBatch {
                fields,
                field_bytes,
                packed,
            };
            add(Section::Transfers, DType::F32, case, &[]);
        }
        let (batches, batch_bytes) = self.pipeline;
        for mode in [
            PipelineMode::CopyOnly,
            PipelineMode::ComputeOnly,
            PipelineMode::Serial,
            PipelineMode::Prefetch,
            PipelineMode::Loader,
        ] {
            let case = Case::Pipeline {
                batches,
                batch_bytes,
                cols: 0,
                mode,
            };
            add(Section::Transfers, DType::F32, case, &[Op::Matmul]);
        }
        let (steps, n) = self.loss_loop;
        let loss_ops = [Op::Matmul, Op::Reduce(ReduceOp::Sum), Op::Binary(BinaryOp::Add)];
        for read_every_step in [true, false] {
            let case = Case::LossLoop {
                steps,
                n,
                read_every_step,
            };
            add(Section::Syncs, DType::F32, case, &loss_ops);
        }
        let (steps, numel) = self.alloc_loop;
        for empty_cache in [false, true] {
            let case = Case::AllocLoop {
                steps,
                numel,
                empty_cache,
            };
            add(
                Section::Memory,
                DType::F32,
                case,
                &[Op::Fill, Op::Binary(BinaryOp::Add)],
            );
        }
        let n = self.precision_n;
        add(
            Section::Precision,
            DType::F32,
            Case::Matmul { n, tf32: false },
            &[Op::Matmul],
        );
        add(
            Section::Precision,
            DType::F32,
            Case::Matmul { n, tf32: true },
            &[Op::Matmul],
        );
        add(
            Section::Precision,
            DType::F16,
            Case::Matmul { n, tf32: false },
            &[Op::Matmul],
        );
        add(
            Section::Precision,
            DType::BF16,
            Case::Matmul { n, tf32: false },
            &[Op::Matmul],
        );
        for shape in MatmulShape::llm_shapes() {
            add(Section::Precision, DType::BF16, Case::MatmulShape(shape), &[Op::Matmul]);
        }
        for op in [
            VectorOp::Copy,
            VectorOp::Add,
            VectorOp::Mul,
            VectorOp::Exp,
            VectorOp::Relu,
            VectorOp::Gelu,
            VectorOp::SumAll,
            VectorOp::SumRows,
            VectorOp::Softmax,
        ] {
            let case = Case::Vector {
                op,
                numel: self.vector_numel,
            };
            add(Section::Elementwise, DType::F32, case, &[vector_kernel(op)]);
        }
        for dtype in [DType::F16, DType::BF16] {
            for op in [VectorOp::Copy, VectorOp::Add] {
                let case = Case::Vector {
                    op,
                    numel: self.vector_numel,
                };
                add(Section::Elementwise, dtype, case, &[vector_kernel(op)]);
            }
        }
        for (dtype, case, needs) in self.ops.cases(device == "cpu") {
            add(Section::Ops, dtype, case, &needs);
        }
        for (dtype, case, needs) in self.ops.training_cases(device == "cpu") {
            add(Section::Training, dtype, case, &needs);
        }
        let (more, skipped) = self.distributed_tasks(device, device_name, distributed::cuda_gpus());
        tasks.extend(more);
        skips.extend(skipped);
        (tasks, skips)
    }
}

/// The kernel an elementwise case needs.
fn vector_kernel(op: VectorOp) -> Op {
    match op {
        VectorOp::Copy => Op::Copy,
        VectorOp::Add => Op::Binary(BinaryOp::Add),
        VectorOp::Mul => Op::Binary(BinaryOp::Mul),
        VectorOp::Exp => Op::Unary(UnaryOp::Exp),
        VectorOp::Relu => Op::Unary(UnaryOp::Relu),
        VectorOp::Gelu => Op::Unary(UnaryOp::Gelu),
        VectorOp::SumAll | VectorOp::SumRows => Op::Reduce(ReduceOp::Sum),
        VectorOp::Softmax => Op::Softmax,
    }
}

/// A skip record for `task`.
pub fn skip(task: &Task, reason: String) -> Skip {
    Skip {
        id: task.id.clone(),
        section: task.section,
        device: task.device.clone(),
        case: task.case.name(),
        dtype: task.dtype.clone(),
        size: task.case.size(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_half_precision_gets_skips_that_say_why() {
        let caps = Capabilities::all_defined(|op, dtype| op == Op::Matmul && dtype == DType::BF16);
        let (tasks, skips) = Plan::new(true).tasks("wgpu:0", "llvmpipe", &caps);
        assert!(tasks.iter().any(|t| t.id == "wgpu/llvmpipe/matmul_f16_512"));
        assert!(!tasks.iter().any(|t| t.dtype == "bf16" && t.case.name() == "matmul"));
        let bf16 = skips.iter().find(|s| s.id == "wgpu/llvmpipe/matmul_bf16_32").unwrap();
        assert!(bf16.reason.contains("no `matmul` kernel for bf16"), "{}", bf16.reason);
        // The distributed section runs on CUDA GPUs only (its own tests cover its plan).
        for section in Section::ALL.into_iter().skip(1).filter(|&s| s != Section::Distributed) {
            assert!(tasks.iter().any(|t| t.section == section), "{section:?} has no task");
        }
    }

    #[test]
    fn task_names_are_unique_within_a_section() {
        let caps = Capabilities::all_defined(|_, _| false);
        for quick in [false, true] {
            for device in ["cpu", "cuda:0"] {
                let (tasks, _) = Plan::new(quick).tasks(device, "test device", &caps);
                let mut seen = std::collections::HashSet::new();
                for t in &tasks {
                    assert!(seen.insert((t.section, t.id.clone())), "duplicate {}", t.id);
                }
            }
        }
    }
}
