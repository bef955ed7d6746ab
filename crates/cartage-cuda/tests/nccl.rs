//! NCCL collectives (feature `nccl`) against results computed on the host: world size 1 through
//! the engine on one GPU; every collective, dtype and reduction on two GPUs driven by one process
//! (one thread each); one process per GPU joined by id; a rank that never calls, failing the
//! other with a typed error after the timeout.
//!
//! Without a CUDA device or without NCCL each test prints a SKIP line, and fails instead under
//! `CARTAGE_REQUIRE=cuda`. The two-GPU tests skip loudly on a machine with one GPU (also under
//! `CARTAGE_REQUIRE=cuda`, so that the single-GPU run stays green).
#![cfg(feature = "nccl")]

mod nccl_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cartage_core::{
    Backend, Collective, CollectiveArg, CollectiveEngine, DType, DeviceBuffer, Element, Error, Layout, ReduceKind,
    Scalar,
};
use cartage_cuda::nccl::NcclEngine;
use half::{bf16, f16};
use nccl_support::{backends, required, serial};

const CHILD_VAR: &str = "CARTAGE_NCCL_TEST_CHILD";

const ID_VAR: &str = "CARTAGE_NCCL_TEST_ID";

/// Rank `rank`'s `n` values for `dtype`: small integers, exact in every dtype.
fn values(dtype: DType, rank: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| match dtype {
            DType::Bool => (rank + i).is_multiple_of(3) as u8 as f64,
            DType::U8 => ((rank * 7 + i * 3) % 11) as f64,
            _ => ((rank * 7 + i * 3) % 11) as f64 - 4.0,
        })
        .collect()
}

fn reference(dtype: DType, op: ReduceKind, world: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let column: Vec<f64> = (0..world).map(|r| values(dtype, r, n)[i]).collect();
            dtype.round_trip(match op {
                ReduceKind::Sum => column.iter().sum(),
                ReduceKind::Avg => column.iter().sum::<f64>() / world as f64,
                ReduceKind::Max => column.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            })
        })
        .collect()
}

fn upload(backend: &Arc<dyn Backend>, dtype: DType, values: &[f64]) -> DeviceBuffer {
    let bytes: Vec<u8> = values.iter().flat_map(|&v| Scalar::Float(v).to_bytes(dtype)).collect();
    let buffer = DeviceBuffer::new(backend, bytes.len().max(1)).expect("alloc");
    buffer.write(0, &bytes).expect("upload");
    buffer
}

fn zeros(backend: &Arc<dyn Backend>, dtype: DType, n: usize) -> DeviceBuffer {
    upload(backend, dtype, &vec![0.0; n])
}

fn arg(buffer: &DeviceBuffer, dtype: DType, n: usize) -> CollectiveArg<'_> {
    CollectiveArg::new(buffer, buffer.arg(Layout::contiguous(&[n]).unwrap(), dtype)).expect("operand")
}

fn download(buffer: &DeviceBuffer, dtype: DType, n: usize) -> Vec<f64> {
    let mut bytes = vec![0u8; n * dtype.size_in_bytes()];
    buffer.read(0, &mut bytes).expect("download");
    fn widen<T: Element>(bytes: &[u8]) -> Vec<f64> {
        T::from_le_bytes_slice(bytes).into_iter().map(Element::to_f64).collect()
    }
    match dtype {
        DType::F32 => widen::<f32>(&bytes),
        DType::F64 => widen::<f64>(&bytes),
        DType::F16 => widen::<f16>(&bytes),
        DType::BF16 => widen::<bf16>(&bytes),
        DType::I32 => widen::<i32>(&bytes),
        DType::I64 => widen::<i64>(&bytes),
        DType::U8 => widen::<u8>(&bytes),
        DType::Bool => widen::<bool>(&bytes),
    }
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-2 * w.abs().max(1.0),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

/// Every collective, dtype and reduction on rank `member.rank()`, checked against the host.
fn exercise(member: &dyn Collective, backend: &Arc<dyn Backend>) {
    let (rank, world, n) = (member.rank(), member.world_size(), 6);
    for dtype in DType::ALL {
        for op in ReduceKind::ALL {
            let buf = upload(backend, dtype, &values(dtype, rank, n));
            let result = member.all_reduce(&arg(&buf, dtype, n), op);
            if !op.accepts(dtype) {
                assert!(matches!(result, Err(Error::WrongDType { .. })), "{op} {dtype}");
                continue;
            }
            result.unwrap().wait().unwrap();
            close(
                &download(&buf, dtype, n),
                &reference(dtype, op, world, n),
                &format!("all_reduce {op} {dtype}"),
            );
        }
        let buf = upload(backend, dtype, &values(dtype, rank, n));
        member
            .broadcast(&arg(&buf, dtype, n), world - 1)
            .unwrap()
            .wait()
            .unwrap();
        close(
            &download(&buf, dtype, n),
            &values(dtype, world - 1, n),
            &format!("broadcast {dtype}"),
        );

        let mine = upload(backend, dtype, &values(dtype, rank, n));
        let all = zeros(backend, dtype, world * n);
        member
            .all_gather(&arg(&mine, dtype, n), &arg(&all, dtype, world * n))
            .unwrap()
            .wait()
            .unwrap();
        let gathered: Vec<f64> = (0..world).flat_map(|r| values(dtype, r, n)).collect();
        close(
            &download(&all, dtype, world * n),
            &gathered,
            &format!("all_gather {dtype}"),
        );

        for op in ReduceKind::ALL.into_iter().filter(|op| op.accepts(dtype)) {
            let input = upload(backend, dtype, &values(dtype, rank, world * n));
            let out = zeros(backend, dtype, n);
            member
                .reduce_scatter(&arg(&input, dtype, world * n), &arg(&out, dtype, n), op)
                .unwrap()
                .wait()
                .unwrap();
            let full = reference(dtype, op, world, world * n);
            close(
                &download(&out, dtype, n),
                &full[rank * n..(rank + 1) * n],
                &format!("reduce_scatter {op} {dtype}"),
            );
        }
    }
    if world > 1 {
        // A ring: even ranks send first, odd ranks receive first (NCCL send/recv block until
        // matched on the device, and each rank's stream runs its calls in order).
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        let out = upload(backend, DType::I64, &[rank as f64; 3]);
        let into = zeros(backend, DType::I64, 3);
        let (send, recv) = (arg(&out, DType::I64, 3), arg(&into, DType::I64, 3));
        if rank % 2 == 0 {
            member.send(&send, next).unwrap().wait().unwrap();
            member.recv(&recv, prev).unwrap().wait().unwrap();
        } else {
            member.recv(&recv, prev).unwrap().wait().unwrap();
            member.send(&send, next).unwrap().wait().unwrap();
        }
        assert_eq!(download(&into, DType::I64, 3), vec![prev as f64; 3], "send/recv");
    }
    member.barrier().unwrap().wait().unwrap();
}

#[test]
fn nccl_loads_or_says_why() {
    match cartage_cuda::nccl::version() {
        Ok(version) => eprintln!("nccl: NCCL {version}"),
        Err(reason) => {
            assert!(reason.contains("libnccl.so.2"), "{reason}");
            assert!(
                !required() || cartage_cuda::device_count().unwrap_or(0) == 0,
                "{reason}"
            );
        }
    }
}

/// World size 1 on cuda:0 through the engine's id and join (the path of one process per GPU).
#[test]
fn world_size_one_runs_every_collective() {
    let _serial = serial();
    let Some(backends) = backends("nccl", "world_size_one_runs_every_collective", 1) else {
        return;
    };
    let engine = NcclEngine::new();
    let id = engine.unique_id(&backends[0]).unwrap();
    assert_eq!(id.len(), cartage_cuda::nccl::ID_BYTES);
    let member = engine.join(&backends[0], &id, 0, 1).unwrap();
    assert_eq!((member.rank(), member.world_size(), member.engine()), (0, 1, "nccl"));
    exercise(member.as_ref(), &backends[0]);
}

/// Two GPUs, one process, one thread per GPU.
#[test]
fn two_gpus_in_one_process_run_every_collective() {
    let _serial = serial();
    let Some(backends) = backends("nccl", "two_gpus_in_one_process_run_every_collective", 2) else {
        return;
    };
    let members = NcclEngine::new().local_group(&backends).unwrap();
    std::thread::scope(|scope| {
        for (member, backend) in members.iter().zip(&backends) {
            scope.spawn(move || exercise(member.as_ref(), backend));
        }
    });
}

/// A rank that never calls: the other's wait gives up after the timeout with a typed error.
/// Run in a child process, so that an aborted collective cannot disturb the other tests' GPUs.
#[test]
fn a_rank_that_never_calls_fails_the_other_after_the_timeout() {
    let _serial = serial();
    if backends("nccl", "a_rank_that_never_calls_fails_the_other_after_the_timeout", 2).is_none() {
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rank_that_waits_for_a_silent_peer",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_VAR, "timeout")
        .status()
        .expect("start the child");
    assert!(status.success(), "the child failed (see its output above)");
}

/// The body of `a_rank_that_never_calls_fails_the_other_after_the_timeout`, in a child process.
#[test]
#[ignore = "run as a child process by a_rank_that_never_calls_fails_the_other_after_the_timeout"]
fn rank_that_waits_for_a_silent_peer() {
    assert_eq!(
        std::env::var(CHILD_VAR).as_deref(),
        Ok("timeout"),
        "only meaningful as a child"
    );
    let backends = backends("nccl", "rank_that_waits_for_a_silent_peer", 2).expect("two GPUs");
    let timeout = Duration::from_secs(3);
    let members = NcclEngine::new().with_timeout(timeout).local_group(&backends).unwrap();
    let buf = upload(&backends[0], DType::F32, &[1.0; 4]);
    let started = Instant::now();
    let err = members[0]
        .all_reduce(&arg(&buf, DType::F32, 4), ReduceKind::Sum)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, Error::RanksMissing { .. } | Error::Driver { .. }),
        "{err}"
    );
    assert!(
        started.elapsed() < timeout + Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The communicator was aborted: later calls say so instead of hanging.
    let again = members[0].all_reduce(&arg(&buf, DType::F32, 4), ReduceKind::Sum);
    assert!(matches!(again, Err(Error::BackendUnavailable { .. })), "{again:?}");
    eprintln!("nccl: rank 0 gave up after {:?}: {err}", started.elapsed());
    // The silent peer's communicator is left to the process's exit: destroying it would wait
    // for a partner that aborted.
    std::mem::forget(members);
}

/// One process per GPU: this test makes the id and runs two copies of this binary, ranks 0 and
/// 1 on cuda:0 and cuda:1, which join with it.
#[test]
fn two_processes_join_with_one_id() {
    let _serial = serial();
    let Some(backends) = backends("nccl", "two_processes_join_with_one_id", 2) else {
        return;
    };
    let id = NcclEngine::new().unique_id(&backends[0]).unwrap();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "rank_of_two_processes", "--ignored", "--nocapture"])
                .env(CHILD_VAR, rank.to_string())
                .env(ID_VAR, &hex)
                .spawn()
                .expect("start a rank")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a rank failed (see its output above)");
    }
}

/// One rank of `two_processes_join_with_one_id`, run as a child process.
#[test]
#[ignore = "run as a child process by two_processes_join_with_one_id"]
fn rank_of_two_processes() {
    let rank: usize = std::env::var(CHILD_VAR)
        .expect("only meaningful as a child")
        .parse()
        .unwrap();
    let hex = std::env::var(ID_VAR).unwrap();
    let id: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let backend = cartage_cuda::open(rank).unwrap();
    let member = NcclEngine::new().join(&backend, &id, rank, 2).unwrap();
    exercise(member.as_ref(), &backend);
}
