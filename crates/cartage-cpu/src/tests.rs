//! Unit tests of the cpu backend's tricky parts through `Backend::launch`: strided and broadcast
//! operands, reductions (any dims, NaN, determinism across thread counts), index errors, matmul on
//! transposed and batch-broadcast operands, integer and cast semantics.

use cartage_core::{
    Backend, BinaryOp, CompareOp, DType, Dims, Element, Error, Kernel, Layout, ReduceOp, Scalar, TensorArg, UnaryOp,
};

use crate::CpuBackend;

/// Upload `data` as a contiguous tensor of `shape`.
fn upload<T: Element>(backend: &CpuBackend, data: &[T], shape: &[usize]) -> TensorArg {
    let bytes = T::to_le_bytes_vec(data);
    // The block is never freed: the backend (and its memory) lives only as long as the test.
    let buffer = backend
        .alloc(bytes.len().max(1), std::panic::Location::caller())
        .unwrap()
        .slice();
    // SAFETY: `buffer` is a block of this backend that is never freed.
    unsafe { backend.write(buffer, &bytes) }.unwrap();
    TensorArg {
        buffer,
        layout: Layout::contiguous(shape).unwrap(),
        dtype: T::DTYPE,
    }
}

/// A contiguous output of `shape` and `dtype`, filled with 0xFF bytes.
fn output(backend: &CpuBackend, dtype: DType, shape: &[usize]) -> TensorArg {
    let numel: usize = shape.iter().product();
    let poison = vec![0xFFu8; numel * dtype.size_in_bytes()];
    let buffer = backend
        .alloc(poison.len().max(1), std::panic::Location::caller())
        .unwrap()
        .slice();
    // SAFETY: `buffer` is a block of this backend that is never freed.
    unsafe { backend.write(buffer, &poison) }.unwrap();
    TensorArg {
        buffer,
        layout: Layout::contiguous(shape).unwrap(),
        dtype,
    }
}

/// The elements of `arg`'s view in row-major order.
fn download<T: Element>(backend: &CpuBackend, arg: &TensorArg) -> Vec<T> {
    let mut bytes = vec![0u8; arg.buffer.len()];
    // SAFETY: every operand of these tests lies in a block that is never freed.
    unsafe { backend.read(arg.buffer, &mut bytes) }.unwrap();
    let all = T::from_le_bytes_slice(&bytes);
    arg.layout.offsets().map(|o| all[o]).collect()
}

/// Launch `kernel` on `backend`.
fn launch(backend: &CpuBackend, kernel: &Kernel) -> cartage_core::Result<()> {
    // SAFETY: every operand of these tests comes from `upload`/`output`, whose blocks are never
    // freed while the backend lives.
    unsafe { backend.launch(kernel) }
}

fn view(arg: &TensorArg, layout: Layout) -> TensorArg {
    TensorArg { layout, ..arg.clone() }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(13);
            (h % 20_000) as f32 / 1000.0 - 10.0
        })
        .collect()
}

#[test]
fn binary_reads_transposed_and_broadcast_operands_in_place() {
    let b = CpuBackend::new();
    let a = upload(&b, &values(12, 1), &[3, 4]);
    let bias = upload(&b, &[10.0f32, 20.0, 30.0], &[3]);
    let out = output(&b, DType::F32, &[4, 3]);
    let lhs = view(&a, a.layout.transpose(0, 1).unwrap());
    let rhs = view(&bias, bias.layout.broadcast_to(&[4, 3]).unwrap());
    launch(
        &b,
        &Kernel::Binary {
            op: BinaryOp::Add,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            out: out.clone(),
        },
    )
    .unwrap();
    let (x, y) = (download::<f32>(&b, &lhs), download::<f32>(&b, &rhs));
    let expected: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    assert_eq!(download::<f32>(&b, &out), expected);
    // A strided output: write into every other column of a [4, 6] buffer.
    let wide = output(&b, DType::F32, &[4, 6]);
    let cols = view(&wide, Layout::from_parts(&[4, 3], &[6, 2], 1).unwrap());
    launch(
        &b,
        &Kernel::Binary {
            op: BinaryOp::Mul,
            lhs,
            rhs,
            out: cols.clone(),
        },
    )
    .unwrap();
    let expected: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p * q).collect();
    assert_eq!(download::<f32>(&b, &cols), expected);
    let untouched = download::<i32>(&b, &view(&wide, Layout::from_parts(&[4, 3], &[6, 2], 0).unwrap()));
    assert!(
        untouched.iter().all(|&w| w == -1),
        "positions outside the view were written"
    );
}

#[test]
fn large_strided_work_matches_small_work() {
    // Above the parallel threshold the strided path is split across rayon tasks.
    let b = CpuBackend::new();
    let (rows, cols) = (1100, 1000);
    let data = values(rows * cols, 7);
    let a = upload(&b, &data, &[rows, cols]);
    let t = view(&a, a.layout.transpose(0, 1).unwrap());
    let out = output(&b, DType::F32, &[cols, rows]);
    launch(
        &b,
        &Kernel::Unary {
            op: UnaryOp::Neg,
            input: t.clone(),
            out: out.clone(),
        },
    )
    .unwrap();
    let got = download::<f32>(&b, &out);
    for (i, (g, x)) in got.iter().zip(t.layout.offsets()).enumerate() {
        assert_eq!(*g, -data[x], "position {i}");
    }
}

#[test]
fn integer_semantics_through_launch() {
    let b = CpuBackend::new();
    let lhs = upload(&b, &[7i32, -7, i32::MIN, 5, 2], &[5]);
    let rhs = upload(&b, &[0i32, 2, -1, 3, -2], &[5]);
    let run = |op| {
        let out = output(&b, DType::I32, &[5]);
        launch(
            &b,
            &Kernel::Binary {
                op,
                lhs: lhs.clone(),
                rhs: rhs.clone(),
                out: out.clone(),
            },
        )
        .unwrap();
        download::<i32>(&b, &out)
    };
    assert_eq!(run(BinaryOp::Div), vec![0, -3, i32::MIN, 1, -1]);
    assert_eq!(run(BinaryOp::Sub), vec![7, -9, i32::MIN + 1, 2, 4]);
    assert_eq!(run(BinaryOp::Pow), vec![1, 49, 0, 125, 0]);
    let bools = output(&b, DType::Bool, &[5]);
    launch(
        &b,
        &Kernel::Compare {
            op: CompareOp::Lt,
            lhs: lhs.clone(),
            rhs,
            out: bools.clone(),
        },
    )
    .unwrap();
    assert_eq!(download::<bool>(&b, &bools), vec![false, true, true, false, false]);
    // Bool unary arithmetic is not defined; it is an error, not a panic.
    let err = launch(
        &b,
        &Kernel::Unary {
            op: UnaryOp::Neg,
            input: bools.clone(),
            out: bools,
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn casts_follow_rust_as() {
    let b = CpuBackend::new();
    let input = upload(&b, &[-2.7f32, f32::NAN, 1e20, 300.5, 0.0], &[5]);
    let cast = |dtype| {
        let out = output(&b, dtype, &[5]);
        launch(
            &b,
            &Kernel::Cast {
                input: input.clone(),
                out: out.clone(),
            },
        )
        .unwrap();
        out
    };
    assert_eq!(download::<i32>(&b, &cast(DType::I32)), vec![-2, 0, i32::MAX, 300, 0]);
    assert_eq!(download::<u8>(&b, &cast(DType::U8)), vec![0, 0, 255, 255, 0]);
    assert_eq!(
        download::<bool>(&b, &cast(DType::Bool)),
        vec![true, true, true, true, false]
    );
    let h = download::<half::f16>(&b, &cast(DType::F16));
    assert_eq!(h[0], half::f16::from_f32(-2.7));
    assert!(h[1].is_nan() && h[2].is_infinite());
}

fn reduce(b: &CpuBackend, op: ReduceOp, input: &TensorArg, dims: &[usize]) -> TensorArg {
    let shape: Vec<usize> = (0..input.layout.rank())
        .map(|d| if dims.contains(&d) { 1 } else { input.layout.shape()[d] })
        .collect();
    let out = output(b, op.output_dtype(input.dtype), &shape);
    launch(
        b,
        &Kernel::Reduce {
            op,
            input: input.clone(),
            dims: Dims::from_slice(dims),
            out: out.clone(),
        },
    )
    .unwrap();
    out
}

#[test]
fn reductions_over_any_dims_keep_rank() {
    let b = CpuBackend::new();
    let data: Vec<f64> = (0..60).map(|i| ((i * 37) % 11) as f64 - 5.0).collect();
    let x = upload(&b, &data, &[3, 4, 5]);
    let at = |i: usize, j: usize, k: usize| data[i * 20 + j * 5 + k];
    let sum02 = download::<f64>(&b, &reduce(&b, ReduceOp::Sum, &x, &[0, 2]));
    let expected: Vec<f64> = (0..4)
        .map(|j| {
            (0..3)
                .flat_map(|i| (0..5).map(move |k| (i, k)))
                .map(|(i, k)| at(i, j, k))
                .sum()
        })
        .collect();
    assert_eq!(sum02, expected);
    let mean1 = download::<f64>(&b, &reduce(&b, ReduceOp::Mean, &x, &[1]));
    assert_eq!(mean1.len(), 15);
    assert!((mean1[0] - (0..4).map(|j| at(0, j, 0)).sum::<f64>() / 4.0).abs() < 1e-12);
    let all = download::<f64>(&b, &reduce(&b, ReduceOp::Max, &x, &[0, 1, 2]));
    assert_eq!(all, vec![5.0]);
    // On a transposed view the reduction reads in place.
    let t = view(&x, x.layout.permute(&[2, 0, 1]).unwrap());
    let sum_t = download::<f64>(&b, &reduce(&b, ReduceOp::Sum, &t, &[1, 2]));
    let expected: Vec<f64> = (0..5)
        .map(|k| {
            (0..3)
                .flat_map(|i| (0..4).map(move |j| (i, j)))
                .map(|(i, j)| at(i, j, k))
                .sum()
        })
        .collect();
    assert_eq!(sum_t, expected);
    // Zero elements: a sum is 0, a mean NaN, a max an error.
    let empty = upload::<f32>(&b, &[], &[2, 0]);
    assert_eq!(
        download::<f32>(&b, &reduce(&b, ReduceOp::Sum, &empty, &[1])),
        vec![0.0, 0.0]
    );
    assert!(download::<f32>(&b, &reduce(&b, ReduceOp::Mean, &empty, &[1]))[0].is_nan());
    let out = output(&b, DType::F32, &[2, 1]);
    assert!(
        launch(
            &b,
            &Kernel::Reduce {
                op: ReduceOp::Max,
                input: empty,
                dims: Dims::from_slice(&[1]),
                out,
            }
        )
        .is_err()
    );
}

#[test]
fn max_and_argmax_handle_nan_and_ties() {
    let b = CpuBackend::new();
    let x = upload(&b, &[1.0f32, 3.0, 3.0, -1.0, 2.0, f32::NAN, 0.0, f32::NAN], &[2, 4]);
    let max = download::<f32>(&b, &reduce(&b, ReduceOp::Max, &x, &[1]));
    assert_eq!(max[0], 3.0);
    assert!(max[1].is_nan());
    assert_eq!(download::<i64>(&b, &reduce(&b, ReduceOp::ArgMax, &x, &[1])), vec![1, 1]);
    assert_eq!(download::<i64>(&b, &reduce(&b, ReduceOp::ArgMin, &x, &[1])), vec![3, 1]);
    let ints = upload(&b, &[4i64, 9, 9, 1, 1, 9], &[6]);
    assert_eq!(download::<i64>(&b, &reduce(&b, ReduceOp::ArgMax, &ints, &[0])), vec![1]);
    assert_eq!(download::<i64>(&b, &reduce(&b, ReduceOp::ArgMin, &ints, &[0])), vec![3]);
    let lse = upload(&b, &[1000.0f64, 1000.0, f64::NEG_INFINITY, f64::NEG_INFINITY], &[2, 2]);
    let got = download::<f64>(&b, &reduce(&b, ReduceOp::LogSumExp, &lse, &[1]));
    assert!((got[0] - (1000.0 + 2f64.ln())).abs() < 1e-9);
    assert_eq!(got[1], f64::NEG_INFINITY);
}

#[test]
fn sums_are_bit_identical_across_runs_and_thread_counts() {
    let b = CpuBackend::new();
    let n = 3_000_001;
    let x = upload(&b, &values(n, 3), &[n]);
    let sum = || download::<f32>(&b, &reduce(&b, ReduceOp::Sum, &x, &[0]))[0];
    let first = sum();
    for _ in 0..3 {
        assert_eq!(sum().to_bits(), first.to_bits());
    }
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert_eq!(pool.install(sum).to_bits(), first.to_bits(), "{threads} threads");
    }
    let exact: f64 = values(n, 3).iter().map(|&v| v as f64).sum();
    assert!(
        (first as f64 - exact).abs() < 1e-6 * exact.abs().max(n as f64),
        "{first} vs {exact}"
    );
}

/// An out-of-range index is a typed error (the output may be partly written: see `index.rs`).
#[test]
fn index_errors_are_typed() {
    let b = CpuBackend::new();
    let input = upload(&b, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    for bad in [-1i64, 3] {
        let index = upload(&b, &[0i64, bad], &[2]);
        let out = output(&b, DType::F32, &[2, 2]);
        let err = launch(
            &b,
            &Kernel::IndexSelect {
                input: input.clone(),
                index,
                dim: 1,
                out: out.clone(),
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::IndexOutOfRange { index, dim: 1, size: 3, .. } if index == bad),
            "{err}"
        );
        // The element before the offender was selected.
        assert_eq!(download::<f32>(&b, &out)[0], 1.0);
    }
    let index = upload(&b, &[2i32, 0, 1, 1], &[2, 2]);
    let out = output(&b, DType::F32, &[2, 2]);
    launch(
        &b,
        &Kernel::Gather {
            input: input.clone(),
            index,
            dim: 1,
            out: out.clone(),
        },
    )
    .unwrap();
    assert_eq!(download::<f32>(&b, &out), vec![3.0, 1.0, 5.0, 5.0]);
    let float_index = upload(&b, &[0.0f32, 1.0], &[2]);
    let out = output(&b, DType::F32, &[2, 2]);
    let err = launch(
        &b,
        &Kernel::IndexSelect {
            input,
            index: float_index,
            dim: 1,
            out,
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::WrongDType { .. }), "{err}");
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

#[test]
fn matmul_on_transposed_and_broadcast_operands() {
    let b = CpuBackend::new();
    // Tiny (direct loop), mid-size (gemm on this thread) and large (gemm with threads).
    for (batch, m, k, n) in [(3, 5, 7, 4), (2, 9, 1, 17), (2, 40, 50, 30), (2, 130, 140, 150)] {
        let a_data: Vec<f64> = (0..batch * m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let b_data: Vec<f64> = (0..n * k).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        // lhs stored as [B, K, M] and viewed transposed; rhs one [N, K] matrix viewed as [K, N]
        // and broadcast over the batch with stride 0.
        let a_store = upload(&b, &a_data, &[batch, k, m]);
        let lhs = view(&a_store, a_store.layout.transpose(1, 2).unwrap());
        let b_store = upload(&b, &b_data, &[1, n, k]);
        let rhs = view(
            &b_store,
            b_store
                .layout
                .transpose(1, 2)
                .unwrap()
                .broadcast_to(&[batch, k, n])
                .unwrap(),
        );
        let out = output(&b, DType::F64, &[batch, m, n]);
        launch(
            &b,
            &Kernel::Matmul {
                lhs: lhs.clone(),
                rhs: rhs.clone(),
                out: out.clone(),
            },
        )
        .unwrap();
        let (l, r) = (download::<f64>(&b, &lhs), download::<f64>(&b, &rhs));
        let got = download::<f64>(&b, &out);
        for i in 0..batch {
            let expected = naive_matmul(&l[i * m * k..][..m * k], &r[i * k * n..][..k * n], m, k, n);
            assert_eq!(&got[i * m * n..][..m * n], expected.as_slice(), "{m}x{k}x{n} batch {i}");
        }
    }
    let (m, k, n) = (5, 7, 4);
    let a_data: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
    let b_data: Vec<f64> = (0..n * k).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
    // f16 goes through f32 and rounds once.
    let h: Vec<half::f16> = a_data.iter().map(|&v| half::f16::from_f64(v)).collect();
    let hb: Vec<half::f16> = b_data.iter().map(|&v| half::f16::from_f64(v)).collect();
    let (hl, hr) = (upload(&b, &h, &[1, m, k]), upload(&b, &hb, &[1, k, n]));
    let hout = output(&b, DType::F16, &[1, m, n]);
    launch(
        &b,
        &Kernel::Matmul {
            lhs: hl,
            rhs: hr,
            out: hout.clone(),
        },
    )
    .unwrap();
    let expected = naive_matmul(&a_data, &b_data, m, k, n);
    let got: Vec<f64> = download::<half::f16>(&b, &hout).iter().map(|v| v.to_f64()).collect();
    assert_eq!(
        got,
        expected
            .iter()
            .map(|&v| half::f16::from_f64(v).to_f64())
            .collect::<Vec<_>>()
    );
}

#[test]
fn softmax_rows_sum_to_one_along_a_strided_dim() {
    let b = CpuBackend::new();
    let data: Vec<f32> = values(24, 9);
    let x = upload(&b, &data, &[4, 6]);
    let out = output(&b, DType::F32, &[4, 6]);
    launch(
        &b,
        &Kernel::Softmax {
            input: x.clone(),
            dim: 0,
            log: false,
            causal: false,
            out: out.clone(),
        },
    )
    .unwrap();
    let y = download::<f32>(&b, &out);
    for j in 0..6 {
        let col: f32 = (0..4).map(|i| y[i * 6 + j]).sum();
        assert!((col - 1.0).abs() < 1e-6, "column {j}: {col}");
        let max = (0..4).map(|i| data[i * 6 + j]).fold(f32::NEG_INFINITY, f32::max);
        let denom: f64 = (0..4).map(|i| ((data[i * 6 + j] - max) as f64).exp()).sum();
        let expected = ((data[j] - max) as f64).exp() / denom;
        assert!((y[j] as f64 - expected).abs() < 1e-6);
    }
}

#[test]
fn fill_arange_and_random_write_views() {
    let b = CpuBackend::new();
    let out = output(&b, DType::I64, &[5]);
    launch(
        &b,
        &Kernel::Arange {
            out: out.clone(),
            start: 2.0,
            step: -1.5,
        },
    )
    .unwrap();
    assert_eq!(download::<i64>(&b, &out), vec![2, 0, -1, -2, -4]);
    let out = output(&b, DType::U8, &[3]);
    launch(
        &b,
        &Kernel::Fill {
            out: out.clone(),
            value: Scalar::Int(257),
        },
    )
    .unwrap();
    assert_eq!(download::<u8>(&b, &out), vec![1, 1, 1]);
    let out = output(&b, DType::F32, &[2, 3]);
    let t = view(&out, out.layout.transpose(0, 1).unwrap());
    launch(
        &b,
        &Kernel::Random {
            out: t.clone(),
            distribution: cartage_core::Distribution::Uniform { low: 0.0, high: 1.0 },
            seed: 42,
            offset: 10,
        },
    )
    .unwrap();
    let got = download::<f32>(&b, &t);
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, cartage_core::random::uniform_unit(42, 10 + i as u64), "element {i}");
    }
}

#[test]
fn malformed_kernels_are_errors() {
    let b = CpuBackend::new();
    let x = upload(&b, &[1.0f32; 6], &[2, 3]);
    let out = output(&b, DType::F32, &[3, 2]);
    assert!(
        launch(
            &b,
            &Kernel::Binary {
                op: BinaryOp::Add,
                lhs: x.clone(),
                rhs: x.clone(),
                out: out.clone(),
            }
        )
        .is_err()
    );
    let too_big = view(&x, Layout::contiguous(&[4, 3]).unwrap());
    assert!(
        launch(
            &b,
            &Kernel::Unary {
                op: UnaryOp::Exp,
                input: too_big.clone(),
                out: too_big,
            }
        )
        .is_err()
    );
    let mut misaligned = x.clone();
    misaligned.buffer = misaligned.buffer.slice(2, 20).unwrap();
    misaligned.layout = Layout::contiguous(&[4]).unwrap();
    let small = output(&b, DType::F32, &[4]);
    assert!(
        launch(
            &b,
            &Kernel::Unary {
                op: UnaryOp::Exp,
                input: misaligned,
                out: small,
            }
        )
        .is_err()
    );
}

#[test]
fn open_shares_one_backend_and_refuses_other_ordinals() {
    let a = crate::open(0).unwrap();
    let again = crate::open(0).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &again));
    assert!(matches!(crate::open(1), Err(Error::BackendUnavailable { .. })));
    assert_eq!(crate::device_count().unwrap(), 1);
    // Every defined op, plus the optional fused kernels the CPU has (all but conv2d and
    // attention, their backward kernels and attention's mask, which it composes: pooling,
    // forward and backward, is fused here), for every float dtype.
    for op in cartage_core::Op::all() {
        for dtype in DType::ALL {
            use cartage_core::Op::*;
            let composed = matches!(
                op,
                Conv2d | Attention | Conv2dBackwardInput | Conv2dBackwardWeight | AttentionBackward | AttentionMask
            );
            let fused_here = !composed;
            let want = op.defined_for(dtype) && (!op.optional() || fused_here);
            assert_eq!(a.capabilities().supports(op, dtype), want, "{op:?} {dtype}");
        }
    }
    let start = a.record_event().unwrap();
    let end = a.record_event().unwrap();
    assert!(a.elapsed(&start, &end).unwrap() < std::time::Duration::from_secs(1));
    assert!(a.memory_stats().reserved_bytes == 0 || a.memory_stats().segments > 0);
}

#[test]
fn half_precision_converts_in_blocks_and_rounds_once() {
    use half::f16;
    let b = CpuBackend::new();
    let n = 1000; // several blocks and a partial one
    let xs: Vec<f16> = values(n, 5).iter().map(|&v| f16::from_f32(v)).collect();
    let ys: Vec<f16> = values(n, 6).iter().map(|&v| f16::from_f32(v / 3.0)).collect();
    let (x, y) = (upload(&b, &xs, &[n]), upload(&b, &ys, &[n]));
    // In place: the output is the left operand.
    launch(
        &b,
        &Kernel::Binary {
            op: BinaryOp::Mul,
            lhs: x.clone(),
            rhs: y.clone(),
            out: x.clone(),
        },
    )
    .unwrap();
    let expected: Vec<f16> = xs
        .iter()
        .zip(&ys)
        .map(|(a, c)| f16::from_f32(a.to_f32() * c.to_f32()))
        .collect();
    assert_eq!(download::<f16>(&b, &x), expected);
    let out = output(&b, DType::F16, &[n]);
    launch(
        &b,
        &Kernel::Unary {
            op: UnaryOp::Exp,
            input: y.clone(),
            out: out.clone(),
        },
    )
    .unwrap();
    let expected: Vec<f16> = ys.iter().map(|v| f16::from_f32(v.to_f32().exp())).collect();
    assert_eq!(download::<f16>(&b, &out), expected);
    let sum = download::<f16>(&b, &reduce(&b, ReduceOp::Sum, &y, &[0]))[0].to_f64();
    let exact: f64 = ys.iter().map(|v| v.to_f64()).sum();
    assert!((sum - exact).abs() <= 1e-3 * exact.abs().max(1.0), "{sum} vs {exact}");
    let max = download::<f16>(&b, &reduce(&b, ReduceOp::Max, &y, &[0]))[0];
    assert_eq!(max, ys.iter().copied().fold(f16::NEG_INFINITY, f16::max));
}

#[test]
fn outer_dimension_reductions_fold_tiles_of_outputs() {
    let b = CpuBackend::new();
    let (rows, cols) = (300, 70);
    let data = values(rows * cols, 11);
    let x = upload(&b, &data, &[rows, cols]);
    let col = |j: usize| (0..rows).map(|i| data[i * cols + j]).collect::<Vec<f32>>();
    let sums = download::<f32>(&b, &reduce(&b, ReduceOp::Sum, &x, &[0]));
    let means = download::<f32>(&b, &reduce(&b, ReduceOp::Mean, &x, &[0]));
    let maxes = download::<f32>(&b, &reduce(&b, ReduceOp::Max, &x, &[0]));
    for j in 0..cols {
        let exact: f64 = col(j).iter().map(|&v| v as f64).sum();
        assert_eq!(sums[j], exact as f32, "column {j}");
        assert_eq!(means[j], (exact / rows as f64) as f32, "column {j}");
        assert_eq!(maxes[j], col(j).into_iter().fold(f32::NEG_INFINITY, f32::max));
    }
    let ints: Vec<i32> = (0..rows * cols).map(|i| (i as i32 * 7919) % 1000 - 500).collect();
    let xi = upload(&b, &ints, &[rows, cols]);
    let got = download::<i32>(&b, &reduce(&b, ReduceOp::Min, &xi, &[0]));
    for (j, g) in got.iter().enumerate() {
        assert_eq!(*g, (0..rows).map(|i| ints[i * cols + j]).min().unwrap());
    }
    let flags: Vec<bool> = (0..rows * cols).map(|i| i % cols == 3 && i / cols == 120).collect();
    let xb = upload(&b, &flags, &[rows, cols]);
    let any = download::<bool>(&b, &reduce(&b, ReduceOp::Max, &xb, &[0]));
    assert_eq!(any.iter().filter(|&&v| v).count(), 1);
    assert!(any[3]);
    // Large enough to split across threads: the same bits with one thread and with several.
    let (rows, cols) = (1500, 900);
    let big = upload(&b, &values(rows * cols, 12), &[rows, cols]);
    let first = download::<f32>(&b, &reduce(&b, ReduceOp::Sum, &big, &[0]));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let single = pool.install(|| download::<f32>(&b, &reduce(&b, ReduceOp::Sum, &big, &[0])));
    assert!(first.iter().zip(&single).all(|(a, c)| a.to_bits() == c.to_bits()));
}

/// Distance in units in the last place between two finite f32 of the same sign (or zero).
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn polynomial_exp_is_within_two_ulp_over_its_whole_range() {
    use crate::fast_math::exp_f32;
    let mut worst = (0u32, 0f32);
    // Every 61st f32 between -104 and 89 (about 35 million values), through both signs.
    let mut check = |x: f32| {
        let want = (x as f64).exp() as f32;
        let got = exp_f32(x);
        let d = if want.is_infinite() || got.is_infinite() {
            if want == got { 0 } else { u32::MAX }
        } else {
            ulps(got, want)
        };
        if d > worst.0 {
            worst = (d, x);
        }
    };
    for bits in (0..104f32.to_bits()).step_by(61) {
        check(-f32::from_bits(bits));
    }
    for bits in (0..89f32.to_bits()).step_by(61) {
        check(f32::from_bits(bits));
    }
    // The edges: the largest finite result, the overflow, the subnormal range, the last nonzero.
    for x in [
        88.72283, 88.7228, 88.72284, -87.33654, -87.5, -100.0, -103.2, -103.9, 1e-30, -1e-30,
    ] {
        check(x);
    }
    assert!(worst.0 <= 2, "{} ulp at x = {:e}", worst.0, worst.1);
}

#[test]
fn polynomial_exp_special_values() {
    use crate::fast_math::exp_f32;
    assert!(exp_f32(f32::NAN).is_nan());
    assert!(exp_f32(-f32::NAN).is_nan());
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(-0.0), 1.0);
    assert_eq!(exp_f32(88.8), f32::INFINITY);
    assert_eq!(exp_f32(1e30), f32::INFINITY);
    assert_eq!(exp_f32(f32::MAX), f32::INFINITY);
    assert!(exp_f32(88.72283).is_finite());
    assert_eq!(exp_f32(-104.0), 0.0);
    assert_eq!(exp_f32(-1e30), 0.0);
    assert_eq!(exp_f32(f32::MIN), 0.0);
    // Subnormal results are subnormal (not flushed to zero), and tiny inputs give 1.
    let sub = exp_f32(-100.0);
    assert!(sub > 0.0 && !sub.is_normal());
    assert_eq!(exp_f32(f32::MIN_POSITIVE), 1.0);
    assert_eq!(exp_f32(-f32::from_bits(1)), 1.0);
}

#[test]
fn polynomial_tanh_is_accurate_near_zero_and_saturates() {
    use crate::fast_math::tanh_f32;
    let mut worst = 0;
    for bits in (0..20f32.to_bits()).step_by(997) {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let d = ulps(tanh_f32(x), (x as f64).tanh() as f32);
            worst = worst.max(d);
        }
    }
    assert!(worst <= 4, "{worst} ulp");
    assert_eq!(tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    assert!(tanh_f32(f32::NAN).is_nan());
    assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
}

/// The vectorised dense path and the strided path compute the very same function.
#[test]
fn dense_and_strided_unary_paths_agree_bit_for_bit() {
    let b = CpuBackend::new();
    let data: Vec<f32> = values(4099 * 2, 21).iter().map(|v| v * 9.0).collect();
    let x = upload(&b, &data, &[4099, 2]);
    for op in [
        UnaryOp::Exp,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Round,
    ] {
        let dense = output(&b, DType::F32, &[4099, 2]);
        launch(
            &b,
            &Kernel::Unary {
                op,
                input: x.clone(),
                out: dense.clone(),
            },
        )
        .unwrap();
        let strided_in = view(&x, x.layout.transpose(0, 1).unwrap());
        let strided = output(&b, DType::F32, &[2, 4099]);
        launch(
            &b,
            &Kernel::Unary {
                op,
                input: strided_in,
                out: strided.clone(),
            },
        )
        .unwrap();
        let (d, s) = (download::<f32>(&b, &dense), download::<f32>(&b, &strided));
        for i in 0..4099 {
            for j in 0..2 {
                assert_eq!(d[i * 2 + j].to_bits(), s[j * 4099 + i].to_bits(), "{op:?} at {i},{j}");
            }
        }
    }
}

#[test]
fn sort_is_stable_and_puts_nan_above_infinity() {
    use crate::sort::sort_pairs;
    let keys = [
        2.0f32,
        f32::NAN,
        -0.0,
        1.0,
        f32::INFINITY,
        0.0,
        1.0,
        f32::NAN,
        f32::NEG_INFINITY,
        2.0,
    ];
    let mut pairs: Vec<(f32, i64)> = keys.iter().copied().zip(0..).collect();
    sort_pairs(&mut pairs, false);
    let order: Vec<i64> = pairs.iter().map(|p| p.1).collect();
    // -0 and +0 are equal keys: they keep their input order (2 before 5), as do the 1s, 2s and NaNs.
    assert_eq!(order, vec![8, 2, 5, 3, 6, 0, 9, 4, 1, 7]);
    sort_pairs(&mut pairs, true);
    let order: Vec<i64> = pairs.iter().map(|p| p.1).collect();
    assert_eq!(order, vec![1, 7, 4, 0, 9, 3, 6, 2, 5, 8]);
}

#[test]
fn sort_launch_reads_a_transposed_input_and_writes_indices() {
    let b = CpuBackend::new();
    // Rows along dim 1 of the transposed view are columns of `data`.
    let data = [3i32, 1, 1, 5, 3, 2, 1, 9, 0];
    let x = upload(&b, &data, &[3, 3]);
    let xt = view(&x, x.layout.transpose(0, 1).unwrap());
    let (values, indices) = (output(&b, DType::I32, &[3, 3]), output(&b, DType::I64, &[3, 3]));
    let kernel = Kernel::Sort {
        input: xt,
        dim: 1,
        descending: true,
        values: values.clone(),
        indices: indices.clone(),
    };
    launch(&b, &kernel).unwrap();
    // Columns: [3, 5, 1], [1, 3, 9], [1, 2, 0].
    assert_eq!(download::<i32>(&b, &values), vec![5, 3, 1, 9, 3, 1, 2, 1, 0]);
    assert_eq!(download::<i64>(&b, &indices), vec![1, 0, 2, 2, 1, 0, 1, 0, 2]);
}

/// A scan over an outer dim advances a tile of adjacent rows together; every row still
/// accumulates in order, so the results equal a plain sequential scan bit for bit.
#[test]
fn scans_over_outer_dims_match_sequential_scans() {
    use cartage_core::ScanOp;
    let b = CpuBackend::new();
    let (outer, mid, inner) = (3usize, 37usize, 70usize);
    let data: Vec<f32> = values(outer * mid * inner, 31);
    let x = upload(&b, &data, &[outer, mid, inner]);
    let ints: Vec<i32> = (0..outer * mid * inner).map(|i| (i as i32 * 7919) % 13 - 6).collect();
    let xi = upload(&b, &ints, &[outer, mid, inner]);
    let at = |o: usize, m: usize, i: usize| (o * mid + m) * inner + i;
    for op in ScanOp::ALL {
        let out = output(&b, DType::F32, &[outer, mid, inner]);
        launch(
            &b,
            &Kernel::Scan {
                op,
                input: x.clone(),
                dim: 1,
                out: out.clone(),
            },
        )
        .unwrap();
        let outi = output(&b, DType::I32, &[outer, mid, inner]);
        launch(
            &b,
            &Kernel::Scan {
                op,
                input: xi.clone(),
                dim: 1,
                out: outi.clone(),
            },
        )
        .unwrap();
        let (got, goti) = (download::<f32>(&b, &out), download::<i32>(&b, &outi));
        for o in 0..outer {
            for i in 0..inner {
                let (mut acc, mut acci) = if op == ScanOp::Sum { (0f32, 0i32) } else { (1f32, 1i32) };
                for m in 0..mid {
                    let k = at(o, m, i);
                    if op == ScanOp::Sum {
                        (acc, acci) = (acc + data[k], acci.wrapping_add(ints[k]));
                    } else {
                        (acc, acci) = (acc * data[k], acci.wrapping_mul(ints[k]));
                    }
                    assert_eq!(got[k].to_bits(), acc.to_bits(), "{op:?} at {o},{m},{i}");
                    assert_eq!(goti[k], acci, "{op:?} i32 at {o},{m},{i}");
                }
            }
        }
    }
}

/// Scatter-add sums duplicate indices; an index past the end is a typed error naming it.
#[test]
fn scatter_add_sums_duplicates_and_rejects_bad_indices() {
    use cartage_core::ScatterMode;
    let b = CpuBackend::new();
    let out = upload(&b, &[0i64; 8], &[2, 4]);
    let src = upload(&b, &[1i64, 2, 3, 10, 20, 30], &[2, 3]);
    let index = upload(&b, &[3i32, 3, 0, 1, 1, 1], &[2, 3]);
    let kernel = Kernel::Scatter {
        mode: ScatterMode::Add,
        src: src.clone(),
        index,
        dim: 1,
        out: out.clone(),
    };
    launch(&b, &kernel).unwrap();
    assert_eq!(download::<i64>(&b, &out), vec![3, 0, 0, 3, 0, 60, 0, 0]);
    let bad = upload(&b, &[0i32, 4, 1, 1, 1, 1], &[2, 3]);
    let kernel = Kernel::Scatter {
        mode: ScatterMode::Assign,
        src,
        index: bad,
        dim: 1,
        out,
    };
    let err = launch(&b, &kernel).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 4,
                dim: 1,
                size: 4,
                ..
            }
        ),
        "{err}"
    );
}

/// The norms' weight and bias gradients are sums over rows in fixed chunks: the same bits for
/// any number of threads (and run to run), and close to the sums taken in f64.
#[test]
fn norm_parameter_gradients_are_bit_identical_across_thread_counts() {
    use cartage_core::{NormBackwardArgs, NormKind};
    let b = CpuBackend::new();
    let (rows, cols) = (3000, 700);
    let xs = values(rows * cols, 5);
    let gs = values(rows * cols, 6);
    let x = upload(&b, &xs, &[rows, cols]);
    let g = upload(&b, &gs, &[rows, cols]);
    let run = || {
        let (dx, dw, db) = (
            output(&b, DType::F32, &[rows, cols]),
            output(&b, DType::F32, &[cols]),
            output(&b, DType::F32, &[cols]),
        );
        let kernel = Kernel::NormBackward(Box::new(NormBackwardArgs {
            kind: NormKind::Layer,
            input: x.clone(),
            weight: None,
            grad: g.clone(),
            eps: 1e-5,
            grad_input: dx,
            grad_weight: Some(dw.clone()),
            grad_bias: Some(db.clone()),
        }));
        launch(&b, &kernel).unwrap();
        let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        (bits(download::<f32>(&b, &dw)), bits(download::<f32>(&b, &db)))
    };
    let first = run();
    assert_eq!(run(), first, "run to run");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert_eq!(pool.install(run), first, "{threads} threads");
    }
    for c in [0, 1, cols / 2, cols - 1] {
        let exact: f64 = (0..rows).map(|r| f64::from(gs[r * cols + c])).sum();
        let got = f64::from(f32::from_bits(first.1[c]));
        assert!(
            (got - exact).abs() < 1e-3 * (1.0 + exact.abs()),
            "column {c}: {got} vs {exact}"
        );
    }
}
