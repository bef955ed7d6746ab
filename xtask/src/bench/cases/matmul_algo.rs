//! The matmul-library A/B of the precision section: one `[M, K] × [K, N]` product (LLM shapes:
//! a 4096 × 4096 weight times 1, 8, 64 or 512 token columns) run by `cublasGemmEx`, by cuBLASLt
//! with its heuristic's algorithm, and by cuBLASLt with the algorithm search on, each against
//! PyTorch's `torch.matmul` of the same shape in the same run.

use serde::{Deserialize, Serialize};

use super::Work;

/// Which library and selection runs the product (CUDA only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatmulAlgo {
    /// `cublasGemmEx` for the product.
    GemmEx,
    /// cuBLASLt with the heuristic's first algorithm.
    LtHeuristic,
    /// The search on: cuBLASLt's best candidates (and GemmEx) timed once, the fastest kept.
    LtSearch,
}

impl MatmulAlgo {
    /// Every path, in the report's column order.
    pub const ALL: [MatmulAlgo; 3] = [MatmulAlgo::GemmEx, MatmulAlgo::LtHeuristic, MatmulAlgo::LtSearch];

    /// The case name of the path.
    pub fn name(self) -> &'static str {
        match self {
            MatmulAlgo::GemmEx => "matmul_gemmex",
            MatmulAlgo::LtHeuristic => "matmul_lt",
            MatmulAlgo::LtSearch => "matmul_lt_search",
        }
    }
}

/// `[m, k] × [k, n]`, both contiguous, on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatmulShape {
    /// Rows of the left operand (the weight's output features).
    pub m: usize,
    /// The shared dimension.
    pub k: usize,
    /// Columns of the right operand (tokens).
    pub n: usize,
    /// The library and selection.
    pub algo: MatmulAlgo,
}

impl MatmulShape {
    /// The A/B shapes: M = K = 4096 and N in 1, 8, 64, 512.
    pub fn llm_shapes() -> Vec<MatmulShape> {
        [1, 8, 64, 512]
            .into_iter()
            .flat_map(|n| {
                MatmulAlgo::ALL.map(|algo| MatmulShape {
                    m: 4096,
                    k: 4096,
                    n,
                    algo,
                })
            })
            .collect()
    }

    /// `2·M·K·N` flops; each operand read once and the output written once.
    pub fn work(&self, element_bytes: f64) -> Work {
        let (m, k, n) = (self.m as f64, self.k as f64, self.n as f64);
        Work {
            flops: 2.0 * m * k * n,
            device_bytes: (m * k + k * n + m * n) * element_bytes,
            link_bytes: 0.0,
            ops: 1.0,
        }
    }
}
