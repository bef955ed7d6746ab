//! The row kernels of `IndexSelect` (an embedding lookup) and of the `index_add` form of
//! `Scatter`, against the host: row lengths 1, 3, 768 and 769 (16-byte words, narrower words and
//! single elements), f32, f16, bf16 and i64 tables, tables and outputs starting off a 16-byte
//! boundary, i32 and i64 ids (strided too), selections along an inner dim (outer dims merged),
//! rows long enough to be split in chunks, and out-of-range ids refused with
//! `Error::IndexOutOfRange` naming the id, the dim and its size.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use cartage_core::{Backend, DType, DeviceBuffer, Error, Kernel, Layout, ScatterMode};
use common::backend;

/// A deterministic byte stream (an LCG).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// `n` ids below `size` (with repeats), deterministic.
fn ids(n: usize, size: usize, seed: u64) -> Vec<i64> {
    bytes(n * 4, seed)
        .chunks(4)
        .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize % size) as i64)
        .collect()
}

/// `values` encoded as `dtype` (i32 or i64).
fn encode_ids(values: &[i64], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    }
}

fn upload_bytes(b: &Arc<dyn Backend>, data: &[u8]) -> DeviceBuffer {
    let buf = DeviceBuffer::new(b, data.len().max(1)).expect("alloc");
    buf.write(0, data).expect("write");
    buf
}

fn download_bytes(buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    buf.read(0, &mut out).expect("read");
    out
}

/// Select `ids` rows of a `[rows, cols]` table of `dtype` starting `table_offset` elements into
/// its buffer, into an output starting `out_offset` elements in, with the ids read at
/// `id_stride`; compare every byte of the output buffer with the host's selection (bytes
/// outside the view untouched).
#[allow(clippy::too_many_arguments)]
fn select_case(
    b: &Arc<dyn Backend>,
    dtype: DType,
    index_dtype: DType,
    (rows, cols): (usize, usize),
    n: usize,
    table_offset: usize,
    out_offset: usize,
    id_stride: usize,
) {
    let size = dtype.size_in_bytes();
    let table_bytes = bytes((table_offset + rows * cols) * size, (rows * cols + table_offset) as u64);
    let table = upload_bytes(b, &table_bytes);
    let picked = ids(n, rows, (n * 31 + cols) as u64);
    let mut spread = vec![0i64; (n.max(1) - 1) * id_stride + 1];
    for (k, &v) in picked.iter().enumerate() {
        spread[k * id_stride] = v;
    }
    let index = upload_bytes(b, &encode_ids(&spread, index_dtype));
    let poison = vec![0xA5u8; (out_offset + n * cols + 2) * size];
    let out = upload_bytes(b, &poison);
    let kernel = Kernel::IndexSelect {
        input: table.arg(
            Layout::from_parts(&[rows, cols], &[cols, 1], table_offset).expect("layout"),
            dtype,
        ),
        index: index.arg(Layout::from_parts(&[n], &[id_stride], 0).expect("layout"), index_dtype),
        dim: 0,
        out: out.arg(
            Layout::from_parts(&[n, cols], &[cols, 1], out_offset).expect("layout"),
            dtype,
        ),
    };
    let what = format!(
        "index_select {dtype} [{rows}, {cols}] (offset {table_offset}) by {n} {index_dtype} ids (stride {id_stride}) into offset {out_offset}"
    );
    kernel
        .run(&[&table, &index, &out])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut want = poison;
    let row_bytes = cols * size;
    for (p, &k) in picked.iter().enumerate() {
        let from = (table_offset + k as usize * cols) * size;
        let to = (out_offset + p * cols) * size;
        want[to..to + row_bytes].copy_from_slice(&table_bytes[from..from + row_bytes]);
    }
    let got = download_bytes(&out);
    if let Some(at) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!(
            "{what}: byte {at} (element {}) differs: got {:#04x}, want {:#04x}",
            at / size,
            got[at],
            want[at]
        );
    }
}

#[test]
fn selected_rows_match_the_host_at_every_width() {
    let Some(b) = backend("selected_rows_match_the_host_at_every_width") else {
        return;
    };
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        for cols in [1, 3, 768, 769] {
            for index_dtype in [DType::I32, DType::I64] {
                // Aligned; the table off a 16-byte boundary; the output off one; strided ids.
                for (table_offset, out_offset, id_stride) in [(0, 0, 1), (1, 0, 1), (3, 1, 1), (0, 0, 2)] {
                    select_case(
                        &b,
                        dtype,
                        index_dtype,
                        (37, cols),
                        50,
                        table_offset,
                        out_offset,
                        id_stride,
                    );
                }
            }
        }
    }
}

#[test]
fn an_embedding_sized_lookup_matches_the_host() {
    let Some(b) = backend("an_embedding_sized_lookup_matches_the_host") else {
        return;
    };
    // 16 × 1024 ids into a [4096, 768] f32 table; one id and a long row split in chunks too.
    select_case(&b, DType::F32, DType::I64, (4096, 768), 16 * 1024, 0, 0, 1);
    select_case(&b, DType::BF16, DType::I32, (4096, 768), 16 * 1024, 0, 0, 1);
    select_case(&b, DType::F32, DType::I64, (9, 768), 1, 0, 0, 1);
    select_case(&b, DType::F32, DType::I64, (5, 100_003), 7, 0, 0, 1);
    select_case(&b, DType::F16, DType::I32, (5, 100_000), 7, 2, 0, 1);
}

#[test]
fn selections_along_an_inner_dim_merge_the_outer_dims() {
    let Some(b) = backend("selections_along_an_inner_dim_merge_the_outer_dims") else {
        return;
    };
    // [2, 3, 9, 5] f32 along dim 2 by 4 ids; then [6, 9] along its last dim (rows of one).
    for (shape, dim) in [(vec![2usize, 3, 9, 5], 2usize), (vec![6, 9], 1)] {
        for dtype in [DType::F32, DType::BF16] {
            let size = dtype.size_in_bytes();
            let numel: usize = shape.iter().product();
            let table_bytes = bytes(numel * size, numel as u64);
            let table = upload_bytes(&b, &table_bytes);
            let picked = ids(4, shape[dim], 77);
            let index = upload_bytes(&b, &encode_ids(&picked, DType::I64));
            let mut out_shape = shape.clone();
            out_shape[dim] = picked.len();
            let out_numel: usize = out_shape.iter().product();
            let out = upload_bytes(&b, &vec![0xA5u8; out_numel * size]);
            Kernel::IndexSelect {
                input: table.arg(Layout::contiguous(&shape).expect("layout"), dtype),
                index: index.arg(Layout::contiguous(&[picked.len()]).expect("layout"), DType::I64),
                dim,
                out: out.arg(Layout::contiguous(&out_shape).expect("layout"), dtype),
            }
            .run(&[&table, &index, &out])
            .expect("index_select");
            let outer: usize = shape[..dim].iter().product();
            let inner: usize = shape[dim + 1..].iter().product();
            let mut want = vec![0u8; out_numel * size];
            for o in 0..outer {
                for (p, &k) in picked.iter().enumerate() {
                    let from = ((o * shape[dim] + k as usize) * inner) * size;
                    let to = ((o * picked.len() + p) * inner) * size;
                    want[to..to + inner * size].copy_from_slice(&table_bytes[from..from + inner * size]);
                }
            }
            assert_eq!(
                download_bytes(&out),
                want,
                "index_select {dtype} {shape:?} along dim {dim}"
            );
        }
    }
}

/// Launch `kernel` and require `IndexOutOfRange { op, index: bad, dim, size }`.
fn expect_out_of_range(kernel: &Kernel, buffers: &[&DeviceBuffer], op: &str, bad: i64, dim: usize, size: usize) {
    match kernel.run(buffers) {
        Err(Error::IndexOutOfRange {
            op: o,
            index,
            dim: d,
            size: s,
            ..
        }) => assert_eq!(
            (o, index, d, s),
            (op, bad, dim, size),
            "the error names the op, the id, the dim and its size"
        ),
        Err(e) => panic!("{op} with id {bad}: expected IndexOutOfRange, got {e}"),
        Ok(()) => panic!("{op} with id {bad}: an out-of-range id was accepted"),
    }
}

#[test]
fn out_of_range_ids_are_refused_by_the_row_kernels() {
    let Some(b) = backend("out_of_range_ids_are_refused_by_the_row_kernels") else {
        return;
    };
    let (rows, cols) = (37usize, 768usize);
    let table = upload_bytes(&b, &bytes(rows * cols * 4, 5));
    for index_dtype in [DType::I32, DType::I64] {
        let mut bad_values = vec![rows as i64, rows as i64 + 7, -1, -(rows as i64), i32::MIN as i64];
        if index_dtype == DType::I64 {
            bad_values.extend([1i64 << 40, (1i64 << 32) + 1]);
        }
        for (trial, &bad) in bad_values.iter().enumerate() {
            let n = if trial % 2 == 0 { 4 } else { 10_000 };
            let mut picked = ids(n, rows, trial as u64);
            let at = if n == 4 { trial % 4 } else { n - 1 };
            picked[at] = bad;
            let index = upload_bytes(&b, &encode_ids(&picked, index_dtype));
            let out = upload_bytes(&b, &vec![0u8; n * cols * 4]);
            let kernel = Kernel::IndexSelect {
                input: table.arg(Layout::contiguous(&[rows, cols]).expect("layout"), DType::F32),
                index: index.arg(Layout::contiguous(&[n]).expect("layout"), index_dtype),
                dim: 0,
                out: out.arg(Layout::contiguous(&[n, cols]).expect("layout"), DType::F32),
            };
            expect_out_of_range(&kernel, &[&table, &index, &out], "index_select", bad, 0, rows);

            // The index_add form: rows of a [n, cols] source added into the table's shape.
            let src = upload_bytes(&b, &vec![0u8; n * cols * 4]);
            let dst = upload_bytes(&b, &vec![0u8; rows * cols * 4]);
            let kernel = Kernel::Scatter {
                mode: ScatterMode::Add,
                src: src.arg(Layout::contiguous(&[n, cols]).expect("layout"), DType::F32),
                index: index.arg(Layout::from_parts(&[n, cols], &[1, 0], 0).expect("layout"), index_dtype),
                dim: 0,
                out: dst.arg(Layout::contiguous(&[rows, cols]).expect("layout"), DType::F32),
            };
            expect_out_of_range(&kernel, &[&src, &index, &dst], "scatter_add", bad, 0, rows);
        }
    }
    // The device still works after those errors.
    select_case(&b, DType::F32, DType::I64, (rows, cols), 6, 0, 0, 1);
}

/// Small integers as `dtype` bytes (exact in every dtype here, so sums are order-independent).
fn encode_values(values: &[i64], dtype: DType) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| match dtype {
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F64 => (v as f64).to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(v as f64).to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(v as f64).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect()
}

fn decode_values(data: &[u8], dtype: DType) -> Vec<f64> {
    data.chunks(dtype.size_in_bytes())
        .map(|c| match dtype {
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().expect("8 bytes")),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            _ => i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64,
        })
        .collect()
}

#[test]
fn index_add_rows_match_the_host() {
    let Some(b) = backend("index_add_rows_match_the_host") else {
        return;
    };
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::F64] {
        for cols in [1, 3, 768, 769] {
            for index_dtype in [DType::I32, DType::I64] {
                // 40 source rows into 7 targets: many duplicates; small integers keep every sum
                // exact whatever the order of the atomics.
                let (rows, n) = (7usize, 40usize);
                let initial: Vec<i64> = bytes(rows * cols, 3).iter().map(|&x| (x % 9) as i64 - 4).collect();
                let source: Vec<i64> = bytes(n * cols, 4).iter().map(|&x| (x % 5) as i64 - 2).collect();
                let targets = ids(n, rows, cols as u64);
                let dst = upload_bytes(&b, &encode_values(&initial, dtype));
                let src = upload_bytes(&b, &encode_values(&source, dtype));
                let index = upload_bytes(&b, &encode_ids(&targets, index_dtype));
                Kernel::Scatter {
                    mode: ScatterMode::Add,
                    src: src.arg(Layout::contiguous(&[n, cols]).expect("layout"), dtype),
                    index: index.arg(Layout::from_parts(&[n, cols], &[1, 0], 0).expect("layout"), index_dtype),
                    dim: 0,
                    out: dst.arg(Layout::contiguous(&[rows, cols]).expect("layout"), dtype),
                }
                .run(&[&src, &index, &dst])
                .unwrap_or_else(|e| panic!("index_add {dtype} cols {cols} {index_dtype}: {e}"));
                let mut want: Vec<f64> = initial.iter().map(|&v| v as f64).collect();
                for (p, &k) in targets.iter().enumerate() {
                    for c in 0..cols {
                        want[k as usize * cols + c] += source[p * cols + c] as f64;
                    }
                }
                let got = decode_values(&download_bytes(&dst), dtype);
                assert_eq!(
                    got, want,
                    "index_add {dtype} [{rows}, {cols}] from {n} rows by {index_dtype}"
                );
            }
        }
    }
}

#[test]
fn index_add_along_an_inner_dim_merges_the_outer_dims() {
    let Some(b) = backend("index_add_along_an_inner_dim_merges_the_outer_dims") else {
        return;
    };
    // out [2, 3, 4, 5] += src [2, 3, 9, 5] along dim 2 by 9 ids (the index broadcast elsewhere).
    let dtype = DType::F32;
    let (out_shape, src_shape, dim) = ([2usize, 3, 4, 5], [2usize, 3, 9, 5], 2usize);
    let out_numel: usize = out_shape.iter().product();
    let src_numel: usize = src_shape.iter().product();
    let initial: Vec<i64> = bytes(out_numel, 8).iter().map(|&x| (x % 7) as i64 - 3).collect();
    let source: Vec<i64> = bytes(src_numel, 9).iter().map(|&x| (x % 5) as i64 - 2).collect();
    let targets = ids(9, out_shape[dim], 10);
    let dst = upload_bytes(&b, &encode_values(&initial, dtype));
    let src = upload_bytes(&b, &encode_values(&source, dtype));
    let index = upload_bytes(&b, &encode_ids(&targets, DType::I64));
    Kernel::Scatter {
        mode: ScatterMode::Add,
        src: src.arg(Layout::contiguous(&src_shape).expect("layout"), dtype),
        index: index.arg(
            Layout::from_parts(&src_shape, &[0, 0, 1, 0], 0).expect("layout"),
            DType::I64,
        ),
        dim,
        out: dst.arg(Layout::contiguous(&out_shape).expect("layout"), dtype),
    }
    .run(&[&src, &index, &dst])
    .expect("index_add");
    let mut want: Vec<f64> = initial.iter().map(|&v| v as f64).collect();
    let (outer, inner) = (6usize, 5usize);
    for o in 0..outer {
        for (p, &k) in targets.iter().enumerate() {
            for c in 0..inner {
                want[(o * out_shape[dim] + k as usize) * inner + c] +=
                    source[(o * src_shape[dim] + p) * inner + c] as f64;
            }
        }
    }
    assert_eq!(decode_values(&download_bytes(&dst), dtype), want);
}
