//! Property tests of strided kernels: random shapes (rank 0–4, sizes 0–6) reached through random
//! narrows, broadcasts and permutations; a `Copy` between two such views is bit-exact and a
//! `Binary` add of two of them matches the reference. Few cases (32), so GPU backends stay fast;
//! proptest's generator is seeded from the run's seed, so a printed seed replays the same cases.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::dtype::DType;
use crate::kernel::{BinaryOp, Kernel, Op};
use crate::layout::Layout;

use super::buffers::Spec;
use super::harness::Harness;
use super::reference::{self, Tolerance};
use super::views::{View, ViewKind, offsets};

/// How one view of a target shape is built: per pre-permutation dimension, either a broadcast
/// from size 1 or a narrow `[start, start + size)` of a dimension `extra` larger; then a
/// permutation.
#[derive(Clone, Debug)]
struct ViewRecipe {
    /// (broadcast, start, extra) per pre-permutation dimension.
    dims: Vec<(bool, usize, usize)>,
    /// Output dimension `i` is pre-permutation dimension `perm[i]`.
    perm: Vec<usize>,
}

impl ViewRecipe {
    /// The view of `shape` this recipe builds.
    fn build(&self, shape: &[usize]) -> View {
        let rank = shape.len();
        let mut pre = vec![0; rank];
        for (i, &p) in self.perm.iter().enumerate() {
            pre[p] = shape[i];
        }
        let base: Vec<usize> = pre
            .iter()
            .zip(&self.dims)
            .map(|(&size, &(broadcast, start, extra))| if broadcast { 1 } else { size + start + extra })
            .collect();
        let mut layout = Layout::contiguous(&base).expect("small");
        for (d, (&size, &(broadcast, start, _))) in pre.iter().zip(&self.dims).enumerate() {
            if !broadcast {
                layout = layout.narrow(d, start, size).expect("fits by construction");
            }
        }
        let layout = layout
            .broadcast_to(&pre)
            .and_then(|l| l.permute(&self.perm))
            .expect("valid by construction");
        View {
            kind: if layout.is_contiguous() {
                ViewKind::Contiguous
            } else {
                ViewKind::Permuted
            },
            base_len: base.iter().product::<usize>().max(1),
            layout,
        }
    }
}

fn recipe(rank: usize, broadcast: bool) -> impl Strategy<Value = ViewRecipe> {
    (
        Just((0..rank).collect::<Vec<usize>>()).prop_shuffle(),
        proptest::collection::vec(
            (
                proptest::bool::weighted(if broadcast { 0.3 } else { 0.0 }),
                0..=2usize,
                0..=2usize,
            ),
            rank,
        ),
    )
        .prop_map(|(perm, dims)| ViewRecipe { dims, perm })
}

/// A shape, two input recipes (broadcast allowed) and an output recipe (no broadcast).
fn case() -> impl Strategy<Value = (Vec<usize>, ViewRecipe, ViewRecipe, ViewRecipe, usize)> {
    (0..=4usize).prop_flat_map(|rank| {
        (
            proptest::collection::vec(0..=6usize, rank),
            recipe(rank, true),
            recipe(rank, true),
            recipe(rank, false),
            0..4usize,
        )
    })
}

/// Copy and add through random views; on failure, the shrunk case is reported.
pub fn layout_props(h: &Harness) {
    let dtypes: Vec<DType> = [DType::F32, DType::I32, DType::F16, DType::F64]
        .into_iter()
        .filter(|&d| h.supports(Op::Copy, d) && h.supports(Op::Binary(BinaryOp::Add), d))
        .collect();
    if dtypes.is_empty() {
        h.fail("no dtype supports both copy and add".into());
        return;
    }
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&h.next_u64().to_le_bytes());
    }
    let config = Config {
        cases: 32,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&case(), |(shape, lhs, rhs, out, pick)| {
        let dtype = dtypes[pick % dtypes.len()];
        copy_through(h, dtype, &shape, &lhs, &out).map_err(TestCaseError::fail)?;
        add_through(h, dtype, &shape, &lhs, &rhs).map_err(TestCaseError::fail)?;
        Ok(())
    });
    h.count_check();
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, (shape, lhs, rhs, out, pick))) => h.fail(format!(
            "strided views, minimal failing case: shape {shape:?}, lhs {lhs:?}, rhs {rhs:?}, out {out:?}, dtype {:?}: {reason}",
            dtypes[pick % dtypes.len()]
        )),
        Err(e) => h.fail(format!("strided views: {e}")),
    }
}

fn copy_through(h: &Harness, dtype: DType, shape: &[usize], from: &ViewRecipe, to: &ViewRecipe) -> Result<(), String> {
    let (src, dst) = (from.build(shape), to.build(shape));
    let size = dtype.size_in_bytes();
    let base = h.random_bits(dtype, src.base_len);
    let input = h.upload_bytes(dtype, &base);
    let want: Vec<u8> = offsets(&src.layout)
        .flat_map(|o| base[o * size..(o + 1) * size].iter().copied())
        .collect();
    let out = h.poisoned(dtype, dst.base_len);
    let kernel = Kernel::Copy {
        input: input.arg(&src.layout),
        out: out.arg(&dst.layout),
    };
    h.run(&kernel).map_err(|e| format!("copy launch failed: {e}"))?;
    h.compare_bytes(&out, &dst.layout, &want)
        .map_err(|e| format!("copy {:?} → {:?}: {e}", src.layout, dst.layout))
}

fn add_through(h: &Harness, dtype: DType, shape: &[usize], lhs: &ViewRecipe, rhs: &ViewRecipe) -> Result<(), String> {
    let (a, b) = (
        h.operand_from_recipe(dtype, lhs.build(shape)),
        h.operand_from_recipe(dtype, rhs.build(shape)),
    );
    let layout = Layout::contiguous(shape).expect("small");
    let out = h.poisoned(dtype, layout.numel());
    let kernel = Kernel::Binary {
        op: BinaryOp::Add,
        lhs: a.arg(),
        rhs: b.arg(),
        out: out.arg(&layout),
    };
    h.run(&kernel).map_err(|e| format!("add launch failed: {e}"))?;
    let want: Vec<f64> = a
        .values
        .iter()
        .zip(&b.values)
        .map(|(&x, &y)| reference::binary(BinaryOp::Add, dtype, x, y))
        .collect();
    let tol = Tolerance::of(dtype);
    h.compare(&out, &layout, &want, |_, w| tol.allowed(w))
        .map_err(|e| format!("add {:?} + {:?}: {e}", a.layout, b.layout))
}

impl Harness {
    /// An operand with random standard values over the buffer of `v`.
    fn operand_from_recipe(&self, dtype: DType, v: View) -> super::Operand {
        let base = self.random_values(dtype, v.base_len, Spec::standard());
        self.operand_from(dtype, v, &base)
    }
}
