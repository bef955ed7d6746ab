//! CUDA-specific behaviour beyond the conformance suite: out-of-memory and recovery, the on-disk
//! kernel cache seen from a second process, pinned asynchronous copies ordered against compute,
//! device-side index checks, the matmul precision switch, device timing, and two devices.
//!
//! Without a CUDA device each test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{
    Backend, BinaryOp, DType, Error, Kernel, Layout, MatmulPrecision, Scalar, TensorArg, pinned_bytes_in_use,
};
use cartage_cuda::CudaBackend;

const CHILD_VAR: &str = "CARTAGE_CUDA_TEST_CHILD";

/// The backend for `cuda:ordinal`, or `None` after a loud skip (a panic under CARTAGE_REQUIRE).
/// Tests of this binary share one device and compare its memory counters: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn backend(test: &str, ordinal: usize) -> Option<Arc<CudaBackend>> {
    match cartage_cuda::open_cuda(ordinal) {
        Ok(b) => Some(b),
        Err(e) => {
            let required = std::env::var("CARTAGE_REQUIRE")
                .map(|v| v.split(',').any(|k| k.trim() == "cuda"))
                .unwrap_or(false);
            assert!(
                !required,
                "CARTAGE_REQUIRE names cuda but {test} cannot open cuda:{ordinal}: {e}"
            );
            eprintln!("SKIP cuda/{test}: cuda:{ordinal}: {e}");
            None
        }
    }
}

fn arg(buffer: cartage_core::BufferSlice, shape: &[usize], dtype: DType) -> TensorArg {
    TensorArg {
        buffer,
        layout: Layout::contiguous(shape).expect("layout"),
        dtype,
    }
}

fn upload_f32(b: &CudaBackend, values: &[f32]) -> cartage_core::Allocation {
    let a = b
        .alloc(values.len() * 4, std::panic::Location::caller())
        .expect("alloc");
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    b.write(a.slice(), &bytes).expect("write");
    a
}

fn download_f32(b: &CudaBackend, slice: cartage_core::BufferSlice, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    b.read(slice.slice(0, n * 4).expect("slice"), &mut bytes).expect("read");
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn device_count_never_panics() {
    let _serial = serial();
    let count = cartage_cuda::device_count().expect("device_count is Ok even without a driver");
    eprintln!("cuda devices: {count}");
    if count == 0 {
        let err = cartage_cuda::open(0).err().expect("no device: open fails");
        assert_eq!(err.kind_name(), "backend-unavailable", "{err}");
    }
}

#[test]
fn out_of_memory_is_typed_and_recoverable() {
    let _serial = serial();
    let Some(b) = backend("out_of_memory_is_typed_and_recoverable", 0) else {
        return;
    };
    let before = b.memory_stats();
    let err = b
        .alloc(500 << 30, std::panic::Location::caller())
        .expect_err("500 GiB must not fit");
    let Error::OutOfMemory(report) = &err else {
        panic!("expected OutOfMemory, got {err}");
    };
    assert_eq!(report.requested, 500 << 30);
    assert!(report.capacity.is_some_and(|c| c > 1 << 30), "{report:?}");
    let message = err.to_string();
    assert!(
        message.contains("cuda:0") && message.contains("exceeds the device's capacity"),
        "{message}"
    );
    let after = b.memory_stats();
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.oom_count, before.oom_count + 1);
    // Keep working: allocate, compute, read back.
    let n = 1 << 20;
    let x = upload_f32(&b, &vec![1.5; n]);
    let y = upload_f32(&b, &vec![2.0; n]);
    let out = b.alloc(n * 4, std::panic::Location::caller()).expect("alloc after OOM");
    b.launch(&Kernel::Binary {
        op: BinaryOp::Add,
        lhs: arg(x.slice(), &[n], DType::F32),
        rhs: arg(y.slice(), &[n], DType::F32),
        out: arg(out.slice(), &[n], DType::F32),
    })
    .expect("add after OOM");
    assert!(download_f32(&b, out.slice(), n).iter().all(|&v| v == 3.5));
    for a in [x, y, out] {
        b.free(a);
    }
}

/// Launch one kernel of every source file so that every module is compiled (or loaded).
fn touch_every_module(b: &CudaBackend) {
    let n = 64;
    let x = upload_f32(b, &vec![0.25; n]);
    let out = b.alloc(n * 8, std::panic::Location::caller()).expect("alloc");
    let v = |a: &cartage_core::Allocation, dtype| arg(a.slice(), &[n], dtype);
    let kernels = [
        Kernel::Unary {
            op: cartage_core::UnaryOp::Exp,
            input: v(&x, DType::F32),
            out: v(&out, DType::F32),
        },
        Kernel::Binary {
            op: BinaryOp::Mul,
            lhs: v(&x, DType::F32),
            rhs: v(&x, DType::F32),
            out: v(&out, DType::F32),
        },
        Kernel::Compare {
            op: cartage_core::CompareOp::Lt,
            lhs: v(&x, DType::F32),
            rhs: v(&x, DType::F32),
            out: v(&out, DType::Bool),
        },
        Kernel::Arange {
            out: v(&out, DType::F32),
            start: 0.0,
            step: 1.0,
        },
        Kernel::Cast {
            input: v(&x, DType::F32),
            out: v(&out, DType::F64),
        },
        Kernel::Reduce {
            op: cartage_core::ReduceOp::Sum,
            input: v(&x, DType::F32),
            dims: [0].into_iter().collect(),
            out: arg(out.slice(), &[1], DType::F32),
        },
        Kernel::Reduce {
            op: cartage_core::ReduceOp::Max,
            input: v(&x, DType::F32),
            dims: [0].into_iter().collect(),
            out: arg(out.slice(), &[1], DType::F32),
        },
        Kernel::Softmax {
            input: v(&x, DType::F32),
            dim: 0,
            log: false,
            out: v(&out, DType::F32),
        },
    ];
    for k in &kernels {
        b.launch(k).expect("launch");
    }
    b.synchronize().expect("sync");
    b.free(x);
    b.free(out);
}

#[test]
fn kernels_are_cached_on_disk_for_the_next_process() {
    let _serial = serial();
    let Some(b) = backend("kernels_are_cached_on_disk_for_the_next_process", 0) else {
        return;
    };
    touch_every_module(&b);
    let path = b
        .modules()
        .cache_path(cartage_cuda::modules::SourceFile::Unary)
        .expect("a cache folder (XDG_CACHE_HOME or HOME)");
    assert!(path.exists(), "{} was not written", path.display());
    // A second process: it must load from disk and compile nothing.
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "second_process_loads_kernels_from_disk",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_VAR, "1")
        .output()
        .expect("run the second process");
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "second process failed:\n{text}");
    assert!(
        text.contains("child: compiled 0"),
        "second process compiled kernels:\n{text}"
    );
    eprintln!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("child:"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Run by `kernels_are_cached_on_disk_for_the_next_process` in a child process.
#[test]
#[ignore = "run as a child process by kernels_are_cached_on_disk_for_the_next_process"]
fn second_process_loads_kernels_from_disk() {
    let _serial = serial();
    assert_eq!(
        std::env::var(CHILD_VAR).as_deref(),
        Ok("1"),
        "only meaningful as a child process"
    );
    let b = cartage_cuda::open_cuda(0).expect("open in the child");
    let started = std::time::Instant::now();
    touch_every_module(&b);
    let stats = b.modules().stats();
    println!(
        "child: compiled {} disk hits {} load {:?} first calls {:?}",
        stats.compiled,
        stats.disk_hits,
        stats.load_time,
        started.elapsed()
    );
}

#[test]
fn pinned_async_copies_round_trip_in_order() {
    let _serial = serial();
    let Some(b) = backend("pinned_async_copies_round_trip_in_order", 0) else {
        return;
    };
    let n = 64 << 20; // 64 Mi f32 = 256 MiB: each fill below takes a while on the device.
    let bytes = n * 4;
    let pinned_before = pinned_bytes_in_use();
    let mut src = b.alloc_pinned(bytes).expect("pinned");
    assert!(pinned_bytes_in_use() >= pinned_before + bytes as u64);
    for (i, chunk) in src.as_mut_slice().chunks_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as f32).to_le_bytes());
    }
    let dst = b.alloc(bytes, std::panic::Location::caller()).expect("alloc");
    // Queue compute work on the block first: the copy must land after it, not under it.
    for _ in 0..8 {
        b.launch(&Kernel::Fill {
            out: arg(dst.slice(), &[n], DType::F32),
            value: Scalar::Float(-1.0),
        })
        .expect("fill");
    }
    let copy = b.write_async(dst.slice(), &src).expect("write_async");
    copy.wait().expect("wait");
    // And compute queued after the copy sees its data: double it, then read back asynchronously.
    b.launch(&Kernel::Binary {
        op: BinaryOp::Add,
        lhs: arg(dst.slice(), &[n], DType::F32),
        rhs: arg(dst.slice(), &[n], DType::F32),
        out: arg(dst.slice(), &[n], DType::F32),
    })
    .expect("add");
    let mut back = b.alloc_pinned(bytes).expect("pinned");
    let read = b.read_async(dst.slice(), &mut back).expect("read_async");
    read.wait().expect("wait");
    for (i, chunk) in back.as_slice().chunks(4).enumerate().step_by(9973) {
        let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        assert_eq!(v, 2.0 * i as f32, "element {i}");
    }
    b.free(dst);
}

#[test]
fn pageable_copies_of_every_size_round_trip() {
    let _serial = serial();
    let Some(b) = backend("pageable_copies_of_every_size_round_trip", 0) else {
        return;
    };
    // Below, at and above the staging chunk (16 MiB), odd lengths included.
    for len in [1usize, 4097, (1 << 20) + 3, (40 << 20) + 5] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let a = b.alloc(len, std::panic::Location::caller()).expect("alloc");
        b.write(a.slice(), &data).expect("write");
        let mut back = vec![0u8; len];
        b.read(a.slice(), &mut back).expect("read");
        assert!(back == data, "round trip of {len} bytes differs");
        b.free(a);
    }
}

#[test]
fn out_of_range_indices_are_found_on_the_device() {
    let _serial = serial();
    let Some(b) = backend("out_of_range_indices_are_found_on_the_device", 0) else {
        return;
    };
    let input = upload_f32(&b, &[10.0, 20.0, 30.0]);
    let index = b.alloc(16, std::panic::Location::caller()).expect("alloc");
    let out = b.alloc(8, std::panic::Location::caller()).expect("alloc");
    for (values, bad) in [([2i64, 5], Some(5)), ([-1, 0], Some(-1)), ([2, 0], None)] {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        b.write(index.slice(), &bytes).expect("write");
        let result = b.launch(&Kernel::IndexSelect {
            input: arg(input.slice(), &[3], DType::F32),
            index: arg(index.slice(), &[2], DType::I64),
            dim: 0,
            out: arg(out.slice(), &[2], DType::F32),
        });
        match (result, bad) {
            (Err(Error::IndexOutOfRange { index, size, .. }), Some(want)) => {
                assert_eq!((index, size), (want, 3));
            }
            (Ok(()), None) => assert_eq!(download_f32(&b, out.slice(), 2), vec![30.0, 10.0]),
            (other, want) => panic!("indices {values:?}: got {other:?}, wanted {want:?}"),
        }
    }
    for a in [input, index, out] {
        b.free(a);
    }
}

#[test]
fn matmul_precision_switches_between_f32_and_tf32() {
    let _serial = serial();
    let Some(b) = backend("matmul_precision_switches_between_f32_and_tf32", 0) else {
        return;
    };
    let (m, k, n) = (64, 512, 64);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let lhs: Vec<f32> = (0..m * k).map(|_| next()).collect();
    let rhs: Vec<f32> = (0..k * n).map(|_| next()).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..k).map(|p| lhs[i * k + p] as f64 * rhs[p * n + j] as f64).sum()
        })
        .collect();
    let (l, r) = (upload_f32(&b, &lhs), upload_f32(&b, &rhs));
    let out = b.alloc(m * n * 4, std::panic::Location::caller()).expect("alloc");
    let error = |precision| {
        b.set_matmul_precision(precision).expect("set precision");
        b.launch(&Kernel::Matmul {
            lhs: arg(l.slice(), &[1, m, k], DType::F32),
            rhs: arg(r.slice(), &[1, k, n], DType::F32),
            out: arg(out.slice(), &[1, m, n], DType::F32),
        })
        .expect("matmul");
        let got = download_f32(&b, out.slice(), m * n);
        let num: f64 = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
        let den: f64 = want.iter().map(|w| w * w).sum();
        (num / den).sqrt()
    };
    let highest = error(MatmulPrecision::Highest);
    let high = error(MatmulPrecision::High);
    b.set_matmul_precision(MatmulPrecision::Highest).expect("restore");
    eprintln!("matmul relative error: highest {highest:.2e}, high (tf32) {high:.2e}");
    assert!(highest < 1e-6, "true f32 error {highest}");
    assert!(high > 10.0 * highest, "TF32 should lose precision: {high} vs {highest}");
    for a in [l, r, out] {
        b.free(a);
    }
}

#[test]
fn events_time_device_work() {
    let _serial = serial();
    let Some(b) = backend("events_time_device_work", 0) else {
        return;
    };
    let n = 16 << 20;
    let a = b.alloc(n * 4, std::panic::Location::caller()).expect("alloc");
    let start = b.record_event().expect("event");
    for _ in 0..4 {
        b.launch(&Kernel::Arange {
            out: arg(a.slice(), &[n], DType::F32),
            start: 0.0,
            step: 1.0,
        })
        .expect("arange");
    }
    let end = b.record_event().expect("event");
    let elapsed = b.elapsed(&start, &end).expect("elapsed");
    assert!(elapsed.as_nanos() > 0, "{elapsed:?}");
    eprintln!("4 × arange of 16 Mi f32: {elapsed:?} on the device");
    b.free(a);
}

#[test]
fn two_devices_are_distinct_and_copy_peer_to_peer() {
    let _serial = serial();
    let count = cartage_cuda::device_count().unwrap_or(0);
    if count < 2 {
        eprintln!("SKIP cuda/two_devices_are_distinct_and_copy_peer_to_peer: {count} CUDA device(s); needs 2");
        return;
    }
    let (Some(b0), Some(b1)) = (backend("two_devices", 0), backend("two_devices", 1)) else {
        return;
    };
    assert_eq!(b0.device().to_string(), "cuda:0");
    assert_eq!(b1.device().to_string(), "cuda:1");
    assert_ne!(b0.device(), b1.device());
    let n = (3 << 20) + 1;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let src = upload_f32(&b0, &values);
    let dst = b1
        .alloc(n * 4, std::panic::Location::caller())
        .expect("alloc on cuda:1");
    let peer: &dyn Backend = b1.as_ref();
    assert!(b0.copy_to_peer(src.slice(), peer, dst.slice()).expect("peer copy"));
    assert_eq!(download_f32(&b1, dst.slice(), n), values);
    b0.free(src);
    b1.free(dst);
}
