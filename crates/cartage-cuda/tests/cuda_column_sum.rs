//! Sums and means over the leading dimension of a dense matrix (a bias gradient), which run on
//! the column-sum kernel, against a float64 reference: in f32, f16 and bf16, with one slice of
//! rows and with many (the second launch adding the slices), outputs that end inside a block,
//! row counts that are not whole unrolled steps, a 3-D gradient summed over its two leading
//! dimensions, and shapes the kernel leaves to the general reduction (outputs that are not whole
//! 16-byte packs, too few rows).
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use common::{arg, backend, download, poisoned, round, upload, values};

use cartage_core::{DType, Kernel, ReduceOp};

/// (reduced rows, outputs): the GPT's bias gradients, a single slice, column tails, odd row
/// counts, few outputs over many rows, and shapes for the general kernel.
const SHAPES: [(usize, usize); 9] = [
    (16384, 1536),
    (16384, 384),
    (64, 8),
    (1000, 392),
    (777, 40),
    (100_003, 16),
    (1000, 388),
    (3, 8),
    (5000, 6),
];

#[test]
fn sums_and_means_over_the_leading_dimension() {
    let Some(b) = backend("sums_and_means_over_the_leading_dimension") else {
        return;
    };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (reduced, outputs) in SHAPES {
            let x = values(reduced * outputs, (reduced + outputs) as u64, dtype);
            let input = upload(&b, &x, dtype);
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let out = poisoned(&b, outputs, dtype);
                Kernel::Reduce {
                    op,
                    input: arg(&input, &[reduced, outputs], dtype),
                    dims: [0].into_iter().collect(),
                    out: arg(&out, &[1, outputs], dtype),
                }
                .run(&[&input, &out])
                .expect("reduce");
                let want: Vec<f64> = (0..outputs)
                    .map(|c| {
                        let s: f64 = (0..reduced).map(|r| x[r * outputs + c]).sum();
                        round(if op == ReduceOp::Mean { s / reduced as f64 } else { s }, dtype)
                    })
                    .collect();
                let got = download(&out, outputs, dtype);
                // f32 accumulates in f32 over up to 10^5 rows; 16-bit results are rounded once.
                let tol = match dtype {
                    DType::F32 => 1e-4,
                    DType::F16 => 2e-3,
                    _ => 1e-2,
                };
                common::check_within(&format!("{op:?} {dtype} [{reduced}, {outputs}]"), &got, &want, tol);
            }
        }
    }
}

#[test]
fn a_three_dimensional_gradient_summed_over_its_leading_dimensions() {
    let Some(b) = backend("a_three_dimensional_gradient_summed_over_its_leading_dimensions") else {
        return;
    };
    let (batch, tokens, features) = (4, 250, 64);
    let dtype = DType::F32;
    let x = values(batch * tokens * features, 7, dtype);
    let input = upload(&b, &x, dtype);
    let out = poisoned(&b, features, dtype);
    Kernel::Reduce {
        op: ReduceOp::Sum,
        input: arg(&input, &[batch, tokens, features], dtype),
        dims: [0, 1].into_iter().collect(),
        out: arg(&out, &[1, 1, features], dtype),
    }
    .run(&[&input, &out])
    .expect("reduce");
    let want: Vec<f64> = (0..features)
        .map(|c| (0..batch * tokens).map(|r| x[r * features + c]).sum())
        .collect();
    common::check_within(
        "sum over [4, 250] of [4, 250, 64]",
        &download(&out, features, dtype),
        &want,
        1e-4,
    );
}
