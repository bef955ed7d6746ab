//! The row form of `IndexSelect` (an embedding lookup is one) and of the `index_add` form of
//! `Scatter` (`Add` with an index broadcast over every dimension but `dim`, the backward of
//! `index_select` and `embedding`).
//!
//! When the dimensions after `dim` are dense in both operands and those before it merge into one,
//! every index entry moves a whole contiguous row. A group of up to 32 lanes (a warp, or part of
//! one for short rows) takes a row, or a chunk of a long one: its first lane reads the index once
//! and checks it, and the others receive that very value through a warp shuffle, so the rule of
//! the general kernels holds (each index value read once per use and checked before it is
//! followed; an out-of-range one is recorded in the fault record and becomes
//! `Error::IndexOutOfRange` on the host). A selected row is copied in words of 16, 8, 4, 2 or 1
//! bytes, the widest that both base addresses, every stride and the row's length allow, with
//! up to eight independent loads in flight per lane; `index_add` adds element by element with the
//! general scatter's atomics. Anything else runs the general kernels of `index.rs`.

use cartage_core::{DType, TensorArg};
use cudarc::driver::DeviceRepr;

use super::geometry::grid;
use super::{device_ptr, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// Units (words or elements) a lane moves per chunk of a long row, in fours:
/// a 32-lane group moves at most 2048 units per task, so long rows spread over many groups.
const CHUNK_ROUNDS: u64 = 16;

/// `struct RowGeom` of index.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RowGeom {
    tasks: u64,
    count: u64,
    chunks: u64,
    row_len: u64,
    chunk_len: u64,
    src_outer: i64,
    dst_outer: i64,
    src_step: i64,
    dst_step: i64,
    index_stride: i64,
    dim_size: u64,
    group: u32,
    pad: u32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for RowGeom {}

impl RowGeom {
    /// Chunks of rows to move (0 when there is nothing to do).
    pub(super) fn tasks(&self) -> u64 {
        self.tasks
    }
}

/// Operands seen as rows, in elements: `outer` × `count` positions of `row` contiguous elements;
/// `*_outer` are the strides of the merged dimensions before `dim`, `*_step` those of `dim`
/// (`src` is the operand read, `dst` the one written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rows {
    outer: usize,
    count: usize,
    row: usize,
    src_outer: usize,
    dst_outer: usize,
    src_step: usize,
    dst_step: usize,
}

impl Rows {
    /// `shape` (the positions: the output's for a selection, the index's for a scatter) as rows
    /// along `dim`, or `None` when a row is not contiguous in both operands or the dimensions
    /// before `dim` do not merge into one. `src` and `dst` are each operand's strides over
    /// `shape`'s dimensions (the one of `dim` is taken as it is).
    pub(super) fn of(shape: &[usize], dim: usize, src: &[usize], dst: &[usize]) -> Option<Rows> {
        let inner = cartage_core::layout::coalesce(&shape[dim + 1..], &[&src[dim + 1..], &dst[dim + 1..]]);
        let row = match inner.shape.as_slice() {
            [] => 1,
            [n] if inner.strides.iter().all(|s| s[0] == 1) => *n,
            _ => return None,
        };
        let before = cartage_core::layout::coalesce(&shape[..dim], &[&src[..dim], &dst[..dim]]);
        let (outer, src_outer, dst_outer) = match before.shape.as_slice() {
            [] => (1, 0, 0),
            [n] => (*n, before.strides[0][0], before.strides[1][0]),
            _ => return None,
        };
        Some(Rows {
            outer,
            count: shape[dim],
            row,
            src_outer,
            dst_outer,
            src_step: src[dim],
            dst_step: dst[dim],
        })
    }

    /// For a selection from a source of `dim_size` entries along `dim`: the widest word (16, 8,
    /// 4, 2 or 1 bytes) that divides both addresses, the row's bytes and every stride in bytes of
    /// `size`-byte elements. Strides that never move (a dimension of one entry, or an outer size
    /// of one) do not count. Core's validation aligns every view to its element, so the word is
    /// never narrower than `size`.
    fn word(&self, size: usize, addrs: [u64; 2], dim_size: usize) -> usize {
        let (src_k, dst_k) = (dim_size, self.count);
        let moving = |extent: usize, stride: usize| if extent > 1 { stride } else { 0 };
        let quantities = [
            self.row * size,
            moving(self.outer, self.src_outer) * size,
            moving(self.outer, self.dst_outer) * size,
            moving(src_k, self.src_step) * size,
            moving(dst_k, self.dst_step) * size,
        ];
        [16usize, 8, 4, 2, 1]
            .into_iter()
            .find(|&w| {
                addrs.iter().all(|a| a.is_multiple_of(w as u64)) && quantities.iter().all(|q| q.is_multiple_of(w))
            })
            .unwrap_or(1)
    }

    /// The kernel geometry with units of `unit` elements (a word of the copy; 1 for the add).
    fn geometry(&self, unit: usize, index_stride: usize, dim_size: usize) -> Option<RowGeom> {
        let row_len = (self.row / unit) as u64;
        let group = row_len.next_power_of_two().clamp(1, 32);
        let chunk_len = if row_len <= group * 4 * CHUNK_ROUNDS {
            row_len
        } else {
            group * 4 * CHUNK_ROUNDS
        };
        let chunks = row_len.div_ceil(chunk_len.max(1));
        let tasks = (self.outer as u64)
            .checked_mul(self.count as u64)?
            .checked_mul(chunks)?;
        let units = |stride: usize| (stride / unit) as i64;
        Some(RowGeom {
            tasks,
            count: self.count as u64,
            chunks,
            row_len,
            chunk_len,
            src_outer: units(self.src_outer),
            dst_outer: units(self.dst_outer),
            src_step: units(self.src_step),
            dst_step: units(self.dst_step),
            index_stride: index_stride as i64,
            dim_size: dim_size as u64,
            group: group as u32,
            pad: 0,
        })
    }
}

/// A planned row launch: the kernel and its geometry.
pub(super) struct RowLaunch {
    pub(super) name: KernelName,
    pub(super) geom: RowGeom,
}

/// Word kernels by width in bytes.
fn word_name(bytes: usize) -> &'static str {
    match bytes {
        16 => "w16",
        8 => "w8",
        4 => "w4",
        2 => "w2",
        _ => "w1",
    }
}

/// The row form of `IndexSelect { input, index, dim, out }`, when it applies.
pub(super) fn select(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Option<RowLaunch> {
    let rows = Rows::of(out.layout.shape(), dim, input.layout.strides(), out.layout.strides())?;
    let size = input.dtype.size_in_bytes();
    let dim_size = input.layout.shape()[dim];
    let word = rows.word(size, [device_ptr(input), device_ptr(out)], dim_size);
    let unit = (word / size).max(1);
    let geom = rows.geometry(unit, index.layout.strides()[0], dim_size)?;
    Some(RowLaunch {
        name: KernelName::new(
            SourceFile::Index,
            ["index_select_rows", word_name(unit * size), index.dtype.name(), ""],
        ),
        geom,
    })
}

/// The row form of `Scatter { Add, src, index, dim, out }` when the index is the `index_add`
/// form (stride 0 on every dimension but `dim` that has more than one entry) and the dtype has
/// an atomic add.
pub(super) fn index_add(src: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Option<RowLaunch> {
    let shape = index.layout.shape();
    let broadcast = shape
        .iter()
        .zip(index.layout.strides())
        .enumerate()
        .all(|(d, (&n, &s))| d == dim || n <= 1 || s == 0);
    if !broadcast
        || !matches!(
            src.dtype,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 | DType::U8
        )
    {
        return None;
    }
    let rows = Rows::of(shape, dim, src.layout.strides(), out.layout.strides())?;
    let geom = rows.geometry(1, index.layout.strides()[dim], out.layout.shape()[dim])?;
    Some(RowLaunch {
        name: KernelName::new(
            SourceFile::Index,
            ["index_add_rows", src.dtype.name(), index.dtype.name(), ""],
        ),
        geom,
    })
}

/// The launch shape of `geom`: `group` lanes per task, [`super::geometry::THREADS`] per block.
pub(super) fn config(
    backend: &CudaBackend,
    kernel: &crate::modules::LoadedKernel,
    geom: &RowGeom,
) -> cudarc::driver::LaunchConfig {
    grid(
        geom.tasks.saturating_mul(geom.group as u64),
        max_blocks(backend, kernel),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embedding_table_is_rows_of_16_byte_words() {
        // table [50304, 768] f32, 16384 ids, out [16384, 768].
        let rows = Rows::of(&[16384, 768], 0, &[768, 1], &[768, 1]).expect("rows");
        assert_eq!((rows.outer, rows.count, rows.row), (1, 16384, 768));
        assert_eq!(rows.word(4, [0x1000, 0x2000], 50304), 16);
        let geom = rows.geometry(4, 1, 50304).expect("geometry");
        assert_eq!((geom.row_len, geom.group, geom.chunks, geom.tasks), (192, 32, 1, 16384));
        assert_eq!((geom.src_step, geom.dst_step), (192, 192));
    }

    #[test]
    fn misaligned_rows_take_narrower_words() {
        // Row of 769 f32: 3076 bytes, a multiple of 4 only.
        let rows = Rows::of(&[5, 769], 0, &[769, 1], &[769, 1]).expect("rows");
        assert_eq!(rows.word(4, [0, 0], 9), 4);
        // Row of 3 i64: 24 bytes → 8-byte words.
        let rows = Rows::of(&[5, 3], 0, &[3, 1], &[3, 1]).expect("rows");
        assert_eq!(rows.word(8, [0, 0], 9), 8);
        // Row of 768 bf16 whose table starts 3 elements in: 2-byte words.
        let rows = Rows::of(&[5, 768], 0, &[768, 1], &[768, 1]).expect("rows");
        assert_eq!(rows.word(2, [6, 0], 9), 2);
        // Row of one f32.
        let rows = Rows::of(&[5, 1], 0, &[1, 1], &[1, 1]).expect("rows");
        assert_eq!(rows.word(4, [0, 0], 9), 4);
        let geom = rows.geometry(1, 1, 9).expect("geometry");
        assert_eq!((geom.row_len, geom.group, geom.tasks), (1, 1, 5));
    }

    #[test]
    fn long_rows_are_chunked() {
        let rows = Rows::of(&[3, 100_000], 0, &[100_000, 1], &[100_000, 1]).expect("rows");
        let geom = rows.geometry(4, 1, 7).expect("geometry");
        assert_eq!(geom.row_len, 25_000);
        assert_eq!(geom.chunk_len, 2048);
        assert_eq!(geom.chunks, 25_000u64.div_ceil(2048));
        assert_eq!(geom.tasks, 3 * geom.chunks);
    }

    #[test]
    fn outer_dimensions_merge_or_refuse() {
        // index_select along dim 1 of a dense [2, 3, 7, 5]: outer [2, 3] merges into 6.
        let rows = Rows::of(&[2, 3, 4, 5], 2, &[105, 35, 5, 1], &[60, 20, 5, 1]).expect("rows");
        assert_eq!((rows.outer, rows.src_outer, rows.dst_outer, rows.row), (6, 35, 20, 5));
        // A transposed source: its rows are not contiguous.
        assert_eq!(Rows::of(&[4, 5], 0, &[1, 7], &[5, 1]), None);
        // Outer dimensions that do not merge in the source.
        assert_eq!(Rows::of(&[2, 3, 4], 2, &[40, 4, 1], &[12, 4, 1]), None);
        // index_select along the last dim: rows of one element with the outer dims merged.
        let rows = Rows::of(&[6, 4], 1, &[7, 1], &[4, 1]).expect("rows");
        assert_eq!((rows.outer, rows.row, rows.src_step, rows.dst_step), (6, 1, 1, 1));
    }

    #[test]
    fn strides_that_never_move_do_not_narrow_the_word() {
        // One index entry: the output's dim stride is irrelevant.
        let rows = Rows::of(&[1, 8], 0, &[8, 1], &[3, 1]).expect("rows");
        assert_eq!(rows.word(4, [0, 0], 4), 16);
    }

    #[test]
    fn the_geometry_matches_the_kernel_parameters() {
        let params = crate::launch::ptx_param_bytes(SourceFile::Index, "index_select_rows_w16_i64");
        assert_eq!(params, vec![8, 8, 8, 8, std::mem::size_of::<RowGeom>()]);
        let params = crate::launch::ptx_param_bytes(SourceFile::Index, "index_add_rows_bf16_i32");
        assert_eq!(params, vec![8, 8, 8, 8, std::mem::size_of::<RowGeom>()]);
    }

    #[test]
    fn every_row_kernel_is_built() {
        for index in ["i32", "i64"] {
            for word in ["w1", "w2", "w4", "w8", "w16"] {
                let symbol = format!("index_select_rows_{word}_{index}");
                assert!(
                    crate::precompiled::entry_ptx(SourceFile::Index, &symbol).is_some(),
                    "{symbol}"
                );
            }
            for dtype in ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"] {
                let symbol = format!("index_add_rows_{dtype}_{index}");
                assert!(
                    crate::precompiled::entry_ptx(SourceFile::Index, &symbol).is_some(),
                    "{symbol}"
                );
            }
        }
    }
}
