//! `Gather` and `IndexSelect` with i32 and i64 indices (strided, broadcast, repeated, empty;
//! whole rows of 3, 768 and 769 elements, from tables on and off a 16-byte boundary), and
//! out-of-range indices (≥ size, negative, beyond 32 bits): `Error::IndexOutOfRange` from
//! the launch or, on an asynchronous device, from the synchronize or read that follows — never
//! garbage — after which the backend still works.

use crate::dtype::DType;
use crate::error::Error;
use crate::kernel::{Kernel, Op};
use crate::layout::Layout;

use super::buffers::{DeviceBuffer, Operand, Spec, encode_ints};
use super::harness::Harness;
use super::reference::{self, Tolerance};
use super::views::{View, ViewKind, view};

pub(super) const INDEX_DTYPES: [DType; 2] = [DType::I32, DType::I64];

/// An index operand of `shape` viewed as `kind`, every value in `0..size`.
fn index_operand(h: &Harness, dtype: DType, kind: ViewKind, shape: &[usize], size: usize) -> Operand {
    let v = view(kind, shape);
    let base: Vec<f64> = (0..v.base_len).map(|_| h.below(size.max(1)) as f64).collect();
    h.operand_from(dtype, v, &base)
}

/// A 1-D index read with stride 2 from offset 1.
fn strided_index(h: &Harness, dtype: DType, n: usize, size: usize) -> Operand {
    let layout = Layout::from_parts(&[n], &[2], 1).expect("small");
    let v = View {
        kind: ViewKind::Narrowed,
        base_len: 2 * n + 1,
        layout,
    };
    let base: Vec<f64> = (0..v.base_len).map(|_| h.below(size) as f64).collect();
    h.operand_from(dtype, v, &base)
}

fn unsupported_selection(h: &Harness, op: Op, dtype: DType) {
    let (input, index, out) = (
        h.upload(dtype, &[1.0; 3]),
        h.upload(DType::I64, &[0.0; 3]),
        h.poisoned(dtype, 3),
    );
    let (input, index, out) = (input.contiguous(&[3]), index.contiguous(&[3]), out.contiguous(&[3]));
    let kernel = if op == Op::Gather {
        Kernel::Gather {
            input,
            index,
            dim: 0,
            out,
        }
    } else {
        Kernel::IndexSelect {
            input,
            index,
            dim: 0,
            out,
        }
    };
    h.expect_unsupported(&format!("{} {dtype}", op.name()), &kernel);
}

/// `Gather` (torch.gather) for every dtype the backend lists and both index dtypes.
pub fn gather(h: &Harness) {
    use ViewKind::*;
    // (input shape, index shape, dim, input view, index view)
    type GatherCase = (Vec<usize>, Vec<usize>, usize, ViewKind, ViewKind);
    let cases: Vec<GatherCase> = vec![
        (vec![5, 7], vec![3, 7], 0, Contiguous, Contiguous),
        (vec![5, 7], vec![5, 4], 1, Transposed, Contiguous),
        (vec![5, 7], vec![2, 3], 1, Contiguous, Transposed),
        (vec![3, 4, 5], vec![3, 6, 5], 1, Permuted, Contiguous),
        (vec![3, 4, 5], vec![2, 4, 3], 2, Contiguous, Permuted),
        (vec![5, 7], vec![0, 7], 0, Contiguous, Contiguous),
        (vec![1], vec![4], 0, Contiguous, Contiguous),
        (vec![6, 7], vec![6, 7], 0, Narrowed, Broadcast),
        (vec![512, 256], vec![512, 256], 1, Offset, Contiguous),
    ];
    for dtype in DType::ALL {
        if !h.supports(Op::Gather, dtype) {
            unsupported_selection(h, Op::Gather, dtype);
            continue;
        }
        for index_dtype in INDEX_DTYPES {
            for (input_shape, index_shape, dim, input_kind, index_kind) in &cases {
                let input = h.operand(dtype, *input_kind, input_shape, Spec::standard());
                let index = index_operand(h, index_dtype, *index_kind, index_shape, input_shape[*dim]);
                let layout = Layout::contiguous(index_shape).expect("small");
                let out = h.poisoned(dtype, layout.numel());
                let what = format!(
                    "gather {dtype} {input_shape:?} ({}) dim {dim} by {index_dtype} {index_shape:?} ({})",
                    input.kind.name(),
                    index.kind.name()
                );
                let kernel = Kernel::Gather {
                    input: input.arg(),
                    index: index.arg(),
                    dim: *dim,
                    out: out.arg(&layout),
                };
                if h.launch(&what, &kernel) {
                    let want = reference::gather(input_shape, &input.values, index_shape, &index.values, *dim);
                    h.check(&what, &out, &layout, &want, Tolerance::EXACT);
                }
            }
        }
    }
}

/// `IndexSelect` for every dtype the backend lists and both index dtypes.
pub fn index_select(h: &Harness) {
    use ViewKind::*;
    // (input shape, index length, dim, input view, index view or None for stride 2)
    type SelectCase = (Vec<usize>, usize, usize, ViewKind, Option<ViewKind>);
    let cases: Vec<SelectCase> = vec![
        (vec![5, 7], 3, 0, Contiguous, Some(Contiguous)),
        (vec![5, 7], 9, 1, Transposed, Some(Contiguous)),
        (vec![3, 4, 5], 6, 1, Permuted, Some(Offset)),
        (vec![5, 7], 0, 0, Contiguous, Some(Contiguous)),
        (vec![5], 4, 0, Offset, Some(Broadcast)),
        (vec![6, 7], 5, 1, Narrowed, None),
        (vec![1024, 64], 2048, 0, Contiguous, Some(Contiguous)),
        // Whole rows (an embedding lookup) of lengths that allow 16-byte words or not, from a
        // table starting off a 16-byte boundary too.
        (vec![37, 768], 50, 0, Contiguous, Some(Contiguous)),
        (vec![37, 769], 50, 0, Offset, Some(Contiguous)),
        (vec![37, 3], 50, 0, Offset, None),
    ];
    for dtype in DType::ALL {
        if !h.supports(Op::IndexSelect, dtype) {
            unsupported_selection(h, Op::IndexSelect, dtype);
            continue;
        }
        for index_dtype in INDEX_DTYPES {
            for (input_shape, n, dim, input_kind, index_kind) in &cases {
                let input = h.operand(dtype, *input_kind, input_shape, Spec::standard());
                let size = input_shape[*dim];
                let index = match index_kind {
                    Some(kind) => index_operand(h, index_dtype, *kind, &[*n], size),
                    None => strided_index(h, index_dtype, *n, size),
                };
                let (out_shape, want) = reference::index_select(input_shape, &input.values, &index.values, *dim);
                let layout = Layout::contiguous(&out_shape).expect("small");
                let out = h.poisoned(dtype, layout.numel());
                let what = format!(
                    "index_select {dtype} {input_shape:?} ({}) dim {dim} by {index_dtype} [{n}] ({})",
                    input.kind.name(),
                    index_kind.map_or("stride 2", |k| k.name())
                );
                let kernel = Kernel::IndexSelect {
                    input: input.arg(),
                    index: index.arg(),
                    dim: *dim,
                    out: out.arg(&layout),
                };
                if h.launch(&what, &kernel) {
                    h.check(&what, &out, &layout, &want, Tolerance::EXACT);
                }
            }
        }
    }
}

/// Launch `kernel` and require `IndexOutOfRange { index: bad, dim, size }` from the launch, the
/// synchronize after it, or the read of `out` (any `dim` when `dim` is `None`).
pub(super) fn expect_out_of_range(
    h: &Harness,
    what: &str,
    kernel: &Kernel,
    out: &DeviceBuffer,
    bad: i64,
    dim: Option<usize>,
    size: usize,
) {
    h.count_check();
    let mut bytes = vec![0u8; out.len * out.dtype.size_in_bytes()];
    let result = h
        .run(kernel)
        .and_then(|()| h.backend().synchronize())
        .and_then(|()| out.raw().read(0, &mut bytes));
    match result {
        Err(Error::IndexOutOfRange {
            index,
            dim: d,
            size: s,
            device,
            ..
        }) => {
            if index != bad || dim.is_some_and(|dim| d != dim) || s != size || device != h.device() {
                let dim = dim.map_or_else(|| "any dim".to_string(), |d| d.to_string());
                h.fail(format!(
                    "{what}: IndexOutOfRange names index {index}, dim {d}, size {s}, {device}; expected {bad}, {dim}, {size}, {}",
                    h.device()
                ));
            }
        }
        Err(e) => h.fail(format!(
            "{what}: expected IndexOutOfRange, got {} error: {e}",
            e.kind_name()
        )),
        Ok(()) => h.fail(format!("{what}: an out-of-range index was accepted")),
    }
}

/// Out-of-range indices of both index dtypes for both ops; the backend keeps working after.
pub fn index_out_of_range(h: &Harness) {
    let Some(dtype) = [DType::F32, DType::I32, DType::F64, DType::I64]
        .into_iter()
        .find(|&d| h.supports(Op::Gather, d) && h.supports(Op::IndexSelect, d))
    else {
        h.fail("no dtype supports both gather and index_select".into());
        return;
    };
    let (rows, cols) = (5usize, 7usize);
    let input = h.operand(dtype, ViewKind::Contiguous, &[rows, cols], Spec::standard());
    for index_dtype in INDEX_DTYPES {
        let mut bad_values = vec![rows as i64, rows as i64 + 7, -1, -(rows as i64), i32::MIN as i64];
        if index_dtype == DType::I64 {
            bad_values.extend([1i64 << 40, (1i64 << 32) + 1]);
        }
        for (trial, &bad) in bad_values.iter().enumerate() {
            // A short index with the bad value at a random place, and a long one with it last.
            let n = if trial % 2 == 0 { 4 } else { 10_000 };
            let mut values: Vec<i64> = (0..n).map(|_| h.below(rows) as i64).collect();
            let at = if n == 4 { h.below(n) } else { n - 1 };
            values[at] = bad;
            let index = h.upload_bytes(index_dtype, &encode_ints(index_dtype, &values));
            // index_select rows of [rows, cols] along dim 0.
            let out = h.poisoned(dtype, n * cols);
            let kernel = Kernel::IndexSelect {
                input: input.arg(),
                index: index.contiguous(&[n]),
                dim: 0,
                out: out.contiguous(&[n, cols]),
            };
            let what = format!("index_select by {index_dtype} [{n}] holding {bad} at {at}");
            expect_out_of_range(h, &what, &kernel, &out, bad, Some(0), rows);
            // gather along dim 1 of [rows, cols] with an index of [rows, n / rows]-ish shape.
            let gather_shape = [1, n];
            let mut gather_values: Vec<i64> = (0..n).map(|_| h.below(cols) as i64).collect();
            let bad_col = if bad == rows as i64 { cols as i64 } else { bad };
            gather_values[at] = bad_col;
            let gather_index = h.upload_bytes(index_dtype, &encode_ints(index_dtype, &gather_values));
            let out = h.poisoned(dtype, n);
            let kernel = Kernel::Gather {
                input: input.arg(),
                index: gather_index.contiguous(&gather_shape),
                dim: 1,
                out: out.contiguous(&gather_shape),
            };
            let what = format!("gather by {index_dtype} {gather_shape:?} holding {bad_col} at {at}");
            expect_out_of_range(h, &what, &kernel, &out, bad_col, Some(1), cols);
        }
        // The backend still works after those errors.
        let index = index_operand(h, index_dtype, ViewKind::Contiguous, &[6], rows);
        let out = h.poisoned(dtype, 6 * cols);
        let layout = Layout::contiguous(&[6, cols]).expect("small");
        let what = format!("index_select by {index_dtype} after out-of-range errors");
        let kernel = Kernel::IndexSelect {
            input: input.arg(),
            index: index.arg(),
            dim: 0,
            out: out.arg(&layout),
        };
        if h.launch(&what, &kernel) {
            let (_, want) = reference::index_select(&[rows, cols], &input.values, &index.values, 0);
            h.check(&what, &out, &layout, &want, Tolerance::EXACT);
        }
    }
}
