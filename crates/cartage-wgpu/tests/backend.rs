//! The wgpu backend's own contract beyond the conformance suite: typed out-of-memory and
//! binding-limit errors, index errors found on the device, f64 refusals that name device, dtype
//! and op, batched recording across batch boundaries, chunked dispatch, timing, and the stable
//! adapter order.

mod common;

use cartage_core::{Backend, BinaryOp, DType, Device, Error, Kernel, Layout, Op, ReduceOp, Scalar, TensorArg, UnaryOp};
use common::{backend, download, empty, upload};

#[test]
fn opening_twice_gives_the_same_device_and_bad_ordinals_are_typed() {
    let Some(b) = backend("opening_twice_gives_the_same_device") else {
        return;
    };
    let again = cartage_wgpu::open(0).unwrap();
    assert_eq!(again.device(), Device::wgpu(0));
    assert!(std::ptr::addr_eq(
        std::sync::Arc::as_ptr(&again),
        std::sync::Arc::as_ptr(&b)
    ));
    let count = cartage_wgpu::device_count().unwrap();
    assert!(count >= 1);
    match cartage_wgpu::open(count) {
        Err(Error::BackendUnavailable { device, reason }) => {
            assert_eq!(device, Device::wgpu(count));
            assert!(reason.contains("ordinal"), "{reason}");
        }
        other => panic!("expected BackendUnavailable, got {:?}", other.map(|b| b.device())),
    }
    let names = cartage_wgpu::adapter_names();
    assert_eq!(names.len(), count);
    assert!(names[0].contains(&b.info().name), "{names:?}");
}

#[test]
fn device_exhaustion_is_a_typed_out_of_memory() {
    let Some(b) = backend("device_exhaustion_is_a_typed_out_of_memory") else {
        return;
    };
    let too_big = (b.limits().max_buffer_size as usize).saturating_mul(4);
    match b.alloc(too_big, std::panic::Location::caller()) {
        Err(Error::OutOfMemory(report)) => {
            assert_eq!(report.device, Device::wgpu(0));
            assert_eq!(report.requested, too_big);
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("allocating {too_big} bytes succeeded"),
    }
    // The device is still usable afterwards.
    let (_a, x) = upload(&b, &[1.0f32, 2.0], &[2]);
    assert_eq!(download::<f32>(&b, &x), vec![1.0, 2.0]);
    assert!(b.memory_stats().oom_count >= 1);
}

#[test]
fn bad_indices_are_index_errors_at_the_next_sync() {
    let Some(b) = backend("bad_indices_are_index_errors_at_the_next_sync") else {
        return;
    };
    let (_x, input) = upload(&b, &[10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0], &[2, 3]);
    for (index_values, bad) in [(vec![0i64, 3], 3i64), (vec![-1, 0], -1), (vec![1 << 40, 0], 1 << 40)] {
        let (_i, index) = upload(&b, &index_values, &[2]);
        let (_o, out) = empty::<f32>(&b, &[2, 2]);
        b.launch(&Kernel::IndexSelect {
            input: input.clone(),
            index,
            dim: 1,
            out,
        })
        .unwrap();
        match b.synchronize() {
            Err(Error::IndexOutOfRange {
                op,
                index,
                dim,
                size,
                device,
            }) => {
                assert_eq!(
                    (op, index, dim, size, device),
                    ("index_select", bad, 1, 3, Device::wgpu(0))
                );
            }
            other => panic!("expected IndexOutOfRange for {bad}, got {other:?}"),
        }
    }
    // i32 indices through gather; the error surfaces at a read too, and clears afterwards.
    let (_i, index) = upload(&b, &[0i32, 1, 2, 0, 1, 7], &[2, 3]);
    let (_o, out) = empty::<f32>(&b, &[2, 3]);
    b.launch(&Kernel::Gather {
        input: input.clone(),
        index,
        dim: 1,
        out: out.clone(),
    })
    .unwrap();
    let mut bytes = vec![0u8; 24];
    let err = b.read(out.buffer, &mut bytes).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { index: 7, .. }), "{err}");
    b.synchronize().unwrap();
    // Valid indices gather the right values.
    let (_i, index) = upload(&b, &[2i32, 0, 1, 1, 2, 0], &[2, 3]);
    b.launch(&Kernel::Gather {
        input,
        index,
        dim: 1,
        out: out.clone(),
    })
    .unwrap();
    assert_eq!(download::<f32>(&b, &out), vec![30.0, 10.0, 20.0, 50.0, 60.0, 40.0]);
}

#[test]
fn refused_ops_name_device_dtype_and_op() {
    let Some(b) = backend("refused_ops_name_device_dtype_and_op") else {
        return;
    };
    let has_f64 = b.features().contains(wgpu::Features::SHADER_F64);
    assert_eq!(
        b.capabilities().supports(Op::Binary(BinaryOp::Add), DType::F64),
        has_f64
    );
    let (_x, x) = upload(&b, &[1.0f64, 2.0], &[2]);
    let (_o, out) = empty::<f64>(&b, &[2]);
    let exp = Kernel::Unary {
        op: UnaryOp::Exp,
        input: x.clone(),
        out: out.clone(),
    };
    match b.launch(&exp) {
        Err(Error::Unsupported {
            op,
            dtype,
            device,
            reason,
        }) => {
            assert_eq!((op.as_str(), dtype, device), ("exp", DType::F64, Device::wgpu(0)));
            assert!(
                reason.contains("SHADER_F64") || reason.contains("GLSL.std.450"),
                "{reason}"
            );
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let add = Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: x,
        out: out.clone(),
    };
    if has_f64 {
        b.launch(&add).unwrap();
        assert_eq!(download::<f64>(&b, &out), vec![2.0, 4.0]);
    } else {
        assert!(matches!(b.launch(&add), Err(Error::Unsupported { .. })));
    }
    // i64 arithmetic is refused, i64 data movement is not.
    let (_i, i) = upload(&b, &[5i64, -7], &[2]);
    let (_j, j) = empty::<i64>(&b, &[2]);
    let sum = Kernel::Binary {
        op: BinaryOp::Add,
        lhs: i.clone(),
        rhs: i.clone(),
        out: j.clone(),
    };
    assert!(matches!(
        b.launch(&sum),
        Err(Error::Unsupported { dtype: DType::I64, .. })
    ));
    b.launch(&Kernel::Copy {
        input: i,
        out: j.clone(),
    })
    .unwrap();
    assert_eq!(download::<i64>(&b, &j), vec![5, -7]);
}

#[test]
fn a_long_chain_between_syncs_crosses_batches_correctly() {
    let Some(b) = backend("a_long_chain_between_syncs_crosses_batches_correctly") else {
        return;
    };
    let n = 1000;
    let (_x, x) = upload(&b, &vec![0.0f32; n], &[n]);
    let (_o, one) = upload(&b, &[1.0f32], &[1]);
    let one = TensorArg {
        layout: one.layout.broadcast_to(&[n]).unwrap(),
        ..one
    };
    let (dispatches, submits) = b.dispatch_counters();
    let steps = 2500;
    for _ in 0..steps {
        b.launch(&Kernel::Binary {
            op: BinaryOp::Add,
            lhs: x.clone(),
            rhs: one.clone(),
            out: x.clone(),
        })
        .unwrap();
    }
    let (d, s) = b.dispatch_counters();
    // (Other tests may use the device at the same time: their work counts too.)
    assert!(d - dispatches >= steps as u64);
    // 2500 ops go in a few batches, not one submit per op.
    assert!(
        s - submits < steps as u64 / 10,
        "{} submits for {steps} ops",
        s - submits
    );
    assert_eq!(download::<f32>(&b, &x), vec![steps as f32; n]);
}

#[test]
fn operands_beyond_one_binding_are_chunked_or_refused_by_name() {
    let Some(b) = backend("operands_beyond_one_binding") else {
        return;
    };
    let limit = b.limits().max_storage_buffer_binding_size as usize;
    if limit > (512 << 20) {
        eprintln!(
            "SKIP wgpu/operands_beyond_one_binding: the binding limit ({limit} bytes) is too large to exceed cheaply"
        );
        return;
    }
    let n = limit / 4 + 1000;
    let alloc = |shape: &[usize]| -> (cartage_core::Allocation, TensorArg) { empty::<f32>(&b, shape) };
    let (_a, x) = alloc(&[n]);
    let (_b, y) = alloc(&[n]);
    let (_c, z) = alloc(&[n]);
    b.launch(&Kernel::Arange {
        out: x.clone(),
        start: 0.0,
        step: 1.0,
    })
    .unwrap();
    b.launch(&Kernel::Fill {
        out: y.clone(),
        value: Scalar::Float(0.5),
    })
    .unwrap();
    b.launch(&Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: y,
        out: z.clone(),
    })
    .unwrap();
    for i in [0usize, 1, limit / 4 - 1, limit / 4, n - 1] {
        let mut bytes = [0u8; 4];
        b.read(z.buffer.slice(i * 4, 4).unwrap(), &mut bytes).unwrap();
        assert_eq!(f32::from_le_bytes(bytes), i as f32 + 0.5, "element {i}");
    }
    // A reduction has no chunked form: it says the binding limit is the cause.
    let (_o, out) = empty::<f32>(&b, &[1]);
    let err = b
        .launch(&Kernel::Reduce {
            op: ReduceOp::Sum,
            input: x,
            dims: [0usize].into_iter().collect(),
            out,
        })
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("max_storage_buffer_binding_size"), "{err}");
}

#[test]
fn events_time_device_work() {
    let Some(b) = backend("events_time_device_work") else {
        return;
    };
    let n = 1 << 20;
    let (_x, x) = empty::<f32>(&b, &[n]);
    let start = b.record_event().unwrap();
    for _ in 0..10 {
        b.launch(&Kernel::Fill {
            out: x.clone(),
            value: Scalar::Float(1.0),
        })
        .unwrap();
    }
    let end = b.record_event().unwrap();
    let elapsed = b.elapsed(&start, &end).unwrap();
    assert!(elapsed.as_nanos() > 0, "{elapsed:?}");
    assert!(elapsed.as_secs() < 60, "{elapsed:?}");
    let zero = b.elapsed(&end, &end).unwrap();
    assert_eq!(zero.as_nanos(), 0);
}

#[test]
fn strided_packed_outputs_do_not_race() {
    let Some(b) = backend("strided_packed_outputs_do_not_race") else {
        return;
    };
    // Write a transposed u8 view element by element: neighbours in a word come from different
    // invocations, which must not lose each other's bytes.
    let (rows, cols) = (37, 29);
    let values: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 251) as u8).collect();
    let (_s, src) = upload(&b, &values, &[rows, cols]);
    let (_d, dst) = empty::<u8>(&b, &[cols, rows]);
    let dst_t = TensorArg {
        layout: Layout::contiguous(&[cols, rows]).unwrap().transpose(0, 1).unwrap(),
        ..dst.clone()
    };
    b.launch(&Kernel::Copy { input: src, out: dst_t }).unwrap();
    let got = download::<u8>(&b, &dst);
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(got[c * rows + r], values[r * cols + c], "({r}, {c})");
        }
    }
}
