//! Host↔device copies: pinned memory as mapped wgpu buffers copied in place (both directions,
//! repeatedly, interleaved with kernels, with forgotten handles and unaligned ranges, waited on
//! from several threads at once), and large copies from and to ordinary memory through the
//! staging rings (several chunks, unaligned ends).

mod common;

use cartage_core::{Backend, BinaryOp, Device, DeviceBuffer, HostStaging, Kernel, PinnedBuffer, TensorArg};
use common::{backend, device, download, empty, upload};

/// Deterministic bytes, distinct for each `seed`.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn pinned_buffers_are_mapped_device_memory_copied_both_ways() {
    let Some(b) = backend("pinned_buffers_are_mapped_device_memory_copied_both_ways") else {
        return;
    };
    let mut pinned: PinnedBuffer = b.alloc_pinned(4096).unwrap();
    assert_eq!(pinned.device(), Device::wgpu(0));
    assert_eq!(pinned.pinned_for(), Some(Device::wgpu(0)));
    assert!(pinned.as_slice().iter().all(|&x| x == 0), "pinned memory starts zeroed");
    assert!(b.alloc_staging(64).unwrap().is_pinned());
    let buffer = DeviceBuffer::new(&device(&b), 4096).unwrap();
    let mut back = b.alloc_pinned(4096).unwrap();
    let address = pinned.as_slice().as_ptr();
    // The same buffers, many times: each copy unmaps and maps the buffer back at its address.
    for round in 0..5 {
        let data = pattern(4096, round);
        pinned.as_mut_slice().copy_from_slice(&data);
        buffer.write_async(0, &pinned, 4096).unwrap().wait().unwrap();
        buffer.read_async(0, &mut back, 4096).unwrap().wait().unwrap();
        assert_eq!(back.as_slice(), data.as_slice(), "round {round}");
        assert_eq!(pinned.as_slice().as_ptr(), address);
    }
    // A partial copy at an offset; the rest of the device buffer keeps its bytes.
    let before = pattern(4096, 4);
    pinned.as_mut_slice()[..1024].fill(0xab);
    buffer.write_async(2048, &pinned, 1024).unwrap().wait().unwrap();
    let mut all = vec![0u8; 4096];
    buffer.read(0, &mut all).unwrap();
    assert_eq!(&all[..2048], &before[..2048]);
    assert!(all[2048..3072].iter().all(|&x| x == 0xab));
    assert_eq!(&all[3072..], &before[3072..]);
    // Unaligned ranges take the synchronous path and are still exact.
    pinned.as_mut_slice()[..7].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7]);
    buffer.write_async(3, &pinned, 7).unwrap().wait().unwrap();
    buffer.read_async(1, &mut back, 11).unwrap().wait().unwrap();
    assert_eq!(
        &back.as_slice()[..11],
        &[before[1], before[2], 1, 2, 3, 4, 5, 6, 7, before[10], before[11]]
    );
    // A copy larger than the host buffer is an error, not a short copy.
    assert!(buffer.write_async(0, &b.alloc_pinned(16).unwrap(), 32).is_err());
}

#[test]
fn a_forgotten_pinned_copy_still_completes_before_the_bytes_are_touched() {
    let Some(b) = backend("a_forgotten_pinned_copy_still_completes_before_the_bytes_are_touched") else {
        return;
    };
    let n = 1 << 20;
    let data = pattern(n, 9);
    let buffer = DeviceBuffer::new(&device(&b), n).unwrap();
    buffer.write(0, &data).unwrap();
    let mut back = b.alloc_pinned(n).unwrap();
    std::mem::forget(buffer.read_async(0, &mut back, n).unwrap());
    // Reading the bytes waits for the forgotten copy.
    assert_eq!(back.as_slice(), data.as_slice());
    // Two uploads from one buffer without waiting in between: the second waits for the first.
    let mut src = b.alloc_pinned(n).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(n, 10));
    let other = DeviceBuffer::new(&device(&b), n).unwrap();
    let first = buffer.write_async(0, &src, n).unwrap();
    let second = other.write_async(0, &src, n).unwrap();
    second.wait().unwrap();
    first.wait().unwrap();
    let mut out = vec![0u8; n];
    other.read(0, &mut out).unwrap();
    assert_eq!(out, pattern(n, 10));
    buffer.read(0, &mut out).unwrap();
    assert_eq!(out, pattern(n, 10));
    // Dropping a buffer with a copy in flight waits for it.
    let mut last = b.alloc_pinned(n).unwrap();
    std::mem::forget(buffer.read_async(0, &mut last, n).unwrap());
    drop(last);
}

#[test]
fn pinned_copies_are_ordered_with_kernels() {
    let Some(b) = backend("pinned_copies_are_ordered_with_kernels") else {
        return;
    };
    let n = 1024;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (buf_a, arg_a) = upload(&b, &a, &[n]);
    let (buf_out, arg_out) = empty::<f32>(&b, &[n]);
    let mut pinned = b.alloc_pinned(n * 4).unwrap();
    pinned.as_mut_slice_of::<f32>().unwrap().fill(100.0);
    // out = a + a, then the pinned upload overwrites a, then out = out + a (the new a).
    let add = |out: &TensorArg, x: &TensorArg, y: &TensorArg| Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: y.clone(),
        out: out.clone(),
    };
    // SAFETY: every operand lies in a live buffer held until the end of the test.
    unsafe { b.launch(&add(&arg_out, &arg_a, &arg_a)) }.unwrap();
    let copy = buf_a.write_async(0, &pinned, n * 4).unwrap();
    // SAFETY: as above.
    unsafe { b.launch(&add(&arg_out, &arg_out, &arg_a)) }.unwrap();
    copy.wait().unwrap();
    let out: Vec<f32> = download(&buf_out, &arg_out);
    let want: Vec<f32> = (0..n).map(|i| 2.0 * i as f32 + 100.0).collect();
    assert_eq!(out, want);
    let mut back = b.alloc_pinned(n * 4).unwrap();
    buf_out.read_async(0, &mut back, n * 4).unwrap().wait().unwrap();
    assert_eq!(back.as_slice_of::<f32>().unwrap(), want.as_slice());
}

#[test]
fn large_pageable_copies_go_through_the_rings_exactly() {
    let Some(b) = backend("large_pageable_copies_go_through_the_rings_exactly") else {
        return;
    };
    // Several 16 MiB chunks (more than the ring's slots) plus a partial one, at odd offsets.
    let n = 5 * (16 << 20) + 12_345;
    let data = pattern(n, 3);
    let buffer = DeviceBuffer::new(&device(&b), n + 8).unwrap();
    buffer.write(0, &pattern(n + 8, 4)).unwrap();
    buffer.write(3, &data).unwrap();
    let mut back = vec![0u8; n];
    buffer.read(3, &mut back).unwrap();
    assert!(back == data, "the bytes differ after a ring round trip");
    let mut edges = [0u8; 8];
    buffer.read(0, &mut edges[..3]).unwrap();
    buffer.read(n + 3, &mut edges[3..]).unwrap();
    let old = pattern(n + 8, 4);
    assert_eq!(&edges[..3], &old[..3]);
    assert_eq!(&edges[3..], &old[n + 3..]);
    // Again, aligned, to reuse the slots after they were mapped back.
    let again = pattern(n - 1, 5);
    buffer.write(4, &again).unwrap();
    let mut back = vec![0u8; n - 1];
    buffer.read(4, &mut back).unwrap();
    assert!(back == again, "the bytes differ on the second ring round trip");
}

#[test]
fn pinned_copies_waited_on_from_several_threads_at_once_all_complete() {
    let Some(b) = backend("pinned_copies_waited_on_from_several_threads_at_once_all_complete") else {
        return;
    };
    // Each thread's wait polls the device, and a poll runs the map callbacks of every copy it
    // finds finished, other threads' included: a waiter must not conclude from its own poll that
    // its buffer was never mapped back while another thread is still running that callback.
    let n = 64 * 1024;
    std::thread::scope(|scope| {
        for thread in 0..8u32 {
            let b = &b;
            scope.spawn(move || {
                let buffer = DeviceBuffer::new(&device(b), n).unwrap();
                let mut pinned = b.alloc_pinned(n).unwrap();
                let mut back = b.alloc_pinned(n).unwrap();
                for round in 0..400 {
                    let data = pattern(n, thread * 1000 + round);
                    pinned.as_mut_slice().copy_from_slice(&data);
                    buffer.write_async(0, &pinned, n).unwrap().wait().unwrap();
                    buffer.read_async(0, &mut back, n).unwrap().wait().unwrap();
                    assert!(back.as_slice() == data.as_slice(), "thread {thread}, round {round}");
                }
            });
        }
    });
}
