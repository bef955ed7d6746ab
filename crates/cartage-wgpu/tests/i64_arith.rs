//! The i64 emulation on `vec2<u32>` word pairs at the places it can go wrong: carries and
//! borrows across the 32-bit boundary, products of large values (every partial product
//! matters), `i64::MIN / -1` and `i64::MIN.abs()` wrapping, powers beyond 2^32 in the exponent,
//! signed order of values that differ only in the high word (compares, maximum/minimum,
//! reductions, arg-reductions), and cumulative sums and products long enough for the
//! workgroup scan. Every expected value comes from Rust's own `wrapping_*` arithmetic.

mod common;

use std::sync::Arc;

use cartage_core::{BinaryOp, CompareOp, DType, Kernel, Op, ReduceOp, ScanOp, TensorArg, UnaryOp};
use cartage_wgpu::WgpuBackend;
use common::{backend, download, empty, upload};

const HI: i64 = 1 << 32;

/// Operand pairs: carries, borrows, sign and high-word-only differences, the extremes.
fn pairs() -> (Vec<i64>, Vec<i64>) {
    let p: [(i64, i64); 24] = [
        (0xffff_ffff, 1),
        (-1, 1),
        (HI, -1),
        (HI, 0xffff_ffff),
        (-HI, HI),
        (i64::MAX, 1),
        (i64::MIN, -1),
        (i64::MIN, 1),
        (i64::MIN, i64::MIN),
        (i64::MAX, i64::MIN),
        (0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321),
        (-0x1234_5678_9abc_def0, 0x7654_3210_fedc_ba98),
        (0xffff_ffff, 0xffff_ffff),
        (0x1_0000_0001, 0x1_0000_0001),
        (-7, 2),
        (7, -2),
        (-7, -2),
        (5, 0),
        (i64::MIN, 0),
        (1 << 62, 3),
        (i64::MAX, 0x1_0000_0003),
        (-0x7fff_ffff_0000_0000, 0x7fff_ffff),
        (0x8000_0000, 0x8000_0000),
        (3 * HI + 5, 3 * HI + 5),
    ];
    p.iter().copied().unzip()
}

fn binary(b: &Arc<WgpuBackend>, op: BinaryOp, lhs: &[i64], rhs: &[i64]) -> Vec<i64> {
    let n = lhs.len();
    let (lb, l) = upload(b, lhs, &[n]);
    let (rb, r) = upload(b, rhs, &[n]);
    let (ob, out) = empty::<i64>(b, &[n]);
    Kernel::Binary {
        op,
        lhs: l,
        rhs: r,
        out: out.clone(),
    }
    .run(&[&lb, &rb, &ob])
    .unwrap();
    download(&ob, &out)
}

fn unary(b: &Arc<WgpuBackend>, op: UnaryOp, input: &[i64]) -> Vec<i64> {
    let n = input.len();
    let (ib, x) = upload(b, input, &[n]);
    let (ob, out) = empty::<i64>(b, &[n]);
    Kernel::Unary {
        op,
        input: x,
        out: out.clone(),
    }
    .run(&[&ib, &ob])
    .unwrap();
    download(&ob, &out)
}

fn reduce(b: &Arc<WgpuBackend>, op: ReduceOp, input: &[i64], shape: &[usize], dim: usize) -> Vec<i64> {
    let (ib, x) = upload(b, input, shape);
    let mut out_shape = shape.to_vec();
    out_shape[dim] = 1;
    let (ob, out) = empty::<i64>(b, &out_shape);
    Kernel::Reduce {
        op,
        input: x,
        dims: [dim].into_iter().collect(),
        out: out.clone(),
    }
    .run(&[&ib, &ob])
    .unwrap();
    download(&ob, &out)
}

fn scan(b: &Arc<WgpuBackend>, op: ScanOp, input: &[i64], shape: &[usize], dim: usize) -> Vec<i64> {
    let (ib, x) = upload(b, input, shape);
    let (ob, out) = empty::<i64>(b, shape);
    Kernel::Scan {
        op,
        input: x,
        dim,
        out: out.clone(),
    }
    .run(&[&ib, &ob])
    .unwrap();
    download(&ob, &out)
}

/// Deterministic values spread over all 64 bits (an LCG's high bits, some made small).
fn spread(n: usize, seed: u64) -> Vec<i64> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let v = s as i64;
            match i % 4 {
                0 => v >> 33,
                1 => v >> 1,
                _ => v,
            }
        })
        .collect()
}

#[test]
fn every_op_defined_for_i64_is_listed() {
    let Some(b) = backend("every_op_defined_for_i64_is_listed") else {
        return;
    };
    let caps = cartage_core::Backend::capabilities(&*b);
    for op in Op::all() {
        if !op.optional() && op.defined_for(DType::I64) {
            assert!(caps.supports(op, DType::I64), "{op:?}");
        }
    }
}

#[test]
fn add_sub_mul_carry_across_the_word_boundary() {
    let Some(b) = backend("add_sub_mul_carry_across_the_word_boundary") else {
        return;
    };
    let (mut lhs, mut rhs) = pairs();
    lhs.extend(spread(500, 1));
    rhs.extend(spread(500, 2));
    type Reference = fn(i64, i64) -> i64;
    let cases: [(BinaryOp, Reference); 3] = [
        (BinaryOp::Add, i64::wrapping_add),
        (BinaryOp::Sub, i64::wrapping_sub),
        (BinaryOp::Mul, i64::wrapping_mul),
    ];
    for (op, reference) in cases {
        let want: Vec<i64> = lhs.iter().zip(&rhs).map(|(&x, &y)| reference(x, y)).collect();
        assert_eq!(binary(&b, op, &lhs, &rhs), want, "{op:?}");
    }
    // Spot checks written out: the carry, the borrow, and a product filling both words.
    let got = binary(&b, BinaryOp::Add, &[0xffff_ffff, -1], &[1, 1]);
    assert_eq!(got, vec![HI, 0]);
    let got = binary(&b, BinaryOp::Sub, &[HI, i64::MIN], &[1, 1]);
    assert_eq!(got, vec![0xffff_ffff, i64::MAX]);
    let got = binary(&b, BinaryOp::Mul, &[0xffff_ffff, i64::MAX], &[0xffff_ffff, 2]);
    assert_eq!(got, vec![0xffff_fffe_0000_0001_u64 as i64, -2]);
}

#[test]
fn division_truncates_and_wraps_min_over_minus_one() {
    let Some(b) = backend("division_truncates_and_wraps_min_over_minus_one") else {
        return;
    };
    let (mut lhs, mut rhs) = pairs();
    lhs.extend(spread(500, 3));
    // Divisors of every size: full 64-bit, 32-bit, small, negative.
    rhs.extend(spread(500, 4).iter().enumerate().map(|(i, &v)| match i % 3 {
        0 => v,
        1 => v >> 32,
        _ => v >> 56,
    }));
    let want: Vec<i64> = lhs
        .iter()
        .zip(&rhs)
        .map(|(&x, &y)| if y == 0 { 0 } else { x.wrapping_div(y) })
        .collect();
    assert_eq!(binary(&b, BinaryOp::Div, &lhs, &rhs), want);
    let got = binary(
        &b,
        BinaryOp::Div,
        &[i64::MIN, i64::MIN, -7, 7, 5, i64::MAX, i64::MIN],
        &[-1, 1, 2, -2, 0, i64::MIN, i64::MIN],
    );
    assert_eq!(got, vec![i64::MIN, i64::MIN, -3, -3, 0, 0, 1]);
}

#[test]
fn powers_wrap_over_all_exponent_bits() {
    let Some(b) = backend("powers_wrap_over_all_exponent_bits") else {
        return;
    };
    // 3^(2^40) by squaring 40 times: an exponent with a bit in the high word.
    let three_2_40 = (0..40).fold(3i64, |x, _| x.wrapping_mul(x));
    let base = [2, 2, 2, 3, -3, 0, 0, 7, 1, -1, -1, 2, 5, 3, -2, HI + 1];
    let exp = [62, 63, 64, 40, 41, 0, 5, 0, -5, -3, -4, -1, 1_000_003, 1 << 40, 63, 3];
    let want: Vec<i64> = base
        .iter()
        .zip(&exp)
        .map(|(&x, &e): (&i64, &i64)| match e {
            e if e < 0 && x == 1 => 1,
            e if e < 0 && x == -1 => {
                if e % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            e if e < 0 => 0,
            e if e == 1 << 40 => three_2_40,
            e => x.wrapping_pow(e as u32),
        })
        .collect();
    assert_eq!(want[1], i64::MIN);
    assert_eq!(want[2], 0);
    assert_eq!(binary(&b, BinaryOp::Pow, &base, &exp), want);
}

#[test]
fn unary_ops_wrap_at_min_and_keep_the_high_word() {
    let Some(b) = backend("unary_ops_wrap_at_min_and_keep_the_high_word") else {
        return;
    };
    let x = [
        i64::MIN,
        i64::MAX,
        -1,
        0,
        1,
        HI,
        -HI,
        0xffff_ffff,
        -0xffff_ffff,
        0x1_0000_0001,
    ];
    assert_eq!(
        unary(&b, UnaryOp::Abs, &x),
        x.iter().map(|v| v.wrapping_abs()).collect::<Vec<_>>()
    );
    assert_eq!(unary(&b, UnaryOp::Abs, &[i64::MIN])[0], i64::MIN);
    assert_eq!(
        unary(&b, UnaryOp::Neg, &x),
        x.iter().map(|v| v.wrapping_neg()).collect::<Vec<_>>()
    );
    assert_eq!(
        unary(&b, UnaryOp::Relu, &x),
        x.iter().map(|&v| v.max(0)).collect::<Vec<_>>()
    );
    assert_eq!(
        unary(&b, UnaryOp::Sign, &x),
        x.iter().map(|v| v.signum()).collect::<Vec<_>>()
    );
    assert_eq!(
        unary(&b, UnaryOp::Square, &x),
        x.iter().map(|v| v.wrapping_mul(*v)).collect::<Vec<_>>()
    );
    for op in [UnaryOp::Floor, UnaryOp::Ceil, UnaryOp::Round, UnaryOp::Trunc] {
        assert_eq!(unary(&b, op, &x), x.to_vec(), "{op:?}");
    }
}

#[test]
fn signed_order_looks_at_the_high_word_first() {
    let Some(b) = backend("signed_order_looks_at_the_high_word_first") else {
        return;
    };
    let (mut lhs, mut rhs) = pairs();
    // Equal low words, high words differing (and in sign); equal high words, low words differing.
    lhs.extend([HI + 5, -HI + 5, 5, i64::MIN + 5, HI + 1, -HI + 1, 7]);
    rhs.extend([-HI + 5, HI + 5, HI + 5, 5, HI + 0xffff_fff0, -HI + 0xffff_fff0, 7]);
    let n = lhs.len();
    let (lb, l) = upload(&b, &lhs, &[n]);
    let (rb, r) = upload(&b, &rhs, &[n]);
    for op in CompareOp::ALL {
        let (ob, out) = empty::<bool>(&b, &[n]);
        Kernel::Compare {
            op,
            lhs: l.clone(),
            rhs: r.clone(),
            out: out.clone(),
        }
        .run(&[&lb, &rb, &ob])
        .unwrap();
        let want: Vec<bool> = lhs
            .iter()
            .zip(&rhs)
            .map(|(x, y)| match op {
                CompareOp::Eq => x == y,
                CompareOp::Ne => x != y,
                CompareOp::Lt => x < y,
                CompareOp::Le => x <= y,
                CompareOp::Gt => x > y,
                CompareOp::Ge => x >= y,
            })
            .collect();
        assert_eq!(download::<bool>(&ob, &out), want, "{op:?}");
    }
    let max: Vec<i64> = lhs.iter().zip(&rhs).map(|(&x, &y)| x.max(y)).collect();
    let min: Vec<i64> = lhs.iter().zip(&rhs).map(|(&x, &y)| x.min(y)).collect();
    assert_eq!(binary(&b, BinaryOp::Maximum, &lhs, &rhs), max);
    assert_eq!(binary(&b, BinaryOp::Minimum, &lhs, &rhs), min);
}

#[test]
fn reductions_carry_and_order_signed() {
    let Some(b) = backend("reductions_carry_and_order_signed") else {
        return;
    };
    // Values that differ only in the high word: the extreme is decided there.
    let x = [HI + 3, -HI + 3, 3, 2 * HI + 3, -2 * HI + 3, 2 * HI + 3];
    assert_eq!(reduce(&b, ReduceOp::Max, &x, &[6], 0), vec![2 * HI + 3]);
    assert_eq!(reduce(&b, ReduceOp::Min, &x, &[6], 0), vec![-2 * HI + 3]);
    assert_eq!(reduce(&b, ReduceOp::ArgMax, &x, &[6], 0), vec![3]);
    assert_eq!(reduce(&b, ReduceOp::ArgMin, &x, &[6], 0), vec![4]);
    // Long rows (several workgroups and a finishing pass) and many short rows (one invocation
    // each), both with sums that carry out of the low word and wrap past i64::MAX.
    for (rows, len) in [(1usize, 20_000usize), (3, 9_000), (2, 3_000), (600, 7)] {
        let mut v = spread(rows * len, rows as u64);
        v[len / 2] = i64::MAX;
        let shape = [rows, len];
        let row = |r: usize| &v[r * len..(r + 1) * len];
        let per_row = |f: &dyn Fn(&[i64]) -> i64| (0..rows).map(|r| f(row(r))).collect::<Vec<i64>>();
        let sum = per_row(&|s| s.iter().fold(0i64, |a, &x| a.wrapping_add(x)));
        let prod = per_row(&|s| s.iter().fold(1i64, |a, &x| a.wrapping_mul(x | 1)));
        let odd: Vec<i64> = v.iter().map(|x| x | 1).collect();
        let max = per_row(&|s| *s.iter().max().unwrap());
        let min = per_row(&|s| *s.iter().min().unwrap());
        let first = |s: &[i64], m: i64| s.iter().position(|&x| x == m).unwrap() as i64;
        let argmax = per_row(&|s| first(s, *s.iter().max().unwrap()));
        let argmin = per_row(&|s| first(s, *s.iter().min().unwrap()));
        let what = format!("{rows} rows of {len}");
        assert_eq!(reduce(&b, ReduceOp::Sum, &v, &shape, 1), sum, "sum, {what}");
        assert_eq!(reduce(&b, ReduceOp::Prod, &odd, &shape, 1), prod, "prod, {what}");
        assert_eq!(reduce(&b, ReduceOp::Max, &v, &shape, 1), max, "max, {what}");
        assert_eq!(reduce(&b, ReduceOp::Min, &v, &shape, 1), min, "min, {what}");
        assert_eq!(reduce(&b, ReduceOp::ArgMax, &v, &shape, 1), argmax, "argmax, {what}");
        assert_eq!(reduce(&b, ReduceOp::ArgMin, &v, &shape, 1), argmin, "argmin, {what}");
    }
    // An empty product is 1, an empty sum 0.
    let (ib, x) = upload(&b, &[0i64; 1], &[1]);
    let x = TensorArg {
        layout: cartage_core::Layout::contiguous(&[1, 0]).unwrap(),
        ..x
    };
    for (op, want) in [(ReduceOp::Sum, 0i64), (ReduceOp::Prod, 1)] {
        let (ob, out) = upload(&b, &[-9i64], &[1, 1]);
        Kernel::Reduce {
            op,
            input: x.clone(),
            dims: [1usize].into_iter().collect(),
            out: out.clone(),
        }
        .run(&[&ib, &ob])
        .unwrap();
        assert_eq!(download::<i64>(&ob, &out), vec![want], "{op:?}");
    }
}

#[test]
fn cumulative_sums_and_products_carry_between_words_and_chunks() {
    let Some(b) = backend("cumulative_sums_and_products_carry_between_words_and_chunks") else {
        return;
    };
    // One long row (the workgroup scan over several 1024-element chunks) and many short rows
    // (one invocation per row).
    for (rows, len) in [(1usize, 5_000usize), (2, 1_500), (300, 9)] {
        let v: Vec<i64> = spread(rows * len, 7 + rows as u64)
            .iter()
            .enumerate()
            .map(|(i, &x)| if i % 5 == 0 { x } else { x >> 24 })
            .collect();
        let shape = [rows, len];
        let mut sum = Vec::with_capacity(v.len());
        let mut prod = Vec::with_capacity(v.len());
        for r in 0..rows {
            let (mut s, mut p) = (0i64, 1i64);
            for &x in &v[r * len..(r + 1) * len] {
                s = s.wrapping_add(x);
                p = p.wrapping_mul(x | 1);
                sum.push(s);
                prod.push(p);
            }
        }
        let odd: Vec<i64> = v.iter().map(|x| x | 1).collect();
        let what = format!("{rows} rows of {len}");
        assert_eq!(scan(&b, ScanOp::Sum, &v, &shape, 1), sum, "cumsum, {what}");
        assert_eq!(scan(&b, ScanOp::Prod, &odd, &shape, 1), prod, "cumprod, {what}");
    }
    // Small values whose running sum crosses 2^32 and then 2^63.
    let steps = [0x7fff_ffff_i64, 0x7fff_ffff, 2, i64::MAX - HI, 5];
    let want: Vec<i64> = steps
        .iter()
        .scan(0i64, |s, &x| {
            *s = s.wrapping_add(x);
            Some(*s)
        })
        .collect();
    assert_eq!(want[2], HI);
    assert!(want[4] < 0);
    assert_eq!(scan(&b, ScanOp::Sum, &steps, &[5], 0), want);
}
