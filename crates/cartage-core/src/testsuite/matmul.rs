//! `Matmul`: `[B, M, K] × [B, K, N]` for every float dtype the backend lists, with transposed,
//! narrowed, permuted, offset and batch-broadcast (stride 0) operands, empty and `K = 0`
//! products, odd and moderately large sizes; tolerance grows with sqrt(K).

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};
use crate::layout::Layout;

use super::buffers::Spec;
use super::harness::Harness;
use super::reference;
use super::views::ViewKind;

/// `Matmul` cases: `[b, m, k, n]`, lhs view, rhs view.
fn matmul_cases() -> Vec<([usize; 4], ViewKind, ViewKind)> {
    use ViewKind::*;
    vec![
        ([1, 1, 1, 1], Contiguous, Contiguous),
        ([1, 7, 33, 5], Contiguous, Contiguous),
        ([3, 16, 17, 9], Contiguous, Contiguous),
        ([3, 16, 17, 9], Transposed, Contiguous),
        ([3, 16, 17, 9], Contiguous, Transposed),
        ([3, 16, 17, 9], Transposed, Transposed),
        ([4, 5, 6, 7], Broadcast, Contiguous),
        ([4, 5, 6, 7], Contiguous, Broadcast),
        ([2, 9, 8, 7], Narrowed, Offset),
        ([2, 5, 4, 3], Permuted, Permuted),
        ([2, 3, 0, 4], Contiguous, Contiguous),
        ([2, 0, 3, 4], Contiguous, Contiguous),
        ([0, 3, 3, 3], Contiguous, Contiguous),
        ([1, 1, 1000, 1], Contiguous, Transposed),
        ([2, 65, 67, 63], Transposed, Contiguous),
        ([1, 128, 256, 96], Contiguous, Contiguous),
        // Few outputs and a long K (a weight gradient's shape, the left operand transposed):
        // backends may split K into slices summed afterwards.
        ([1, 24, 4096, 20], Transposed, Contiguous),
        ([1, 8, 3000, 12], Contiguous, Transposed),
    ]
}

/// `Matmul` against the f64 reference; every non-float dtype is Unsupported.
pub fn matmul(h: &Harness) {
    for dtype in DType::ALL {
        if !h.supports(Op::Matmul, dtype) {
            let (a, out) = (h.upload(dtype, &[1.0; 4]), h.poisoned(dtype, 4));
            let kernel = Kernel::Matmul {
                lhs: a.contiguous(&[1, 2, 2]),
                rhs: a.contiguous(&[1, 2, 2]),
                out: out.contiguous(&[1, 2, 2]),
            };
            h.expect_unsupported(&format!("matmul {dtype}"), &kernel);
            continue;
        }
        for ([b, m, k, n], lhs_kind, rhs_kind) in matmul_cases() {
            let spec = Spec::new((-1.0, 1.0), (-3, 3));
            let lhs = h.operand(dtype, lhs_kind, &[b, m, k], spec);
            let rhs = h.operand(dtype, rhs_kind, &[b, k, n], spec);
            let layout = Layout::contiguous(&[b, m, n]).expect("small");
            let out = h.poisoned(dtype, layout.numel());
            let what = format!(
                "matmul {dtype} [{b}, {m}, {k}] ({}) × [{b}, {k}, {n}] ({}), precision {}",
                lhs.kind.name(),
                rhs.kind.name(),
                h.backend().matmul_precision().name()
            );
            let kernel = Kernel::Matmul {
                lhs: lhs.arg(),
                rhs: rhs.arg(),
                out: out.arg(&layout),
            };
            if h.launch(&what, &kernel) {
                let (want, allowed) = reference::matmul(dtype, &lhs.values, &rhs.values, [b, m, k, n]);
                h.check_with(&what, &out, &layout, &want, |i, _| allowed[i]);
            }
        }
    }
}
