//! `Sort` of rows longer than one block's shared-memory sort (2048 elements), which the radix sort
//! takes: rows of 2049, 4097, 100 000 and 1 048 576 elements, one and several rows, ascending and
//! descending, contiguous and transposed (strided) inputs, against a host stable sort. Keys mix
//! heavy duplication with NaN of several payloads and signs, ±inf, ±0 and arbitrary bit
//! patterns (so every digit pass moves elements), and values and indices must match exactly:
//! the sort must be stable in both directions, put NaN above +inf and keep -0 and +0 as equal
//! keys in input order.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::cmp::Ordering;
use std::sync::Arc;

use cartage_core::{Backend, DType, DeviceBuffer, Kernel, Layout};
use half::bf16;

/// A deterministic stream of 64-bit draws.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }
}

/// How the keys of a case are drawn.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// Duplicates, specials and arbitrary bit patterns.
    Mixed,
    /// Only a few distinct values whose low bits are all zero (digit passes that move nothing).
    Grid,
}

/// `n` elements of `dtype` as little-endian bytes.
fn draw(dtype: DType, n: usize, seed: u64, keys: Keys) -> Vec<u8> {
    let mut rng = Lcg(seed.wrapping_mul(0x9e3779b97f4a7c15) ^ 0x5851f42d4c957f2d);
    let mut out = Vec::with_capacity(n * dtype.size_in_bytes());
    for _ in 0..n {
        let r = rng.next();
        let pick = match keys {
            Keys::Mixed => r % 16,
            Keys::Grid => 8,
        };
        let grid = ((r >> 20) % 24) as f64 * 0.5 - 6.0;
        match dtype {
            DType::F32 => {
                let v: f32 = match pick {
                    0 => f32::from_bits([0x7fc0_0000, 0xffc0_0000, 0x7f80_0001, 0xffff_ffff][(r >> 8) as usize % 4]),
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => -0.0,
                    4 => 0.0,
                    5..=9 => grid as f32,
                    _ => f32::from_bits((r >> 32) as u32),
                };
                out.extend(v.to_le_bytes());
            }
            DType::BF16 => {
                let v: bf16 = match pick {
                    0 => bf16::from_bits([0x7fc0, 0xffc0, 0x7f81, 0xffff][(r >> 8) as usize % 4]),
                    1 => bf16::INFINITY,
                    2 => bf16::NEG_INFINITY,
                    3 => bf16::NEG_ZERO,
                    4 => bf16::ZERO,
                    5..=9 => bf16::from_f64(grid),
                    _ => bf16::from_bits((r >> 40) as u16),
                };
                out.extend(v.to_le_bytes());
            }
            DType::I32 => {
                let v: i32 = match pick {
                    0 => i32::MIN,
                    1 => i32::MAX,
                    2..=9 => ((r >> 24) % 7) as i32 - 3,
                    _ => (r >> 32) as i32,
                };
                out.extend(v.to_le_bytes());
            }
            DType::I64 => {
                let v: i64 = match pick {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    2..=9 => ((r >> 24) % 7) as i64 - 3,
                    _ => (rng.next() as i64) >> (r % 60),
                };
                out.extend(v.to_le_bytes());
            }
            other => panic!("no keys drawn for {other}"),
        }
    }
    out
}

/// A key of the reference order: floats as f64 (exact for f32 and bf16), integers as i64.
#[derive(Clone, Copy)]
enum Key {
    Float(f64),
    Int(i64),
}

/// The reference order: NaN above everything and equal to NaN; -0 == +0 (IEEE).
fn order(a: Key, b: Key) -> Ordering {
    match (a, b) {
        (Key::Float(a), Key::Float(b)) => match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => a.partial_cmp(&b).expect("neither is NaN"),
        },
        (Key::Int(a), Key::Int(b)) => a.cmp(&b),
        _ => unreachable!("one dtype per sort"),
    }
}

fn key(dtype: DType, bytes: &[u8]) -> Key {
    match dtype {
        DType::F32 => Key::Float(f32::from_le_bytes(bytes.try_into().expect("4 bytes")) as f64),
        DType::BF16 => Key::Float(bf16::from_le_bytes(bytes.try_into().expect("2 bytes")).to_f64()),
        DType::I32 => Key::Int(i32::from_le_bytes(bytes.try_into().expect("4 bytes")) as i64),
        DType::I64 => Key::Int(i64::from_le_bytes(bytes.try_into().expect("8 bytes"))),
        other => panic!("no key for {other}"),
    }
}

/// One sort: `rows` rows of `cols` keys along the last dim.
#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    rows: usize,
    cols: usize,
    descending: bool,
    /// The input is stored transposed ([cols, rows] in memory) and read through strides.
    transposed: bool,
    keys: Keys,
}

fn buffer(b: &Arc<dyn Backend>, bytes: &[u8]) -> DeviceBuffer {
    let buf = DeviceBuffer::new(b, bytes.len().max(1)).expect("alloc");
    buf.write(0, bytes).expect("write");
    buf
}

fn run(b: &Arc<dyn Backend>, case: Case, seed: u64) {
    let Case {
        dtype,
        rows,
        cols,
        descending,
        transposed,
        keys,
    } = case;
    let what = format!("{case:?}");
    let es = dtype.size_in_bytes();
    // Logical row-major [rows, cols].
    let data = draw(dtype, rows * cols, seed, keys);
    let (stored, layout) = if transposed {
        let mut t = vec![0u8; data.len()];
        for r in 0..rows {
            for c in 0..cols {
                let (from, to) = ((r * cols + c) * es, (c * rows + r) * es);
                t[to..to + es].copy_from_slice(&data[from..from + es]);
            }
        }
        (t, Layout::from_parts(&[rows, cols], &[1, rows], 0).expect("layout"))
    } else {
        (data.clone(), Layout::contiguous(&[rows, cols]).expect("layout"))
    };
    let input = buffer(b, &stored);
    let values = buffer(b, &vec![0xa5; rows * cols * es]);
    let indices = buffer(b, &vec![0xa5; rows * cols * 8]);
    let out_layout = Layout::contiguous(&[rows, cols]).expect("layout");
    Kernel::Sort {
        input: input.arg(layout, dtype),
        dim: 1,
        descending,
        values: values.arg(out_layout.clone(), dtype),
        indices: indices.arg(out_layout, DType::I64),
    }
    .run(&[&input, &values, &indices])
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut got_values = vec![0u8; rows * cols * es];
    values.read(0, &mut got_values).expect("read values");
    let mut got_indices = vec![0u8; rows * cols * 8];
    indices.read(0, &mut got_indices).expect("read indices");

    for r in 0..rows {
        let row = &data[r * cols * es..(r + 1) * cols * es];
        let keys: Vec<Key> = row.chunks(es).map(|e| key(dtype, e)).collect();
        let mut want: Vec<usize> = (0..cols).collect();
        // `sort_by` is stable; comparing (b, a) for descending keeps equal keys in input order.
        if descending {
            want.sort_by(|&i, &j| order(keys[j], keys[i]));
        } else {
            want.sort_by(|&i, &j| order(keys[i], keys[j]));
        }
        for (k, &from) in want.iter().enumerate() {
            let at = r * cols + k;
            let index = i64::from_le_bytes(got_indices[at * 8..at * 8 + 8].try_into().expect("8 bytes"));
            assert_eq!(
                index, from as i64,
                "{what}: row {r} position {k}: index {index}, want {from}"
            );
            assert_eq!(
                &got_values[at * es..(at + 1) * es],
                &row[from * es..(from + 1) * es],
                "{what}: row {r} position {k}: value bits differ from input element {from}"
            );
        }
    }
}

fn cases(dtype: DType) -> Vec<Case> {
    let case = |rows, cols, descending, transposed, keys| Case {
        dtype,
        rows,
        cols,
        descending,
        transposed,
        keys,
    };
    vec![
        case(1, 1 << 20, false, false, Keys::Mixed),
        case(1, 1 << 20, true, false, Keys::Mixed),
        case(1, 2049, false, false, Keys::Mixed),
        case(5, 2049, true, false, Keys::Mixed),
        case(3, 100_000, false, true, Keys::Mixed),
        case(2, 100_000, true, false, Keys::Grid),
        case(7, 4097, false, true, Keys::Grid),
    ]
}

fn sort_long_rows(test: &str, dtype: DType) {
    let Some(b) = common::backend(test) else {
        return;
    };
    for (seed, case) in cases(dtype).into_iter().enumerate() {
        run(&b, case, seed as u64 + 1);
    }
}

#[test]
fn f32_long_rows_sort_stably() {
    sort_long_rows("f32_long_rows_sort_stably", DType::F32);
}

#[test]
fn bf16_long_rows_sort_stably() {
    sort_long_rows("bf16_long_rows_sort_stably", DType::BF16);
}

#[test]
fn i32_long_rows_sort_stably() {
    sort_long_rows("i32_long_rows_sort_stably", DType::I32);
}

#[test]
fn i64_long_rows_sort_stably() {
    sort_long_rows("i64_long_rows_sort_stably", DType::I64);
}
