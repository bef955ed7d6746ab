//! `Sort`: every dtype the backend lists, ascending and descending, along any dim of contiguous,
//! transposed, permuted, narrowed, offset and broadcast inputs into strided output views. Keys
//! sit on a coarse grid (many duplicates) with NaN and ±inf sprinkled into floats, so values
//! AND indices are checked exactly: the sort must be stable in both directions and put NaN
//! above +inf. A broadcast input (every key of a line equal) must give the identity
//! permutation; rows of 2049 and 2500 elements run in every dtype, and a large sort has
//! 2^20 + 1 elements.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};

use super::buffers::sprinkle_specials;
use super::harness::Harness;
use super::reference::Tolerance;
use super::reference_model;
use super::views::{LARGE, ViewKind, view};
use super::{Operand, Spec};

/// Keys with many ties: floats on a 0.5 grid in [-2, 2) with one in eight NaN, +inf or −inf;
/// integers in -3..=3 (0..=3 for u8).
fn sort_operand(h: &Harness, dtype: DType, kind: ViewKind, shape: &[usize]) -> Operand {
    let v = view(kind, shape);
    let mut base = h.random_values(dtype, v.base_len, Spec::new((-2.0, 2.0), (-3, 3)).grid(0.5));
    sprinkle_specials(h, dtype, &mut base, 8);
    h.operand_from(dtype, v, &base)
}

fn sort_case(h: &Harness, dtype: DType, input: &Operand, dim: usize, descending: bool, out_kind: ViewKind) {
    let shape = input.layout.shape().to_vec();
    let (values, values_layout) = h.poisoned_view(dtype, out_kind, &shape);
    let (indices, indices_layout) = h.poisoned_view(DType::I64, out_kind, &shape);
    let what = format!(
        "sort {dtype} {shape:?} dim {dim}{} ({} into {})",
        if descending { " descending" } else { "" },
        input.kind.name(),
        view(out_kind, &shape).kind.name()
    );
    let kernel = Kernel::Sort {
        input: input.arg(),
        dim,
        descending,
        values: values.arg(&values_layout),
        indices: indices.arg(&indices_layout),
    };
    if h.launch(&what, &kernel) {
        let (want_values, want_indices) = reference_model::sort(&shape, &input.values, dim, descending);
        h.check(
            &format!("{what}: values"),
            &values,
            &values_layout,
            &want_values,
            Tolerance::EXACT,
        );
        h.check(
            &format!("{what}: indices"),
            &indices,
            &indices_layout,
            &want_indices,
            Tolerance::EXACT,
        );
    }
}

/// `Sort`: every dtype the backend lists over the case table in both directions, then a large
/// sort.
pub fn sort(h: &Harness) {
    use ViewKind::*;
    // (shape, dim, input view, output view)
    let cases: Vec<(Vec<usize>, usize, ViewKind, ViewKind)> = vec![
        (vec![7], 0, Contiguous, Contiguous),
        (vec![1], 0, Contiguous, Contiguous),
        (vec![0], 0, Contiguous, Contiguous),
        (vec![3, 0], 1, Contiguous, Contiguous),
        (vec![0, 3], 1, Contiguous, Contiguous),
        (vec![33, 5], 0, Contiguous, Transposed),
        (vec![33, 5], 1, Transposed, Contiguous),
        (vec![3, 4, 5], 0, Permuted, Contiguous),
        (vec![3, 4, 5], 1, Contiguous, Narrowed),
        (vec![3, 4, 5], 2, Permuted, Offset),
        (vec![6, 7], 1, Narrowed, Transposed),
        (vec![9, 4], 0, Broadcast, Contiguous),
        (vec![4, 6], 1, Scalar, Contiguous),
        (vec![2, 33], 1, Offset, Narrowed),
        (vec![3, 1000], 1, Contiguous, Contiguous),
        (vec![1025, 2], 0, Contiguous, Contiguous),
        // Rows longer than one GPU block sorts in shared memory (2048).
        (vec![3, 2500], 1, Transposed, Narrowed),
        (vec![2049, 2], 0, Contiguous, Offset),
    ];
    for dtype in DType::ALL {
        if !h.supports(Op::Sort, dtype) {
            let (input, values, indices) = (
                h.upload(dtype, &[1.0; 3]),
                h.poisoned(dtype, 3),
                h.poisoned(DType::I64, 3),
            );
            let kernel = Kernel::Sort {
                input: input.contiguous(&[3]),
                dim: 0,
                descending: false,
                values: values.contiguous(&[3]),
                indices: indices.contiguous(&[3]),
            };
            h.expect_unsupported(&format!("sort {dtype}"), &kernel);
            continue;
        }
        for descending in [false, true] {
            for (shape, dim, kind, out_kind) in &cases {
                let input = sort_operand(h, dtype, *kind, shape);
                sort_case(h, dtype, &input, *dim, descending, *out_kind);
            }
        }
    }
    // Large: 2^20 + 1 keys with heavy duplication (and NaN/±inf), both directions for f32, one
    // for i32.
    for (dtype, directions) in [(DType::F32, &[false, true][..]), (DType::I32, &[true][..])] {
        if h.supports(Op::Sort, dtype) {
            let input = sort_operand(h, dtype, ViewKind::Contiguous, &[LARGE]);
            for &descending in directions {
                sort_case(h, dtype, &input, 0, descending, ViewKind::Contiguous);
            }
        }
    }
}
