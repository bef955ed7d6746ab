//! Collectives through `ProcessGroup` on the in-process test engine (ranks as threads on the
//! CPU): every collective, dtype and reduction against results computed on the host, and every
//! kind of bad call — shapes, dtypes, devices, strided and autograd tensors, ranks that disagree,
//! ranks that leave or never arrive — as a typed error, never a hang.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cartage::distributed::{InProcessCollective, ProcessGroup, ReduceKind};
use cartage::{DType, Device, Error, ErrorKind, Result, Tensor, Var};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Run `f` on every rank of a fresh in-process group of `world` ranks on the CPU, one thread
/// each; the results in rank order.
fn on_ranks<T: Send>(world: usize, timeout: Duration, f: impl Fn(ProcessGroup) -> Result<T> + Sync) -> Vec<Result<T>> {
    let members = InProcessCollective::group(&Device::cpu(), world, timeout).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                let f = &f;
                scope.spawn(move || f(ProcessGroup::new(Arc::new(member))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `rank`'s `n` values for `dtype`: small integers, exact in every dtype, distinct per rank.
fn values(dtype: DType, rank: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| match dtype {
            DType::Bool => (rank + i).is_multiple_of(3) as u8 as f64,
            DType::U8 => ((rank * 7 + i * 3) % 11) as f64,
            _ => ((rank * 7 + i * 3) % 11) as f64 - 4.0,
        })
        .collect()
}

fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_slice(values, shape, &Device::cpu())?.to_dtype(dtype)
}

/// The host reference of a reduction over the ranks' values, rounded to `dtype`.
fn reference(dtype: DType, op: ReduceKind, world: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let column: Vec<f64> = (0..world).map(|r| values(dtype, r, n)[i]).collect();
            let v = match op {
                ReduceKind::Sum => column.iter().sum(),
                ReduceKind::Avg => column.iter().sum::<f64>() / world as f64,
                ReduceKind::Max => column.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            };
            dtype.round_trip(v)
        })
        .collect()
}

#[test]
fn all_reduce_matches_the_host_for_every_dtype_and_reduction() {
    let (world, n) = (3, 7);
    let results = on_ranks(world, TIMEOUT, |group| {
        let mut checked = 0;
        for dtype in DType::ALL {
            for op in ReduceKind::ALL {
                let x = tensor(&values(dtype, group.rank(), n), &[n], dtype)?;
                let outcome = group.all_reduce(&x, op);
                if !op.accepts(dtype) {
                    let err = outcome.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::WrongDType, "{op} {dtype}: {err}");
                    continue;
                }
                outcome?.wait()?;
                assert_eq!(x.to_vec_f64()?, reference(dtype, op, world, n), "{op} {dtype}");
                checked += 1;
            }
        }
        Ok(checked)
    });
    for checked in results {
        assert_eq!(checked.unwrap(), 4 * 3 + 3 * 2 + 1); // floats: 3 ops; ints: sum, max; bool: max
    }
}

#[test]
fn broadcast_copies_the_roots_values_for_every_dtype() {
    let (world, n) = (4, 5);
    let results = on_ranks(world, TIMEOUT, |group| {
        for dtype in DType::ALL {
            for root in [0, world - 1] {
                let x = tensor(&values(dtype, group.rank(), n), &[n], dtype)?;
                group.broadcast(&x, root)?.wait()?;
                assert_eq!(x.to_vec_f64()?, values(dtype, root, n), "{dtype} from {root}");
            }
        }
        Ok(())
    });
    results.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn all_gather_concatenates_or_stacks_in_rank_order() {
    let world = 3;
    let results = on_ranks(world, TIMEOUT, |group| {
        for dtype in DType::ALL {
            let mine = tensor(&values(dtype, group.rank(), 4), &[2, 2], dtype)?;
            let expected: Vec<f64> = (0..world).flat_map(|r| values(dtype, r, 4)).collect();
            for shape in [[world * 2, 2].to_vec(), [world, 2, 2].to_vec()] {
                let out = Tensor::zeros(&shape, dtype, &Device::cpu())?;
                group.all_gather(&mine, &out)?.wait()?;
                assert_eq!(out.to_vec_f64()?, expected, "{dtype} into {shape:?}");
            }
        }
        Ok(())
    });
    results.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn reduce_scatter_leaves_each_rank_its_chunk_of_the_reduction() {
    let (world, chunk) = (2, 3);
    let results = on_ranks(world, TIMEOUT, |group| {
        for dtype in DType::ALL {
            for op in ReduceKind::ALL.into_iter().filter(|op| op.accepts(dtype)) {
                let input = tensor(&values(dtype, group.rank(), world * chunk), &[world * chunk], dtype)?;
                let out = Tensor::zeros(&[chunk], dtype, &Device::cpu())?;
                group.reduce_scatter(&input, &out, op)?.wait()?;
                let full = reference(dtype, op, world, world * chunk);
                let r = group.rank();
                assert_eq!(out.to_vec_f64()?, full[r * chunk..(r + 1) * chunk], "{op} {dtype}");
            }
        }
        Ok(())
    });
    results.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn send_and_recv_pass_messages_around_a_ring_in_order() {
    let world = 4;
    let results = on_ranks(world, TIMEOUT, |group| {
        let (rank, next, prev) = (
            group.rank(),
            (group.rank() + 1) % world,
            (group.rank() + world - 1) % world,
        );
        for round in 0..3 {
            let out = Tensor::full(&[2], (rank * 10 + round) as f64, DType::I64, &Device::cpu())?;
            group.send(&out, next)?.wait()?;
        }
        for round in 0..3 {
            let into = Tensor::zeros(&[2], DType::I64, &Device::cpu())?;
            group.recv(&into, prev)?.wait()?;
            assert_eq!(into.to_vec::<i64>()?, vec![(prev * 10 + round) as i64; 2]);
        }
        group.barrier()?.wait()
    });
    results.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn empty_tensors_and_groups_of_one_work() {
    let results = on_ranks(1, TIMEOUT, |group| {
        let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &Device::cpu())?;
        group.all_reduce(&x, ReduceKind::Avg)?.wait()?;
        assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0]);
        let empty = Tensor::zeros(&[0, 3], DType::F32, &Device::cpu())?;
        group.all_reduce(&empty, ReduceKind::Sum)?.wait()?;
        let gathered = Tensor::zeros(&[1, 2], DType::F32, &Device::cpu())?;
        group.all_gather(&x, &gathered)?.wait()?;
        assert_eq!(gathered.to_vec::<f32>()?, vec![1.0, 2.0]);
        group.barrier()?.wait()
    });
    results.into_iter().for_each(|r| r.unwrap());
}

/// Each bad call fails on the rank that makes it, before any rank communicates, so the group
/// stays usable: a final all-reduce still agrees.
#[test]
fn bad_calls_are_typed_errors_and_leave_the_group_usable() {
    let results = on_ranks(2, TIMEOUT, |group| {
        let cpu = Device::cpu();
        let x = Tensor::zeros(&[4], DType::F32, &cpu)?;
        let kind = |r: Result<cartage::distributed::CollectiveHandle>| r.unwrap_err().kind();

        // Shapes: the gathered output must hold world × input.
        let small = Tensor::zeros(&[6], DType::F32, &cpu)?;
        let err = group.all_gather(&x, &small).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
        assert!(
            err.to_string().contains("[4]") && err.to_string().contains("[6]"),
            "{err}"
        );
        assert_eq!(
            kind(group.reduce_scatter(&x, &small, ReduceKind::Sum)),
            ErrorKind::ShapeMismatch
        );
        // Dtypes: never converted.
        let ints = Tensor::zeros(&[8], DType::I32, &cpu)?;
        let err = group.all_gather(&x, &ints).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DTypeMismatch, "{err}");
        assert!(err.to_string().contains("distributed.rs"), "names the origins: {err}");
        assert_eq!(kind(group.all_reduce(&ints, ReduceKind::Avg)), ErrorKind::WrongDType);
        let flags = Tensor::zeros(&[2], DType::Bool, &cpu)?;
        assert_eq!(kind(group.all_reduce(&flags, ReduceKind::Sum)), ErrorKind::WrongDType);
        // Ranks: a root or peer outside the group, or oneself.
        assert_eq!(kind(group.broadcast(&x, 2)), ErrorKind::InvalidArgument);
        assert_eq!(kind(group.send(&x, 5)), ErrorKind::InvalidArgument);
        assert_eq!(kind(group.recv(&x, group.rank())), ErrorKind::InvalidArgument);
        // Layout: a strided view cannot be written in place.
        let m = Tensor::zeros(&[2, 3], DType::F32, &cpu)?;
        let err = group.all_reduce(&m.t()?, ReduceKind::Sum).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("contiguous"), "{err}");
        // Autograd: a recorded tensor is not written behind the graph's back.
        let w = Var::new(Tensor::ones(&[4], DType::F32, &cpu)?)?;
        assert_eq!(
            kind(group.all_reduce(&w.tensor(), ReduceKind::Sum)),
            ErrorKind::Autograd
        );
        // Overlap: the output may not share memory with the input.
        let both = Tensor::zeros(&[8], DType::F32, &cpu)?;
        let err = group.all_gather(&both.narrow(0, 0, 4)?, &both).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

        // Still usable.
        let x = Tensor::full(&[3], group.rank() as f64, DType::F32, &cpu)?;
        group.all_reduce(&x, ReduceKind::Sum)?.wait()?;
        assert_eq!(x.to_vec::<f32>()?, vec![1.0; 3]);
        Ok(())
    });
    results.into_iter().for_each(|r| r.unwrap());
}

/// A group communicating on one device refuses a tensor on another, naming both devices, the
/// tensor's origin and the line that made the group.
#[test]
fn a_tensor_on_another_device_is_refused_naming_both() {
    let member = InProcessCollective::group(&Device::cuda(0), 1, TIMEOUT)
        .unwrap()
        .remove(0);
    let group = ProcessGroup::new(Arc::new(member));
    let group_line = line!() - 1;
    let x = Tensor::zeros(&[2], DType::F32, &Device::cpu()).unwrap();
    let err = group.all_reduce(&x, ReduceKind::Sum).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("cpu") && message.contains("cuda:0"), "{message}");
    assert!(message.contains(&format!("distributed.rs:{group_line}")), "{message}");
}

/// The received tensor must match what was sent; the receiver says so.
#[test]
fn a_receive_of_another_shape_is_refused() {
    let results = on_ranks(2, TIMEOUT, |group| {
        if group.rank() == 0 {
            group.send(&Tensor::zeros(&[3], DType::F32, &Device::cpu())?, 1)?.wait()
        } else {
            group.recv(&Tensor::zeros(&[4], DType::F32, &Device::cpu())?, 0)?.wait()
        }
    });
    assert!(results[0].is_ok());
    let err = results[1].as_ref().unwrap_err();
    assert!(err.to_string().contains("rank 0 sent 12 bytes of f32"), "{err}");
}

/// Ranks that call different collectives both fail, saying what each called.
#[test]
fn ranks_that_disagree_fail_instead_of_hanging() {
    let results = on_ranks(2, TIMEOUT, |group| {
        let x = Tensor::zeros(&[4], DType::F32, &Device::cpu())?;
        if group.rank() == 0 {
            group.all_reduce(&x, ReduceKind::Sum)?.wait()
        } else {
            group.broadcast(&x, 0)?.wait()
        }
    });
    for result in results {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(
            err.to_string().contains("all_reduce") && err.to_string().contains("broadcast"),
            "{err}"
        );
    }
}

/// A rank that leaves the group (its thread failed and dropped its member) makes the others
/// fail at once, naming it; a rank that never arrives is named after the timeout.
#[test]
fn a_rank_that_leaves_or_never_arrives_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(400);
    let results = on_ranks(3, Duration::from_secs(30), |group| {
        if group.rank() == 2 {
            return Ok(Duration::ZERO); // leaves without taking part
        }
        let start = Instant::now();
        let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
        let err = group.all_reduce(&x, ReduceKind::Sum).unwrap_err();
        match &err {
            Error::RanksMissing { missing, .. } => assert_eq!(missing, &vec![2], "{err}"),
            other => panic!("expected RanksMissing, got {other}"),
        }
        Ok(start.elapsed())
    });
    for took in results.into_iter().take(2) {
        assert!(took.unwrap() < Duration::from_secs(10), "waited for the whole timeout");
    }

    let results = on_ranks(2, timeout, |group| {
        if group.rank() == 1 {
            std::thread::sleep(timeout * 3); // alive, but never calls
            return Ok(None);
        }
        let start = Instant::now();
        let err = group.barrier().unwrap_err();
        Ok(Some((err, start.elapsed())))
    });
    let (err, took) = results.into_iter().next().unwrap().unwrap().unwrap();
    assert!(
        matches!(&err, Error::RanksMissing { missing, .. } if missing == &vec![1]),
        "{err}"
    );
    assert!(err.to_string().contains("rank 1 did not take part"), "{err}");
    assert!(took >= timeout && took < timeout * 3, "{took:?}");
}

/// Two processes (this test binary, started with torchrun's variables) meet at the rendezvous
/// and both receive rank 0's id.
#[test]
fn ranks_started_as_processes_meet_at_the_rendezvous() {
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "rank_of_a_launched_group", "--ignored", "--nocapture"])
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output().expect("wait for a rank");
        let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "rank {rank} failed:\n{text}");
        assert!(text.contains(&format!("rank {rank} of 2 received the id")), "{text}");
    }
}

/// One rank of a group started by a launcher (`ranks_started_as_processes_meet_at_the_rendezvous`
/// or `cargo xtask launch --nproc N -- <this test binary> --exact rank_of_a_launched_group
/// --ignored --nocapture`).
#[test]
#[ignore = "run as a launched rank"]
fn rank_of_a_launched_group() {
    let env = cartage::DistEnv::from_env().unwrap();
    assert!(
        env.world_size > 1,
        "only meaningful with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set"
    );
    let id = b"an opaque id from rank 0";
    let mine: &[u8] = if env.is_main() { id } else { b"ignored" };
    let got = cartage::distributed::Rendezvous::new(&env, Duration::from_secs(60))
        .exchange(mine)
        .unwrap();
    assert_eq!(got, id);
    println!("rank {} of {} received the id", env.rank, env.world_size);
}

/// An engine for `ProcessGroup::init` in one process: rank 0's id names a fresh in-process
/// group, and each rank joining with that id takes its member. `refuse` makes `check` fail on
/// that rank.
struct ThreadEngine {
    world_size: usize,
    refuse: Option<usize>,
    groups: std::sync::Mutex<std::collections::HashMap<Vec<u8>, Vec<Option<InProcessCollective>>>>,
}

thread_local!(static RANK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) });

impl cartage::distributed::CollectiveEngine for ThreadEngine {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn check(&self, _backend: &Arc<dyn cartage::Backend>) -> Result<()> {
        if self.refuse == Some(RANK.get()) {
            return Err(Error::invalid("check", "this rank cannot join"));
        }
        Ok(())
    }

    fn unique_id(&self, _backend: &Arc<dyn cartage::Backend>) -> Result<Vec<u8>> {
        let mut groups = self.groups.lock().unwrap();
        let id = groups.len().to_le_bytes().to_vec();
        let members = InProcessCollective::group(&Device::cpu(), self.world_size, TIMEOUT)?;
        groups.insert(id.clone(), members.into_iter().map(Some).collect());
        Ok(id)
    }

    fn join(
        &self,
        _backend: &Arc<dyn cartage::Backend>,
        id: &[u8],
        rank: usize,
        _world_size: usize,
    ) -> Result<Arc<dyn cartage::distributed::Collective>> {
        let member = self.groups.lock().unwrap().get_mut(id).and_then(|m| m[rank].take());
        Ok(Arc::new(member.expect("a member for this id and rank")))
    }
}

/// `ProcessGroup::init` on every rank: check, id from rank 0 through a real TCP rendezvous, join.
/// A rank that cannot join fails at once; the others name it after the rendezvous timeout.
#[test]
fn init_hands_rank_zeros_id_to_every_rank_through_the_rendezvous() {
    for refuse in [None, Some(1)] {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let engine = ThreadEngine {
            world_size: 2,
            refuse,
            groups: Default::default(),
        };
        let timeout = Duration::from_millis(800);
        let results: Vec<Result<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let engine = &engine;
                    scope.spawn(move || {
                        RANK.set(rank);
                        let env = cartage::DistEnv {
                            rank,
                            world_size: 2,
                            local_rank: Some(rank),
                            master_addr: "127.0.0.1".into(),
                            master_port: port,
                        };
                        let group = ProcessGroup::init(&env, &Device::cpu(), engine, timeout)?;
                        assert_eq!(
                            (group.rank(), group.world_size(), group.engine()),
                            (rank, 2, "in-process (tests only)")
                        );
                        let x = Tensor::full(&[1], rank as f64 + 1.0, DType::F32, &Device::cpu())?;
                        group.all_reduce(&x, ReduceKind::Sum)?.wait()?;
                        x.item::<f32>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        match refuse {
            None => assert!(results.iter().all(|r| r.as_ref().ok() == Some(&3.0)), "{results:?}"),
            Some(_) => {
                assert!(results[1].as_ref().unwrap_err().to_string().contains("cannot join"));
                let err = results[0].as_ref().unwrap_err();
                assert!(
                    matches!(err, Error::RanksMissing { missing, .. } if missing == &vec![1]),
                    "{err}"
                );
            }
        }
    }
}

#[test]
fn the_cpu_has_no_cross_process_engine_and_says_what_to_use() {
    let env = cartage::distributed::DistEnv::from_lookup(|name| match name {
        "RANK" => Some("0".into()),
        "WORLD_SIZE" => Some("1".into()),
        _ => None,
    })
    .unwrap();
    let Err(err) = ProcessGroup::init_on_device(&env, &Device::cpu(), Duration::from_secs(1)) else {
        panic!("the CPU has no cross-process engine, but a group was made");
    };
    assert_eq!(err.kind(), ErrorKind::BackendUnavailable, "{err}");
    assert!(
        err.to_string().contains("nccl") && err.to_string().contains("in-process"),
        "{err}"
    );
}
