//! `Scatter` (scatter, scatter_add), in place on a destination holding random values inside its
//! view and the poison outside it: `Assign` with distinct targets along each line (so the result
//! is determined), `Add` with many duplicate targets (float error allowed by count), the
//! `index_add` form (an index broadcast with stride 0), i32 and i64 indices, strided, offset and
//! broadcast sources, indices and destinations; then out-of-range indices (negative, ≥ size,
//! beyond 32 bits) → `Error::IndexOutOfRange`, after which the backend still works.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op, ScatterMode};
use crate::layout::Layout;

use super::buffers::{encode, encode_ints};
use super::harness::{Harness, POISON};
use super::index::{INDEX_DTYPES, expect_out_of_range};
use super::reference_model;
use super::views::{LARGE, View, ViewKind, offsets, view};
use super::{DeviceBuffer, Operand, Spec};

/// A destination of `shape` viewed as `kind`: random values inside the view, the poison in every
/// other element of its buffer. Returns the buffer, the view and its values (row-major).
fn destination(
    h: &Harness,
    dtype: DType,
    kind: ViewKind,
    shape: &[usize],
    spec: Spec,
) -> (DeviceBuffer, Layout, Vec<f64>) {
    let v = view(kind, shape);
    let base = h.random_values(dtype, v.base_len, spec);
    let size = dtype.size_in_bytes();
    let mut bytes = vec![POISON; v.base_len * size];
    let encoded = encode(dtype, &base);
    let mut values = Vec::with_capacity(v.layout.numel());
    for o in offsets(&v.layout) {
        bytes[o * size..(o + 1) * size].copy_from_slice(&encoded[o * size..(o + 1) * size]);
        values.push(base[o]);
    }
    (h.upload_bytes(dtype, &bytes), v.layout, values)
}

/// An index operand viewed through `v` whose logical values (row-major) are `logical`; buffer
/// elements outside the view hold other valid indices below `size`. `v` must not broadcast.
fn index_from_logical(h: &Harness, dtype: DType, v: View, logical: &[i64], size: usize) -> Operand {
    let mut base: Vec<f64> = (0..v.base_len).map(|_| h.below(size.max(1)) as f64).collect();
    for (o, &x) in offsets(&v.layout).zip(logical) {
        base[o] = x as f64;
    }
    h.operand_from(dtype, v, &base)
}

/// Distinct targets along `dim`: each line of `index_shape` along `dim` holds the first entries
/// of a random permutation of `0..size` (`index_shape[dim] ≤ size`).
fn distinct_targets(h: &Harness, index_shape: &[usize], dim: usize, size: usize) -> Vec<i64> {
    let mut logical = vec![0i64; index_shape.iter().product()];
    for line in reference_model::lines(index_shape, dim) {
        let mut perm: Vec<i64> = (0..size as i64).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, h.below(i + 1));
        }
        for (k, &at) in line.iter().enumerate() {
            logical[at] = perm[k];
        }
    }
    logical
}

/// One scatter case.
struct ScatterCase {
    out: Vec<usize>,
    src: Vec<usize>,
    index: Vec<usize>,
    dim: usize,
    out_kind: ViewKind,
    src_kind: ViewKind,
    /// The index view; `None` for the `index_add` form (a 1-D index broadcast over every dim but
    /// `dim`).
    index_kind: Option<ViewKind>,
}

fn case(
    out: &[usize],
    src: &[usize],
    index: &[usize],
    dim: usize,
    kinds: (ViewKind, ViewKind, Option<ViewKind>),
) -> ScatterCase {
    ScatterCase {
        out: out.to_vec(),
        src: src.to_vec(),
        index: index.to_vec(),
        dim,
        out_kind: kinds.0,
        src_kind: kinds.1,
        index_kind: kinds.2,
    }
}

/// The `index_add` view of `shape`: a 1-D buffer of `shape[dim]` indices, stride 0 elsewhere.
fn index_add_view(shape: &[usize], dim: usize) -> View {
    let mut strides = vec![0; shape.len()];
    strides[dim] = 1;
    View {
        kind: ViewKind::Broadcast,
        base_len: shape[dim],
        layout: Layout::from_parts(shape, &strides, 0).expect("small"),
    }
}

fn assign_cases() -> Vec<ScatterCase> {
    use ViewKind::*;
    vec![
        case(&[5, 7], &[3, 7], &[3, 7], 0, (Contiguous, Contiguous, Some(Contiguous))),
        case(&[5, 7], &[5, 4], &[5, 4], 1, (Transposed, Contiguous, Some(Contiguous))),
        case(&[4, 6], &[5, 8], &[3, 5], 1, (Narrowed, Transposed, Some(Transposed))),
        case(
            &[3, 4, 5],
            &[3, 4, 5],
            &[2, 3, 5],
            2,
            (Offset, Permuted, Some(Permuted)),
        ),
        case(
            &[3, 4, 5],
            &[3, 4, 5],
            &[3, 4, 5],
            0,
            (Contiguous, Contiguous, Some(Offset)),
        ),
        case(&[5, 7], &[6, 7], &[4, 7], 0, (Contiguous, Broadcast, Some(Narrowed))),
        case(&[5, 7], &[0, 7], &[0, 7], 0, (Contiguous, Contiguous, Some(Contiguous))),
        case(&[0, 3], &[0, 3], &[0, 3], 1, (Contiguous, Contiguous, Some(Contiguous))),
        case(&[1], &[1], &[1], 0, (Contiguous, Contiguous, Some(Contiguous))),
        case(
            &[512, 2049],
            &[512, 2049],
            &[512, 2049],
            1,
            (Contiguous, Contiguous, Some(Contiguous)),
        ),
    ]
}

fn add_cases() -> Vec<ScatterCase> {
    use ViewKind::*;
    vec![
        case(
            &[3, 7],
            &[20, 7],
            &[20, 7],
            0,
            (Contiguous, Contiguous, Some(Contiguous)),
        ),
        case(
            &[5, 3],
            &[5, 20],
            &[5, 20],
            1,
            (Transposed, Transposed, Some(Contiguous)),
        ),
        case(
            &[3, 4, 5],
            &[3, 12, 5],
            &[3, 12, 5],
            1,
            (Offset, Permuted, Some(Permuted)),
        ),
        case(&[3, 4], &[20, 4], &[20, 4], 0, (Narrowed, Contiguous, Some(Scalar))),
        case(&[9, 6], &[9, 10], &[9, 10], 1, (Contiguous, Offset, Some(Broadcast))),
        // index_add along dim 0 and 1 (a 1-D index broadcast over the other dim).
        case(&[6, 9], &[10, 9], &[10, 9], 0, (Contiguous, Contiguous, None)),
        case(&[9, 6], &[9, 10], &[9, 10], 1, (Transposed, Broadcast, None)),
        // index_add of whole rows (an embedding's gradient), into a destination off a 16-byte
        // boundary too.
        case(&[7, 769], &[40, 769], &[40, 769], 0, (Contiguous, Contiguous, None)),
        case(&[7, 768], &[40, 768], &[40, 768], 0, (Offset, Offset, None)),
        case(&[5, 7], &[0, 7], &[0, 7], 0, (Contiguous, Contiguous, Some(Contiguous))),
        case(&[1], &[1], &[1], 0, (Contiguous, Contiguous, Some(Contiguous))),
        case(&[1], &[9], &[9], 0, (Contiguous, Contiguous, Some(Contiguous))),
    ]
}

fn scatter_case(
    h: &Harness,
    mode: ScatterMode,
    dtype: DType,
    index_dtype: DType,
    c: &ScatterCase,
    spec: Spec,
    exact: bool,
) {
    let size = c.out[c.dim];
    let (out, out_layout, initial) = destination(h, dtype, c.out_kind, &c.out, spec);
    let src = h.operand(dtype, c.src_kind, &c.src, spec);
    let index = match (mode, c.index_kind) {
        (_, None) => {
            let v = index_add_view(&c.index, c.dim);
            let base: Vec<f64> = (0..v.base_len).map(|_| h.below(size.max(1)) as f64).collect();
            h.operand_from(index_dtype, v, &base)
        }
        (ScatterMode::Add, Some(kind)) => {
            let v = view(kind, &c.index);
            let base: Vec<f64> = (0..v.base_len).map(|_| h.below(size.max(1)) as f64).collect();
            h.operand_from(index_dtype, v, &base)
        }
        (ScatterMode::Assign, Some(kind)) => {
            let logical = distinct_targets(h, &c.index, c.dim, size);
            index_from_logical(h, index_dtype, view(kind, &c.index), &logical, size)
        }
    };
    let what = format!(
        "{} {dtype} out {:?} ({}) dim {} src {:?} ({}) index {index_dtype} {:?} ({})",
        mode.name(),
        c.out,
        view(c.out_kind, &c.out).kind.name(),
        c.dim,
        c.src,
        src.kind.name(),
        c.index,
        c.index_kind.map_or("index_add broadcast", |_| index.kind.name()),
    );
    let kernel = Kernel::Scatter {
        mode,
        src: src.arg(),
        index: index.arg(),
        dim: c.dim,
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, allowed) = reference_model::scatter(
            mode,
            dtype,
            &c.out,
            &initial,
            &c.src,
            &src.values,
            &c.index,
            &index.values,
            c.dim,
        );
        h.check_with(
            &what,
            &out,
            &out_layout,
            &want,
            |i, _| if exact { 0.0 } else { allowed[i] },
        );
    }
}

fn unsupported(h: &Harness, mode: ScatterMode, dtype: DType) {
    let (src, index, out) = (
        h.upload(dtype, &[1.0; 3]),
        h.upload(DType::I64, &[0.0, 1.0, 2.0]),
        h.upload(dtype, &[0.0; 3]),
    );
    let kernel = Kernel::Scatter {
        mode,
        src: src.contiguous(&[3]),
        index: index.contiguous(&[3]),
        dim: 0,
        out: out.contiguous(&[3]),
    };
    h.expect_unsupported(&format!("{} {dtype}", mode.name()), &kernel);
}

/// `Scatter`: both modes × every dtype the backend lists × both index dtypes over the case
/// tables; a large scatter_add of 2^20 + 1 integer-valued sources into 4 targets (exact in any
/// order); then out-of-range indices.
pub fn scatter(h: &Harness) {
    for mode in ScatterMode::ALL {
        let cases = match mode {
            ScatterMode::Assign => assign_cases(),
            ScatterMode::Add => add_cases(),
        };
        for dtype in DType::ALL {
            if !h.supports(Op::Scatter(mode), dtype) {
                unsupported(h, mode, dtype);
                continue;
            }
            for index_dtype in INDEX_DTYPES {
                for c in &cases {
                    let large = c.out.iter().product::<usize>() > 100_000;
                    if large && (dtype != DType::F32 || index_dtype != DType::I64) {
                        continue;
                    }
                    scatter_case(h, mode, dtype, index_dtype, c, Spec::standard(), false);
                }
            }
        }
    }
    let integral = Spec::new((-2.0, 2.0), (-2, 2)).grid(1.0);
    let many = case(
        &[4],
        &[LARGE],
        &[LARGE],
        0,
        (ViewKind::Contiguous, ViewKind::Contiguous, Some(ViewKind::Contiguous)),
    );
    for (dtype, index_dtype) in [(DType::F32, DType::I32), (DType::I32, DType::I64)] {
        if h.supports(Op::Scatter(ScatterMode::Add), dtype) {
            scatter_case(h, ScatterMode::Add, dtype, index_dtype, &many, integral, true);
        }
    }
    scatter_out_of_range(h);
}

/// Out-of-range indices for both modes and index dtypes: `IndexOutOfRange` naming the value,
/// the dim and its size; then a valid scatter still works.
fn scatter_out_of_range(h: &Harness) {
    for mode in ScatterMode::ALL {
        let Some(dtype) = [DType::F32, DType::F64, DType::I32, DType::I64]
            .into_iter()
            .find(|&d| h.supports(Op::Scatter(mode), d))
        else {
            continue;
        };
        let (rows, cols) = (5usize, 7usize);
        for index_dtype in INDEX_DTYPES {
            let mut bad_values = vec![cols as i64, cols as i64 + 7, -1, -(cols as i64), i32::MIN as i64];
            if index_dtype == DType::I64 {
                bad_values.extend([1i64 << 40, (1i64 << 32) + 1]);
            }
            for (trial, &bad) in bad_values.iter().enumerate() {
                // Scatter along dim 1 of [rows, cols]; a short index with the bad value at a
                // random place, or a long one (many duplicates) with it last.
                let n = if trial % 2 == 0 { 3 } else { 2000 };
                let mut values: Vec<i64> = (0..rows * n).map(|_| h.below(cols) as i64).collect();
                let at = if n == 3 { h.below(rows * n) } else { rows * n - 1 };
                values[at] = bad;
                let index = h.upload_bytes(index_dtype, &encode_ints(index_dtype, &values));
                let src = h.upload(dtype, &vec![1.0; rows * n]);
                let out = h.upload(dtype, &vec![0.0; rows * cols]);
                let kernel = Kernel::Scatter {
                    mode,
                    src: src.contiguous(&[rows, n]),
                    index: index.contiguous(&[rows, n]),
                    dim: 1,
                    out: out.contiguous(&[rows, cols]),
                };
                let what = format!(
                    "{} {dtype} by {index_dtype} [{rows}, {n}] holding {bad} at {at}",
                    mode.name()
                );
                expect_out_of_range(h, &what, &kernel, &out, bad, Some(1), cols);
            }
            // The backend still works after those errors.
            let c = case(
                &[rows, cols],
                &[rows, 4],
                &[rows, 4],
                1,
                (ViewKind::Contiguous, ViewKind::Contiguous, Some(ViewKind::Contiguous)),
            );
            scatter_case(h, mode, dtype, index_dtype, &c, Spec::standard(), false);
        }
    }
}
