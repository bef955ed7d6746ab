//! The distributed section's tasks: an all-reduce sweep over every local GPU and the GPT trained
//! data-parallel on one GPU and on all of them. They belong to `cuda:0` (rank 0's device). With
//! fewer than two CUDA GPUs the multi-GPU tasks are skipped with the reason, and the one-GPU DDP
//! step still runs (NCCL with a world of one, through the whole data-parallel path); with none,
//! the CPU row says why the section is empty.

use std::sync::OnceLock;

use cartage::DeviceKind;

use super::{KIB, MIB, Plan, skip};
use crate::bench::cases::{Case, DistOp, Section, Task};
use crate::bench::report::Skip;

/// CUDA GPUs this process can open (asked once).
pub fn cuda_gpus() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        cartage::runtime::devices()
            .iter()
            .filter(|d| d.device.kind() == DeviceKind::Cuda)
            .count()
    })
}

/// All-reduce sizes per rank: 1 KiB to 1 GiB in steps of 4 (three sizes in a quick run).
fn sweep(quick: bool) -> Vec<usize> {
    if quick {
        vec![KIB, MIB, 16 * MIB]
    } else {
        (0..11).map(|i| KIB << (2 * i)).collect()
    }
}

impl Plan {
    /// The distributed tasks of `device` (and skips), given `gpus` CUDA GPUs on the machine.
    pub(super) fn distributed_tasks(&self, device: &str, device_name: &str, gpus: usize) -> (Vec<Task>, Vec<Skip>) {
        let (mut tasks, mut skips) = (Vec::new(), Vec::new());
        let task = |op: DistOp| Task::new(Section::Distributed, device, device_name, "f32", Case::Distributed(op));
        if device == "cpu" && gpus == 0 {
            let t = task(DistOp::AllReduce { bytes: MIB, world: 2 });
            skips.push(skip(
                &t,
                "no CUDA GPU: the all-reduce sweep and DDP scaling run over NCCL on CUDA GPUs (two or more for \
                 the multi-GPU rows)"
                    .into(),
            ));
        }
        if device != "cuda:0" {
            return (tasks, skips);
        }
        let (layers, dim, heads, context, batch) = self.ops.gpt[0];
        let gpt = |world| DistOp::DdpGpt {
            world,
            layers,
            dim,
            heads,
            context,
            batch,
            vocab: 128,
        };
        tasks.push(task(gpt(1)));
        // A quick run takes at most 15 samples per case; the full report up to 100.
        let quick = self.budget.max_samples < 50;
        let multi: Vec<DistOp> = sweep(quick)
            .into_iter()
            .map(|bytes| DistOp::AllReduce {
                bytes,
                world: gpus.max(2),
            })
            .chain([gpt(gpus.max(2))])
            .collect();
        for op in multi {
            if gpus >= 2 {
                tasks.push(task(op));
            } else {
                skips.push(skip(
                    &task(op),
                    format!(
                        "needs at least 2 CUDA GPUs; this machine has {gpus}: multi-GPU all-reduce and DDP rows \
                         are skipped (the one-GPU DDP row still runs)"
                    ),
                ));
            }
        }
        (tasks, skips)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gpu_runs_the_one_gpu_step_and_says_why_the_rest_is_skipped() {
        let plan = Plan::new(true);
        let (tasks, skips) = plan.distributed_tasks("cuda:0", "NVIDIA H200", 1);
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].case.name(), "ddp_gpt_1gpu");
        assert!(!skips.is_empty());
        assert!(skips.iter().all(|s| s.reason.contains("needs at least 2 CUDA GPUs")));
        let (tasks, skips) = plan.distributed_tasks("cuda:1", "NVIDIA H200", 1);
        assert!(
            tasks.is_empty() && skips.is_empty(),
            "rank 0's device holds the section"
        );
    }

    #[test]
    fn two_gpus_sweep_the_all_reduce_and_scale_ddp() {
        let (tasks, skips) = Plan::new(false).distributed_tasks("cuda:0", "NVIDIA H200", 2);
        assert!(skips.is_empty());
        let sizes: Vec<usize> = tasks
            .iter()
            .filter(|t| t.case.name() == "all_reduce_2gpu")
            .map(|t| t.case.size())
            .collect();
        assert_eq!((sizes[0], *sizes.last().unwrap()), (KIB, 1 << 30), "1 KiB to 1 GiB");
        assert!(tasks.iter().any(|t| t.case.name() == "ddp_gpt_2gpu"));
        assert!(tasks.iter().any(|t| t.case.name() == "ddp_gpt_1gpu"));
    }

    #[test]
    fn without_a_gpu_the_cpu_row_says_why() {
        let (tasks, skips) = Plan::new(true).distributed_tasks("cpu", "cpu", 0);
        assert!(tasks.is_empty());
        assert!(skips[0].reason.starts_with("no CUDA GPU"), "{}", skips[0].reason);
    }
}
