//! The cases of the distributed section: an all-reduce across every local GPU, and data-parallel
//! training of the GPT, each run by one process driving one GPU per thread over NCCL.

use serde::{Deserialize, Serialize};

/// One case of the distributed section. Its task lives on `cuda:0`; ranks `0..world` use
/// `cuda:0..cuda:world`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum DistOp {
    /// `all_reduce(sum)` of `bytes` of f32 on every rank, in place (`dist.all_reduce`).
    AllReduce {
        /// Bytes per rank.
        bytes: usize,
        /// Ranks (GPUs).
        world: usize,
    },
    /// One data-parallel training step of `cartage_nn::models::Gpt` (`DataParallel`, AdamW)
    /// with `batch` sequences on each of `world` ranks.
    DdpGpt {
        /// Ranks (GPUs).
        world: usize,
        /// Transformer blocks.
        layers: usize,
        /// Width.
        dim: usize,
        /// Attention heads.
        heads: usize,
        /// Tokens per sequence.
        context: usize,
        /// Sequences per rank and step.
        batch: usize,
        /// Token ids run over `0..vocab`.
        vocab: usize,
    },
}

impl DistOp {
    /// The case's name (`all_reduce`, `ddp_gpt_2gpu`).
    pub fn name(&self) -> String {
        match self {
            DistOp::AllReduce { world, .. } => format!("all_reduce_{world}gpu"),
            DistOp::DdpGpt { world, .. } => format!("ddp_gpt_{world}gpu"),
        }
    }

    /// Bytes per rank (all-reduce) or tokens per step over every rank (DDP).
    pub fn size(&self) -> usize {
        match *self {
            DistOp::AllReduce { bytes, .. } => bytes,
            DistOp::DdpGpt {
                world, context, batch, ..
            } => world * context * batch,
        }
    }

    /// What [`DistOp::size`] counts.
    pub fn size_unit(&self) -> &'static str {
        match self {
            DistOp::AllReduce { .. } => "bytes",
            DistOp::DdpGpt { .. } => "tokens",
        }
    }

    /// The ranks.
    pub fn world(&self) -> usize {
        match *self {
            DistOp::AllReduce { world, .. } | DistOp::DdpGpt { world, .. } => world,
        }
    }
}

/// nccl-tests' bus bandwidth of an all-reduce of `bytes` per rank over `world` ranks taking
/// `seconds`, in GB/s: `2 (n − 1) / n × bytes / time`, what each link carries, comparable across
/// world sizes.
pub fn busbw_gbps(bytes: usize, world: usize, seconds: f64) -> f64 {
    if world == 0 || seconds <= 0.0 {
        return 0.0;
    }
    let n = world as f64;
    2.0 * (n - 1.0) / n * bytes as f64 / seconds / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_nccl_tests_formula() {
        // 1 GB in 10 ms on 2 ranks: algbw 100 GB/s, busbw the same (factor 1).
        assert!((busbw_gbps(1_000_000_000, 2, 0.01) - 100.0).abs() < 1e-9);
        // On 8 ranks the factor is 2 · 7/8 = 1.75.
        assert!((busbw_gbps(1_000_000_000, 8, 0.01) - 175.0).abs() < 1e-9);
        assert_eq!(busbw_gbps(1 << 20, 1, 0.01), 0.0, "one rank moves nothing");
    }

    #[test]
    fn cases_serialise_with_their_op_for_the_reference_runner() {
        let op = DistOp::AllReduce { bytes: 1024, world: 2 };
        let json = serde_json::to_string(&op).unwrap();
        assert!(json.contains(r#""op":"all_reduce""#), "{json}");
        assert_eq!(op.name(), "all_reduce_2gpu");
    }
}
