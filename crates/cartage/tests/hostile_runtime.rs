//! Hostile input to the runtime never aborts, panics or hangs (DESIGN "Trust", invariant 8):
//! nested host reads of huge empty shapes, distributed environments with absurd or non-UTF-8
//! values, rendezvous timeouts that overflow the clock or are flooded with silent connections,
//! prefetch loaders dropped while their producer blocks, and the origin of tensors loaded from
//! safetensors files. Every action that could hang runs on a thread and must finish within a
//! bound. No test changes the environment of this process: the environment cases run this
//! binary again as a child with the variable set at spawn.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cartage::Error;
use cartage::distributed::env::MAX_WORLD_SIZE;
use cartage::distributed::{DistEnv, Rendezvous};
use cartage::loader::{DROP_JOIN_TIMEOUT, HostBatch, PrefetchLoader, PrefetchMode};
use cartage::prelude::*;

/// Run `action` on a thread; its result, or a panic naming `what` if it takes longer than `bound`.
fn bounded<T: Send + 'static>(what: &str, bound: Duration, action: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(action());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish within {bound:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// The CPU and every GPU that opens here (skipped loudly otherwise).
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

// ---- 1. nested host reads ---------------------------------------------------------------------

/// `[2^32, 0]` holds nothing, but its rows would be 2^32 empty vectors (96 GiB of headers): a
/// typed error naming the size, not an abort on the allocation. Small empty shapes still read.
#[test]
fn nested_reads_of_huge_empty_shapes_are_refused() -> Result<()> {
    for device in devices("nested_reads_of_huge_empty_shapes_are_refused") {
        let huge = 1usize << 32;
        let t = Tensor::zeros(&[huge, 0], DType::F32, &device)?;
        let err = t.to_vec2::<f32>().unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{device}: {err}");
        let text = err.to_string();
        assert!(text.contains("4294967296") && text.contains("GiB"), "{device}: {text}");

        for shape in [[huge, 0, 3], [huge, 1, 0], [1, huge, 0]] {
            let t = Tensor::zeros(&shape, DType::I64, &device)?;
            let err = t.to_vec3::<i64>().unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{device} {shape:?}: {err}"
            );
        }
        // The row count does not fit in usize at all.
        let t = Tensor::zeros(&[usize::MAX / 2, 4, 0], DType::U8, &device)?;
        assert!(t.to_vec3::<u8>().is_err(), "{device}");

        // Modest empty shapes still read as empty rows.
        let t = Tensor::zeros(&[3, 0], DType::F32, &device)?;
        assert_eq!(t.to_vec2::<f32>()?, vec![Vec::<f32>::new(); 3]);
        let t = Tensor::zeros(&[2, 2, 0], DType::F32, &device)?;
        assert_eq!(t.to_vec3::<f32>()?, vec![vec![Vec::<f32>::new(); 2]; 2]);
        let t = Tensor::zeros(&[2, 0, 5], DType::F32, &device)?;
        assert_eq!(t.to_vec3::<f32>()?, vec![Vec::<Vec<f32>>::new(); 2]);
        // Display of a huge empty tensor is no allocation either.
        let t = Tensor::zeros(&[huge, 0], DType::F32, &device)?;
        let _ = format!("{t}");
    }
    Ok(())
}

// ---- 2. distributed environment and rendezvous -----------------------------------------------

fn lookup(vars: &[(&str, &str)]) -> Result<DistEnv> {
    let vars: Vec<(String, String)> = vars.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    DistEnv::from_lookup(move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
}

/// Absurd world sizes are typed errors naming the variable and its value, before the rendezvous
/// allocates a slot per rank.
#[test]
fn absurd_world_sizes_are_refused() {
    let huge = (1u64 << 40).to_string();
    let max = u64::MAX.to_string();
    let beyond = "1".repeat(200);
    for world in [huge.as_str(), max.as_str(), beyond.as_str()] {
        let vars = [
            ("RANK", "0"),
            ("WORLD_SIZE", world),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
        ];
        let err = bounded("DistEnv::from_lookup", Duration::from_secs(5), {
            let vars: Vec<(String, String)> = vars.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            move || {
                DistEnv::from_lookup(move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
                    .unwrap_err()
            }
        });
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("WORLD_SIZE=`"), "{err}");
    }
    let limit = MAX_WORLD_SIZE.to_string();
    assert!(
        lookup(&[
            ("RANK", "0"),
            ("WORLD_SIZE", &limit),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1")
        ])
        .is_ok()
    );

    // A `DistEnv` built by hand gets the same check from the rendezvous itself.
    for world_size in [1usize << 40, usize::MAX, 0] {
        let env = DistEnv {
            world_size,
            ..two_ranks_on(free_port(), 1)
        };
        let err = bounded("Rendezvous::exchange", Duration::from_secs(5), move || {
            Rendezvous::new(&env, Duration::from_millis(200))
                .exchange(b"id")
                .unwrap_err()
        });
        assert!(matches!(err, Error::InvalidArgument { .. }), "{world_size}: {err}");
    }
    let env = two_ranks_on(free_port(), 3);
    let err = Rendezvous::new(&env, Duration::from_millis(200))
        .exchange(b"id")
        .unwrap_err();
    assert!(err.to_string().contains("rank 3"), "{err}");
}

/// The variables the environment tests below set, each in a child process of its own.
const LAUNCHER_VARIABLES: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_PORT",
    "MASTER_ADDR",
    "CARTAGE_DEVICE",
];

/// Set in a child process: the variable whose non-UTF-8 value it checks.
const CHILD_CHECKS: &str = "CARTAGE_HOSTILE_CHILD_CHECKS";

/// A launcher variable that is not UTF-8 is an error naming the variable, never "unset" (which
/// made a silent group of one, or the default device). Each case runs this binary again as a
/// child with the value set at spawn: no test here changes the environment of a running
/// process.
#[cfg(unix)]
#[test]
fn non_utf8_launcher_variables_are_refused() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"2\xff");
    for name in LAUNCHER_VARIABLES {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args(["--exact", "non_utf8_child", "--nocapture", "--test-threads=1"]);
        for other in LAUNCHER_VARIABLES {
            child.env_remove(other);
        }
        let out = child.env(name, bad).env(CHILD_CHECKS, name).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: the child failed:\n{text}");
        assert!(
            text.contains(&format!("checked {name}")),
            "{name}: the child checked nothing:\n{text}"
        );
    }
}

/// The child of [`non_utf8_launcher_variables_are_refused`] (does nothing in a normal run).
#[test]
fn non_utf8_child() {
    let Ok(name) = std::env::var(CHILD_CHECKS) else {
        return;
    };
    let err = if name == "CARTAGE_DEVICE" || name == "LOCAL_RANK" {
        let err = Device::pick().expect_err(&name);
        assert!(matches!(err, Error::InvalidDevice { .. }), "{name}: {err}");
        if name == "CARTAGE_DEVICE" {
            err
        } else {
            // LOCAL_RANK is the distributed environment's too.
            DistEnv::from_env().expect_err(&name)
        }
    } else {
        DistEnv::from_env().expect_err(&name)
    };
    let text = err.to_string();
    assert!(
        text.contains(&format!("{name}=`2")) || text.contains(&format!("{name}=2")),
        "{name}: {text}"
    );
    assert!(text.contains("UTF-8"), "{name}: {text}");
    println!("checked {name}");
}

/// Rank `rank` of a group of two meeting on loopback at `port`.
fn two_ranks_on(port: u16, rank: usize) -> DistEnv {
    DistEnv {
        rank,
        world_size: 2,
        local_rank: None,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    }
}

fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A timeout too large for the clock (`Duration::MAX`) is no panic; the rendezvous still
/// completes.
#[test]
fn a_rendezvous_timeout_of_duration_max_does_not_panic() {
    let port = free_port();
    let env = |rank| two_ranks_on(port, rank);
    let (host, peer) = (env(0), env(1));
    let out = bounded("rendezvous with Duration::MAX", Duration::from_secs(20), move || {
        let host = std::thread::spawn(move || Rendezvous::new(&host, Duration::MAX).exchange(b"the id"));
        let peer = Rendezvous::new(&peer, Duration::MAX).exchange(b"");
        (host.join().map_err(|_| "rank 0 panicked"), peer)
    });
    assert_eq!(out.0.unwrap().unwrap(), b"the id");
    assert_eq!(out.1.unwrap(), b"the id");
}

/// Silent connections that keep arriving at rank 0 cannot stretch its deadline: a 1 s timeout
/// fails with `RanksMissing` within the timeout plus a small margin.
#[test]
fn silent_connections_do_not_stretch_the_rendezvous_deadline() {
    let port = free_port();
    let timeout = Duration::from_secs(1);
    let env = two_ranks_on(port, 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                    // One byte of a hello, then silence.
                    let _ = s.write_all(b"C");
                    open.push(s);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let (err, took) = bounded("rendezvous under a flood", timeout * 10, move || {
        let start = Instant::now();
        let out = Rendezvous::new(&env, timeout).exchange(b"id");
        (out.unwrap_err(), start.elapsed())
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = flood.join();
    assert!(matches!(err, Error::RanksMissing { .. }), "{err}");
    assert!(
        // The margin allows a loaded two-core machine; without the fix it took over 6 s.
        took < timeout + Duration::from_secs(2),
        "a 1 s rendezvous took {took:?}"
    );
}

/// Silent connections arriving all along keep no rank out: rank 1 still joins rank 0 well
/// before the timeout.
#[test]
fn silent_connections_keep_no_rank_out() {
    let port = free_port();
    let env = |rank| two_ranks_on(port, rank);
    let (host, peer) = (env(0), env(1));
    let timeout = Duration::from_secs(20);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let host = std::thread::spawn(move || Rendezvous::new(&host, timeout).exchange(b"the id"));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                    open.push(s);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let (out, took) = bounded("rank 1 joining through a flood", Duration::from_secs(15), move || {
        let start = Instant::now();
        (Rendezvous::new(&peer, timeout).exchange(b""), start.elapsed())
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = flood.join();
    assert_eq!(out.unwrap(), b"the id");
    assert_eq!(host.join().unwrap().unwrap(), b"the id");
    assert!(took < Duration::from_secs(3), "rank 1 took {took:?}");
}

/// A rank 0 that dribbles its reply one byte at a time cannot hold a peer past its deadline and
/// grace.
#[test]
fn a_dribbling_rank_zero_cannot_hold_a_peer() {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            // A valid reply head announcing a 128-byte id, whose bytes then come one at a time.
            let mut head = b"CTRV\0".to_vec();
            head.extend_from_slice(&128u32.to_le_bytes());
            let _ = s.write_all(&head);
            for _ in 0..128 {
                if s.write_all(b"C").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    });
    let env = two_ranks_on(port, 1);
    let timeout = Duration::from_millis(500);
    let (err, took) = bounded("peer facing a dribbling rank 0", Duration::from_secs(15), move || {
        let start = Instant::now();
        let out = Rendezvous::new(&env, timeout).exchange(b"");
        (out.unwrap_err(), start.elapsed())
    });
    assert!(
        matches!(err, Error::RanksMissing { .. } | Error::InvalidArgument { .. }),
        "{err}"
    );
    // The deadline, the 2 s grace for rank 0's verdict, and a margin.
    assert!(took < timeout + Duration::from_secs(3), "took {took:?}");
}

// ---- 3. dropping a loader whose producer blocks ----------------------------------------------

/// A pipelined loader whose batch iterator blocks (far longer than any test) is dropped within
/// the join bound: the worker is detached, the caller does not hang.
#[test]
fn dropping_a_loader_with_a_blocked_producer_returns() -> Result<()> {
    for device in devices("dropping_a_loader_with_a_blocked_producer_returns") {
        let blocked = (0..).map(|i| {
            if i >= 1 {
                std::thread::sleep(Duration::from_secs(600));
            }
            HostBatch::new(vec![i as f32; 4], &[4])
        });
        let mut loader = PrefetchLoader::with_mode(blocked, &device, PrefetchMode::Pipelined)?;
        assert!(loader.next().unwrap().is_ok());
        let took = bounded(
            "drop of a blocked loader",
            DROP_JOIN_TIMEOUT + Duration::from_secs(3),
            move || {
                let start = Instant::now();
                drop(loader);
                start.elapsed()
            },
        );
        assert!(
            took >= DROP_JOIN_TIMEOUT.saturating_sub(Duration::from_millis(100)),
            "{took:?}"
        );

        // The same with a `fill` function that blocks.
        let loader =
            PrefetchLoader::from_fn_with_mode(&[2], DType::F32, 10, &device, PrefetchMode::Pipelined, |_, _| {
                std::thread::sleep(Duration::from_secs(600));
                Ok(())
            })?;
        bounded(
            "drop of a blocked from_fn loader",
            DROP_JOIN_TIMEOUT + Duration::from_secs(3),
            move || drop(loader),
        );
    }
    Ok(())
}

// ---- 4. the origin of loaded tensors ----------------------------------------------------------

/// Tensors loaded from a safetensors file name the caller's line as their origin, through
/// `load_safetensors`, `SafetensorsFile::load` and `SafetensorsFile::load_only`.
#[test]
fn loaded_tensors_originate_at_the_callers_line() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let path = dir.path().join("w.safetensors");
    let w = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &Device::cpu())?;
    cartage::save_safetensors(&path, &[("w", &w)])?;
    let here = file!();
    for device in devices("loaded_tensors_originate_at_the_callers_line") {
        let (all, line) = (cartage::load_safetensors(&path, &device)?, line!());
        let file = cartage::safetensors_io::SafetensorsFile::open(&path)?;
        let (loaded, load_line) = (file.load(&device)?, line!());
        let (only, only_line) = (file.load_only(&["w"], &device)?, line!());
        for (map, line) in [(all, line), (loaded, load_line), (only, only_line)] {
            let origin = map["w"].origin();
            assert_eq!((origin.file(), origin.line()), (here, line), "{device}: {origin}");
        }
    }
    Ok(())
}

// ---- 5. other hostile arguments ---------------------------------------------------------------

/// An in-process group of 2^40 ranks is a typed error, not an abort allocating a slot per rank.
#[test]
fn a_huge_in_process_group_is_refused() {
    for world_size in [MAX_WORLD_SIZE + 1, 1 << 40, usize::MAX] {
        let err = bounded("InProcessCollective::group", Duration::from_secs(5), move || {
            cartage::distributed::InProcessCollective::group(&Device::cpu(), world_size, Duration::from_secs(1))
                .unwrap_err()
        });
        assert!(matches!(err, Error::InvalidArgument { .. }), "{world_size}: {err}");
        assert!(err.to_string().contains(&world_size.to_string()), "{err}");
    }
}

/// `randint` refuses a range its dtype cannot hold (as PyTorch does) instead of wrapping the
/// drawn values: `[-5, 300)` as u8, `[0, 2^40)` as i32, `[0, 2^30)` as f16.
#[test]
fn randint_refuses_a_range_the_dtype_cannot_hold() -> Result<()> {
    for device in devices("randint_refuses_a_range_the_dtype_cannot_hold") {
        for (low, high, dtype) in [
            (-5, 300, DType::U8),
            (0, 257, DType::U8),
            (0, 1 << 40, DType::I32),
            (i64::from(i32::MIN) - 1, 0, DType::I32),
            (0, 1 << 30, DType::F16),
        ] {
            let err = Tensor::randint(low, high, &[64], dtype, 7, &device).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{device} {dtype} [{low}, {high}): {err}"
            );
            assert!(err.to_string().contains(&format!("does not fit {dtype}")), "{err}");
        }
        // The edges of a dtype still draw.
        let x = Tensor::randint(0, 256, &[256], DType::U8, 7, &device)?;
        assert_eq!(x.dtype(), DType::U8);
        let x = Tensor::randint(-128, 128, &[64], DType::I32, 7, &device)?;
        assert!(x.to_vec::<i32>()?.iter().all(|v| (-128..128).contains(v)));
    }
    Ok(())
}

/// A benchmark asked for `usize::MAX` samples whose work fails ends with the work's error, not a
/// capacity-overflow panic reserving room for every sample first.
#[test]
fn a_bench_with_absurd_sample_counts_does_not_panic() -> Result<()> {
    let backend = cartage::backend(&Device::cpu())?;
    let mut calls = 0;
    let out = cartage::bench::Bench::new()
        .warmup(Duration::ZERO)
        .samples(usize::MAX, usize::MAX)
        .run(backend.as_ref(), || {
            calls += 1;
            if calls > 3 {
                Err(Error::invalid("work", "stop here"))
            } else {
                Ok(())
            }
        });
    assert!(out.unwrap_err().to_string().contains("stop here"));
    Ok(())
}
