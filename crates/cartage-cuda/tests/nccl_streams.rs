//! The communicator's own stream (feature `nccl`): a collective runs beside the compute queued
//! after it, and stays ordered against the compute that writes its operands just before it,
//! reads them just after it, or reuses their memory once they are freed.
//!
//! World size 1 on one GPU: NCCL runs a one-rank collective on the communicator's stream as a
//! kernel (an f32 average scales by 1/1) or a device copy (an all-gather, a reduce-scatter), so
//! it takes device time that CUDA events can see. On two GPUs of one process (when there are
//! two), an all-reduce against the sums computed on the host.
//!
//! Without a CUDA device or without NCCL each test prints a SKIP line, and fails instead under
//! `CARTAGE_REQUIRE=cuda`. The two-GPU test skips loudly on a machine with one GPU (also under
//! `CARTAGE_REQUIRE=cuda`, so that the single-GPU run stays green).
#![cfg(feature = "nccl")]

mod nccl_support;

use std::sync::Arc;

use cartage_core::{
    Backend, BinaryOp, Collective, CollectiveArg, CollectiveEngine, DType, DeviceBuffer, Kernel, Layout, ReduceKind,
    Scalar, TensorArg,
};
use cartage_cuda::nccl::NcclEngine;
use nccl_support::{backends, serial};

/// A group of one on `backend`, through the engine's id and join.
fn alone(backend: &Arc<dyn Backend>) -> Arc<dyn Collective> {
    let engine = NcclEngine::new();
    let id = engine.unique_id(backend).unwrap();
    engine.join(backend, &id, 0, 1).unwrap()
}

fn alloc(backend: &Arc<dyn Backend>, elements: usize) -> DeviceBuffer {
    DeviceBuffer::new(backend, elements * 4).expect("alloc")
}

/// The first `shape.product()` f32 elements of `buf`.
fn f32s(buf: &DeviceBuffer, shape: &[usize]) -> TensorArg {
    buf.arg(Layout::contiguous(shape).unwrap(), DType::F32)
}

fn operand(buf: &DeviceBuffer, n: usize) -> CollectiveArg<'_> {
    CollectiveArg::new(buf, f32s(buf, &[n])).expect("operand")
}

fn fill(buf: &DeviceBuffer, n: usize, value: f64) {
    Kernel::Fill {
        out: f32s(buf, &[n]),
        value: Scalar::Float(value),
    }
    .run(&[buf])
    .expect("fill");
}

/// `buf[i] = start + i` on the compute stream.
fn arange(buf: &DeviceBuffer, n: usize, start: f64) {
    Kernel::Arange {
        out: f32s(buf, &[n]),
        start,
        step: 1.0,
    }
    .run(&[buf])
    .expect("arange");
}

/// `out = lhs + rhs` on the compute stream.
fn add(lhs: &DeviceBuffer, rhs: &DeviceBuffer, out: &DeviceBuffer, n: usize) {
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: f32s(lhs, &[n]),
        rhs: f32s(rhs, &[n]),
        out: f32s(out, &[n]),
    }
    .run(&[lhs, rhs, out])
    .expect("add");
}

/// Square matrices of side `m` for a long matmul on the compute stream.
struct Busy {
    m: usize,
    x: DeviceBuffer,
    y: DeviceBuffer,
    z: DeviceBuffer,
}

impl Busy {
    fn new(backend: &Arc<dyn Backend>, m: usize) -> Self {
        let busy = Busy {
            m,
            x: alloc(backend, m * m),
            y: alloc(backend, m * m),
            z: alloc(backend, m * m),
        };
        fill(&busy.x, m * m, 0.5);
        fill(&busy.y, m * m, 0.25);
        busy
    }

    /// Queue `times` products `z = x × y`.
    fn run(&self, times: usize) {
        let shape = [1, self.m, self.m];
        for _ in 0..times {
            Kernel::Matmul {
                lhs: f32s(&self.x, &shape),
                rhs: f32s(&self.y, &shape),
                out: f32s(&self.z, &shape),
            }
            .run(&[&self.x, &self.y, &self.z])
            .expect("matmul");
        }
    }
}

fn download(buf: &DeviceBuffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    buf.read(0, &mut bytes).expect("read");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The first index where `got` differs from `want(i)`, with both values.
fn first_mismatch(got: &[f32], want: impl Fn(usize) -> f32) -> Option<(usize, f32, f32)> {
    got.iter()
        .enumerate()
        .find(|&(i, &g)| g != want(i))
        .map(|(i, &g)| (i, g, want(i)))
}

/// A gradient bucket's average at world size 1 is a kernel over the whole bucket on the
/// communicator's stream. A matmul queued on the compute stream after the all-reduce (the rest
/// of backward) must not wait for it: device timestamps show the matmul finishing long before
/// the first compute that reads the bucket, which does wait for the all-reduce. On one stream
/// the matmul queued behind the all-reduce and that read followed it by one tiny copy.
#[test]
fn a_bucket_all_reduce_runs_beside_the_compute_queued_after_it() {
    let _serial = serial();
    let Some(backends) = backends(
        "nccl_streams",
        "a_bucket_all_reduce_runs_beside_the_compute_queued_after_it",
        1,
    ) else {
        return;
    };
    let b = &backends[0];
    let member = alone(b);
    // 2 GiB of f32: NCCL's one-rank kernel reads and writes it in milliseconds, several times
    // the matmul's time.
    let n = 512 << 20;
    let bucket = alloc(b, n);
    let probe = alloc(b, 1);
    let busy = Busy::new(b, 2048);
    // The second round is measured: the first loads the kernels and NCCL's.
    let mut seen = None;
    for _ in 0..2 {
        fill(&bucket, n, 2.0);
        let start = b.record_event().unwrap();
        let handle = member.all_reduce(&operand(&bucket, n), ReduceKind::Avg).unwrap();
        busy.run(1);
        let compute_done = b.record_event().unwrap();
        // The first compute on the bucket after the all-reduce: it waits for it.
        Kernel::Copy {
            input: f32s(&bucket, &[1]),
            out: f32s(&probe, &[1]),
        }
        .run(&[&bucket, &probe])
        .expect("copy");
        let read = b.record_event().unwrap();
        handle.wait().unwrap();
        b.synchronize().unwrap();
        let computed = b.elapsed(&start, &compute_done).unwrap();
        let reduced = b.elapsed(&start, &read).unwrap();
        seen = Some((computed, reduced));
    }
    let (computed, reduced) = seen.unwrap();
    eprintln!("nccl_streams: matmul queued after the all-reduce done at {computed:?}; bucket read at {reduced:?}");
    assert_eq!(download(&probe, 1), vec![2.0], "the average of one rank is the value");
    assert!(
        reduced > computed && reduced - computed > reduced / 4,
        "the matmul queued after the bucket's all-reduce ended at {computed:?} and the bucket's \
         first read at {reduced:?}: the matmul waited for the all-reduce (one stream for both), or \
         the all-reduce took no device time"
    );
}

/// Compute writes a collective's input just before it (after a long matmul, so a collective
/// that did not wait would read the old values) and reads its output just after it (while the
/// communicator's stream is still busy with a long earlier collective, so a read that did not
/// wait would see the poison). The results are the host's.
#[test]
fn compute_writes_before_and_reads_after_a_collective_in_order() {
    let _serial = serial();
    let Some(backends) = backends(
        "nccl_streams",
        "compute_writes_before_and_reads_after_a_collective_in_order",
        1,
    ) else {
        return;
    };
    let b = &backends[0];
    let member = alone(b);
    let n = 1 << 24; // f32 holds every 0..2^25 integer result exactly
    let input = alloc(b, n);
    let output = alloc(b, n);
    let check = alloc(b, n);
    let big = 256 << 20; // 1 GiB: a device copy of about a millisecond
    let big_in = alloc(b, big);
    let big_out = alloc(b, big);
    let busy = Busy::new(b, 4096);

    // Written right before: a reduce-scatter of one rank is a copy of the input (its sum).
    fill(&input, n, -1.0);
    fill(&output, n, f64::NAN);
    b.synchronize().unwrap();
    busy.run(2);
    arange(&input, n, 0.0);
    let handle = member
        .reduce_scatter(&operand(&input, n), &operand(&output, n), ReduceKind::Sum)
        .unwrap();
    handle.wait().unwrap();
    if let Some((i, got, want)) = first_mismatch(&download(&output, n), |i| i as f32) {
        panic!("reduce_scatter read its input before the compute that wrote it: element {i} is {got}, not {want}");
    }

    // Read right after: the communicator's stream first copies 1 GiB, written by compute just
    // before (so it starts after the matmuls), then the reduce-scatter; the add queued on the
    // compute stream right after must wait for both.
    fill(&output, n, f64::NAN);
    b.synchronize().unwrap();
    busy.run(2);
    arange(&input, n, 0.0);
    fill(&big_in, big, 3.0);
    let gathered = member
        .all_gather(&operand(&big_in, big), &operand(&big_out, big))
        .unwrap();
    let handle = member
        .reduce_scatter(&operand(&input, n), &operand(&output, n), ReduceKind::Sum)
        .unwrap();
    add(&output, &input, &check, n);
    let sums = download(&check, n);
    handle.wait().unwrap();
    gathered.wait().unwrap();
    if let Some((i, got, want)) = first_mismatch(&sums, |i| 2.0 * i as f32) {
        panic!("compute read the reduce-scatter's output before it was written: element {i} is {got}, not {want}");
    }
    let mut ends = download(&big_out, 4);
    let mut tail = vec![0u8; 16];
    big_out.read((big - 4) * 4, &mut tail).unwrap();
    ends.extend(
        tail.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    assert_eq!(
        ends,
        vec![3.0; 8],
        "all_gather read big_in before the fill that wrote it"
    );
}

/// A collective's input is freed into the caching allocator while the collective is still
/// queued behind a long one, and compute at once overwrites the block handed out again: that
/// compute must wait for the collective, which still copies the old values.
#[test]
fn a_block_freed_under_a_pending_collective_is_reused_after_it() {
    let _serial = serial();
    let Some(backends) = backends(
        "nccl_streams",
        "a_block_freed_under_a_pending_collective_is_reused_after_it",
        1,
    ) else {
        return;
    };
    let b = &backends[0];
    let member = alone(b);
    // No free block cached by the tests before: the freed block is the only one that fits.
    b.empty_cache().unwrap();
    let n = (1 << 24) + (3 << 10);
    let out = alloc(b, n);
    let big = 256 << 20;
    let big_in = alloc(b, big);
    let big_out = alloc(b, big);
    fill(&out, n, f64::NAN);
    fill(&big_in, big, 3.0);
    let gathered = member
        .all_gather(&operand(&big_in, big), &operand(&big_out, big))
        .unwrap();
    let src = alloc(b, n);
    arange(&src, n, 0.0);
    let handle = member
        .reduce_scatter(&operand(&src, n), &operand(&out, n), ReduceKind::Sum)
        .unwrap();
    let freed_at = src.slice().addr();
    drop(src);
    let reused = alloc(b, n);
    assert_eq!(
        reused.slice().addr(),
        freed_at,
        "the allocator did not hand the freed block out again; this test needs it to"
    );
    fill(&reused, n, 7.0);
    handle.wait().unwrap();
    gathered.wait().unwrap();
    if let Some((i, got, want)) = first_mismatch(&download(&out, n), |i| i as f32) {
        panic!(
            "compute overwrote a freed block that a pending reduce_scatter still read: element {i} is {got}, not {want}"
        );
    }
    assert_eq!(download(&reused, 4), vec![7.0; 4]);
}

/// Two GPUs, one thread each: every rank writes its buffer with compute right after a long
/// matmul, all-reduces it (sum) and reads the result with compute right after; the reads equal
/// the host's sums.
#[test]
fn two_gpus_sum_what_compute_wrote_and_compute_reads_the_sums() {
    let _serial = serial();
    let Some(backends) = backends(
        "nccl_streams",
        "two_gpus_sum_what_compute_wrote_and_compute_reads_the_sums",
        2,
    ) else {
        return;
    };
    let members = NcclEngine::new().local_group(&backends).unwrap();
    let world = members.len();
    let n = 1 << 22;
    std::thread::scope(|scope| {
        for (member, b) in members.iter().zip(&backends) {
            scope.spawn(move || {
                let rank = member.rank();
                let buf = alloc(b, n);
                let check = alloc(b, n);
                let busy = Busy::new(b, 4096);
                fill(&buf, n, -1.0);
                b.synchronize().unwrap();
                busy.run(2);
                arange(&buf, n, rank as f64);
                let handle = member.all_reduce(&operand(&buf, n), ReduceKind::Sum).unwrap();
                add(&buf, &buf, &check, n);
                let got = download(&check, n);
                handle.wait().unwrap();
                // Rank r wrote r + i: the sum over ranks is world·i + world(world−1)/2.
                let sum = |i: usize| (world * i + world * (world - 1) / 2) as f32;
                if let Some((i, got, want)) = first_mismatch(&got, |i| 2.0 * sum(i)) {
                    panic!("rank {rank}: twice the sum at element {i} is {got}, not {want}");
                }
            });
        }
    });
}
