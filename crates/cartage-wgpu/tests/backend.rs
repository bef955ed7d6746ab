//! The wgpu backend's own contract beyond the conformance suite: typed out-of-memory and
//! binding-limit errors, index errors found on the device, f64 refusals that name device, dtype
//! and op, malformed kernels refused before any work, batched
//! recording across batch boundaries, chunked dispatch, timing, and the stable adapter order.

mod common;

use cartage_core::allocator::testing::MockSource;
use cartage_core::{
    Backend, BinaryOp, CachingAllocator, DType, Device, Error, Kernel, Layout, Op, ReduceOp, Scalar, TensorArg, UnaryOp,
};
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
    let (xb, x) = upload(&b, &[1.0f32, 2.0], &[2]);
    assert_eq!(download::<f32>(&xb, &x), vec![1.0, 2.0]);
    assert!(b.memory_stats().oom_count >= 1);
}

#[test]
fn bad_indices_are_index_errors_at_the_next_sync() {
    let Some(b) = backend("bad_indices_are_index_errors_at_the_next_sync") else {
        return;
    };
    let (xb, input) = upload(&b, &[10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0], &[2, 3]);
    for (index_values, bad) in [(vec![0i64, 3], 3i64), (vec![-1, 0], -1), (vec![1 << 40, 0], 1 << 40)] {
        let (ib, index) = upload(&b, &index_values, &[2]);
        let (ob, out) = empty::<f32>(&b, &[2, 2]);
        Kernel::IndexSelect {
            input: input.clone(),
            index,
            dim: 1,
            out,
        }
        .run(&[&xb, &ib, &ob])
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
    let (ib, index) = upload(&b, &[0i32, 1, 2, 0, 1, 7], &[2, 3]);
    let (ob, out) = empty::<f32>(&b, &[2, 3]);
    Kernel::Gather {
        input: input.clone(),
        index,
        dim: 1,
        out: out.clone(),
    }
    .run(&[&xb, &ib, &ob])
    .unwrap();
    let mut bytes = vec![0u8; 24];
    let err = ob.read(0, &mut bytes).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { index: 7, .. }), "{err}");
    b.synchronize().unwrap();
    // Valid indices gather the right values.
    let (ib, index) = upload(&b, &[2i32, 0, 1, 1, 2, 0], &[2, 3]);
    Kernel::Gather {
        input,
        index,
        dim: 1,
        out: out.clone(),
    }
    .run(&[&xb, &ib, &ob])
    .unwrap();
    assert_eq!(download::<f32>(&ob, &out), vec![30.0, 10.0, 20.0, 50.0, 60.0, 40.0]);
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
    let (xb, x) = upload(&b, &[1.0f64, 2.0], &[2]);
    let (ob, out) = empty::<f64>(&b, &[2]);
    let exp = Kernel::Unary {
        op: UnaryOp::Exp,
        input: x.clone(),
        out: out.clone(),
    };
    match exp.run(&[&xb, &ob]) {
        Err(Error::Unsupported {
            op,
            dtype,
            device,
            reason,
        }) => {
            assert_eq!((op.as_str(), dtype, device), ("exp", Some(DType::F64), Device::wgpu(0)));
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
        add.run(&[&xb, &ob]).unwrap();
        assert_eq!(download::<f64>(&ob, &out), vec![2.0, 4.0]);
    } else {
        assert!(matches!(add.run(&[&xb, &ob]), Err(Error::Unsupported { .. })));
    }
}

#[test]
fn a_long_chain_between_syncs_crosses_batches_correctly() {
    let Some(b) = backend("a_long_chain_between_syncs_crosses_batches_correctly") else {
        return;
    };
    let n = 1000;
    let (xb, x) = upload(&b, &vec![0.0f32; n], &[n]);
    let (oneb, one) = upload(&b, &[1.0f32], &[1]);
    let one = TensorArg {
        layout: one.layout.broadcast_to(&[n]).unwrap(),
        ..one
    };
    let (dispatches, submits) = b.dispatch_counters();
    let steps = 2500;
    for _ in 0..steps {
        Kernel::Binary {
            op: BinaryOp::Add,
            lhs: x.clone(),
            rhs: one.clone(),
            out: x.clone(),
        }
        .run(&[&xb, &oneb])
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
    assert_eq!(download::<f32>(&xb, &x), vec![steps as f32; n]);
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
    let (xb, x) = empty::<f32>(&b, &[n]);
    let (yb, y) = empty::<f32>(&b, &[n]);
    let (zb, z) = empty::<f32>(&b, &[n]);
    Kernel::Arange {
        out: x.clone(),
        start: 0.0,
        step: 1.0,
    }
    .run(&[&xb])
    .unwrap();
    Kernel::Fill {
        out: y.clone(),
        value: Scalar::Float(0.5),
    }
    .run(&[&yb])
    .unwrap();
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: y,
        out: z,
    }
    .run(&[&xb, &yb, &zb])
    .unwrap();
    for i in [0usize, 1, limit / 4 - 1, limit / 4, n - 1] {
        let mut bytes = [0u8; 4];
        zb.read(i * 4, &mut bytes).unwrap();
        assert_eq!(f32::from_le_bytes(bytes), i as f32 + 0.5, "element {i}");
    }
    // A reduction has no chunked form: it says the binding limit is the cause.
    let (ob, out) = empty::<f32>(&b, &[1]);
    let err = Kernel::Reduce {
        op: ReduceOp::Sum,
        input: x,
        dims: [0usize].into_iter().collect(),
        out,
    }
    .run(&[&xb, &ob])
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
    let (xb, x) = empty::<f32>(&b, &[n]);
    let start = b.record_event().unwrap();
    for _ in 0..10 {
        Kernel::Fill {
            out: x.clone(),
            value: Scalar::Float(1.0),
        }
        .run(&[&xb])
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
    let (sb, src) = upload(&b, &values, &[rows, cols]);
    let (db, dst) = empty::<u8>(&b, &[cols, rows]);
    let dst_t = TensorArg {
        layout: Layout::contiguous(&[cols, rows]).unwrap().transpose(0, 1).unwrap(),
        ..dst.clone()
    };
    Kernel::Copy { input: src, out: dst_t }.run(&[&sb, &db]).unwrap();
    let got = download::<u8>(&db, &dst);
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(got[c * rows + r], values[r * cols + c], "({r}, {c})");
        }
    }
}

#[test]
fn misaligned_and_overlapping_operands_are_refused_before_any_work() {
    let Some(b) = backend("misaligned_and_overlapping_operands_are_refused") else {
        return;
    };
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let (xb, x) = upload(&b, &values, &[16]);
    let refused = |kernel: Kernel, what: &str| {
        let err = kernel.run(&[&xb]).expect_err(what);
        assert!(matches!(err, Error::InvalidArgument { .. }), "{what}: {err}");
        err.to_string()
    };
    // Views of 8 elements starting `elements` elements into the buffer.
    let shifted = |elements: usize| TensorArg {
        buffer: xb.range(4 * elements, 32).unwrap(),
        layout: Layout::contiguous(&[8]).unwrap(),
        dtype: DType::F32,
    };
    // An f32 operand two bytes into its buffer: inside the buffer, but not on an element.
    let misaligned = TensorArg {
        buffer: xb.range(2, 32).unwrap(),
        ..shifted(0)
    };
    let message = refused(
        Kernel::Unary {
            op: UnaryOp::Neg,
            input: misaligned.clone(),
            out: shifted(8),
        },
        "misaligned input",
    );
    assert!(message.contains("aligned"), "{message}");
    refused(
        Kernel::Fill {
            out: misaligned,
            value: Scalar::Float(1.0),
        },
        "misaligned fill",
    );
    // An output one element past the input, over the same bytes: a race, not an in-place op.
    let message = refused(
        Kernel::Binary {
            op: BinaryOp::Add,
            lhs: shifted(0),
            rhs: shifted(0),
            out: shifted(1),
        },
        "overlapping output",
    );
    assert!(message.contains("shares memory"), "{message}");
    // Softmax reads a whole row: even the exact same view cannot be its output.
    refused(
        Kernel::Softmax {
            input: shifted(0),
            dim: 0,
            log: false,
            causal: false,
            out: shifted(0),
        },
        "softmax in place",
    );
    // A broadcast output maps several elements to one address.
    refused(
        Kernel::Fill {
            out: TensorArg {
                layout: Layout::contiguous(&[1]).unwrap().broadcast_to(&[4]).unwrap(),
                ..shifted(0)
            },
            value: Scalar::Float(1.0),
        },
        "broadcast output",
    );
    // Nothing ran: the buffer still holds what was uploaded.
    assert_eq!(download::<f32>(&xb, &x), values);
    // The exact same view is an element-wise op in place, which is allowed.
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: x.clone(),
        out: x.clone(),
    }
    .run(&[&xb])
    .unwrap();
    let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    assert_eq!(download::<f32>(&xb, &x), doubled);
    // Overlapping ranges of one buffer are not copied either (a copy kernel would race).
    let (from, to) = (xb.range(0, 32).unwrap(), xb.range(4, 32).unwrap());
    // SAFETY: both ranges lie inside `xb`, which is alive and borrowed for the call.
    let copied = unsafe { b.copy_within(from, to) };
    assert!(matches!(copied, Err(Error::InvalidArgument { .. })), "{copied:?}");
    assert_eq!(download::<f32>(&xb, &x), doubled);
}

#[test]
fn slices_of_foreign_memory_never_reach_the_device() {
    let Some(b) = backend("slices_of_foreign_memory_never_reach_the_device") else {
        return;
    };
    // A block of another allocator: its segment id also names a (small) segment of this device,
    // its byte range lies far outside it.
    let foreign = CachingAllocator::new(Device::wgpu(0), Box::new(MockSource::new(4 << 30)), Default::default());
    let block = foreign.alloc(3 << 30).unwrap();
    let far = block.slice().slice(2 << 30, 64).unwrap();
    let fill = Kernel::Fill {
        out: TensorArg {
            buffer: far,
            layout: Layout::contiguous(&[16]).unwrap(),
            dtype: DType::F32,
        },
        value: Scalar::Float(1.0),
    };
    // SAFETY: the contract is broken on purpose (the slice is not memory of this backend). The
    // wgpu backend checks every range against its segment before it records or copies anything,
    // so each call returns an error and touches no memory; this test keeps that check in place.
    let launched = unsafe { b.launch(&fill) };
    let err = launched.expect_err("a launch on foreign memory");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("segment"), "{err}");
    // SAFETY: as above.
    let written = unsafe { b.write(far, &[0u8; 64]) };
    assert!(written.is_err());
    let mut bytes = [0u8; 64];
    // SAFETY: as above.
    let read = unsafe { b.read(far, &mut bytes) };
    assert!(read.is_err());
    foreign.free(block);
    b.synchronize().unwrap();
}
