//! CUDA-specific behaviour beyond the conformance suite: out-of-memory and recovery, the on-disk
//! kernel cache seen from a second process, pinned asynchronous copies ordered against compute
//! (and guarded when their handle is forgotten), pinned memory of impossible sizes and of another
//! device, malformed kernels refused before launch, device-side index checks, the matmul precision
//! switch, device timing, and two devices.
//!
//! Every test goes through the sound path (`DeviceBuffer`, `Kernel::run`). Without a CUDA device
//! each test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{
    Backend, BinaryOp, DType, DeviceBuffer, Error, HostStaging, Kernel, Layout, MatmulPrecision, PageableBuffer,
    Scalar, TensorArg, pinned_bytes_in_use,
};
use cartage_cuda::CudaBackend;

const CHILD_VAR: &str = "CARTAGE_CUDA_TEST_CHILD";

/// Tests of this binary share one device and compare its memory counters: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE")
        .map(|v| v.split(',').any(|k| k.trim() == "cuda"))
        .unwrap_or(false)
}

/// The backend for `cuda:ordinal`, or `None` after a loud skip (a panic under CARTAGE_REQUIRE).
fn backend(test: &str, ordinal: usize) -> Option<Arc<CudaBackend>> {
    match cartage_cuda::open_cuda(ordinal) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !required(),
                "CARTAGE_REQUIRE names cuda but {test} cannot open cuda:{ordinal}: {e}"
            );
            cartage_core::testsuite::skip::device_missing(
                &format!("cuda/{test}"),
                &format!("cuda:{ordinal}"),
                &e.to_string(),
            );
            None
        }
    }
}

/// The same backend as core's `Arc<dyn Backend>`, which `DeviceBuffer` holds.
fn dyn_backend(b: &Arc<CudaBackend>) -> Arc<dyn Backend> {
    b.clone()
}

fn buffer(b: &Arc<dyn Backend>, bytes: usize) -> DeviceBuffer {
    DeviceBuffer::new(b, bytes).expect("alloc")
}

fn arg(buf: &DeviceBuffer, shape: &[usize], dtype: DType) -> TensorArg {
    buf.arg(Layout::contiguous(shape).expect("layout"), dtype)
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn upload_f32(b: &Arc<dyn Backend>, values: &[f32]) -> DeviceBuffer {
    let buf = buffer(b, values.len() * 4);
    buf.write(0, &f32_bytes(values)).expect("write");
    buf
}

fn download_f32(buf: &DeviceBuffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    buf.read(0, &mut bytes).expect("read");
    f32_values(&bytes)
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
    let Some(cuda) = backend("out_of_memory_is_typed_and_recoverable", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let before = b.memory_stats();
    let err = DeviceBuffer::new(&b, 500 << 30).expect_err("500 GiB must not fit");
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
    let out = DeviceBuffer::new(&b, n * 4).expect("alloc after OOM");
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: arg(&x, &[n], DType::F32),
        rhs: arg(&y, &[n], DType::F32),
        out: arg(&out, &[n], DType::F32),
    }
    .run(&[&x, &y, &out])
    .expect("add after OOM");
    assert!(download_f32(&out, n).iter().all(|&v| v == 3.5));
}

/// Launch one kernel of every source file so that every module is compiled (or loaded).
fn touch_every_module(b: &Arc<dyn Backend>) {
    let n = 64;
    let x = upload_f32(b, &vec![0.25; n]);
    let out = buffer(b, n * 8);
    let v = |buf: &DeviceBuffer, dtype| arg(buf, &[n], dtype);
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
            out: arg(&out, &[1], DType::F32),
        },
        Kernel::Reduce {
            op: cartage_core::ReduceOp::Max,
            input: v(&x, DType::F32),
            dims: [0].into_iter().collect(),
            out: arg(&out, &[1], DType::F32),
        },
        Kernel::Softmax {
            input: v(&x, DType::F32),
            dim: 0,
            log: false,
            causal: false,
            out: v(&out, DType::F32),
        },
    ];
    for k in &kernels {
        k.run(&[&x, &out]).expect("launch");
    }
    b.synchronize().expect("sync");
}

#[test]
fn kernels_are_cached_on_disk_for_the_next_process() {
    let _serial = serial();
    let Some(cuda) = backend("kernels_are_cached_on_disk_for_the_next_process", 0) else {
        return;
    };
    touch_every_module(&dyn_backend(&cuda));
    let path = cuda
        .modules()
        .cache_path(cartage_cuda::modules::KernelName::new(
            cartage_cuda::modules::SourceFile::Unary,
            ["unary", "exp", "f32", "contig"],
        ))
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
    let cuda = cartage_cuda::open_cuda(0).expect("open in the child");
    let started = std::time::Instant::now();
    touch_every_module(&dyn_backend(&cuda));
    let stats = cuda.modules().stats();
    println!(
        "child: compiled {} disk hits {} load {:?} first calls {:?}",
        stats.compiled,
        stats.disk_hits,
        stats.load_time,
        started.elapsed()
    );
}

/// Run this test binary's `test` as a child process with `env`, returning its `child:` lines.
fn run_child(test: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut command = std::process::Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--exact", test, "--ignored", "--nocapture"])
        .env(CHILD_VAR, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run the child process");
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child {test} failed:\n{text}");
    text.lines()
        .filter(|l| l.starts_with("child:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A fresh machine: no disk cache and no driver JIT cache. Every module comes from the committed
/// PTX (NVRTC compiles nothing); a second process loads the machine code the first one cached;
/// with the PTX switched off, NVRTC compiles instead (the fallback for older devices).
#[test]
fn cold_start_builds_modules_from_the_committed_ptx() {
    let _serial = serial();
    let Some(cuda) = backend("cold_start_builds_modules_from_the_committed_ptx", 0) else {
        return;
    };
    if !cartage_cuda::precompiled::covers(cuda.compute_capability()) {
        eprintln!("SKIP cuda/cold_start: the committed PTX does not cover this device");
        return;
    }
    let cache = tempfile::tempdir().expect("a cache folder");
    let env = [
        ("XDG_CACHE_HOME", cache.path().as_os_str()),
        ("CUDA_CACHE_DISABLE", std::ffi::OsStr::new("1")),
    ];
    let first = run_child("cold_start_child", &env);
    eprintln!("{first}");
    let [compiled, built, hits] = child_counts(&first);
    assert_eq!(compiled, 0, "NVRTC compiled on a cold start:\n{first}");
    assert!(
        built >= 8 && hits == 0,
        "the kernels did not come from the PTX:\n{first}"
    );
    let second = run_child("cold_start_child", &env);
    eprintln!("{second}");
    assert_eq!(
        child_counts(&second),
        [0, 0, built],
        "the second process did not load the cached machine code:\n{second}"
    );
    let fallback = tempfile::tempdir().expect("a cache folder");
    let env = [
        ("XDG_CACHE_HOME", fallback.path().as_os_str()),
        ("CUDA_CACHE_DISABLE", std::ffi::OsStr::new("1")),
        ("CARTAGE_TEST_NO_PTX", std::ffi::OsStr::new("1")),
    ];
    let nvrtc = run_child("cold_start_child", &env);
    eprintln!("{nvrtc}");
    assert_eq!(
        child_counts(&nvrtc),
        [1, 0, 0],
        "without the PTX, NVRTC should build the one module used:\n{nvrtc}"
    );
}

/// `[compiled, precompiled, disk hits]` from a child's `child: compiled … precompiled … disk
/// hits …` line.
fn child_counts(lines: &str) -> [u32; 3] {
    let line = lines
        .lines()
        .find(|l| l.starts_with("child: compiled"))
        .unwrap_or_else(|| panic!("no counts in:\n{lines}"));
    let number = |label: &str| -> u32 {
        let at = line.find(label).unwrap_or_else(|| panic!("no {label} in {line}"));
        line[at + label.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("bad {label} in {line}"))
    };
    [number("compiled "), number("precompiled "), number("disk hits ")]
}

/// Run by `cold_start_builds_modules_from_the_committed_ptx` in a child process: times the first
/// op (context creation included) and the first use of eight modules.
#[test]
#[ignore = "run as a child process by cold_start_builds_modules_from_the_committed_ptx"]
fn cold_start_child() {
    assert_eq!(
        std::env::var(CHILD_VAR).as_deref(),
        Ok("1"),
        "only meaningful as a child process"
    );
    let started = std::time::Instant::now();
    let cuda = cartage_cuda::open_cuda(0).expect("open in the child");
    let opened = started.elapsed();
    let b = dyn_backend(&cuda);
    if std::env::var_os("CARTAGE_TEST_NO_PTX").is_some() {
        cuda.modules().set_use_precompiled(false);
        let x = upload_f32(&b, &[1.5; 64]);
        let out = buffer(&b, 64 * 8);
        Kernel::Cast {
            input: arg(&x, &[64], DType::F32),
            out: arg(&out, &[64], DType::F64),
        }
        .run(&[&x, &out])
        .expect("cast");
        b.synchronize().expect("sync");
    } else {
        // The first op: an arange (construct.cu).
        let out = buffer(&b, 64 * 4);
        Kernel::Arange {
            out: arg(&out, &[64], DType::F32),
            start: 0.0,
            step: 1.0,
        }
        .run(&[&out])
        .expect("arange");
        b.synchronize().expect("sync");
        let first_op = started.elapsed();
        touch_every_module(&b);
        println!(
            "child: first op {first_op:?} (open {opened:?}), eight modules {:?}",
            started.elapsed()
        );
        println!("child: {}", cuda.modules().origin_summary());
    }
    let stats = cuda.modules().stats();
    println!(
        "child: compiled {} precompiled {} disk hits {} jit {:?} nvrtc {:?} load {:?} total {:?}",
        stats.compiled,
        stats.precompiled,
        stats.disk_hits,
        stats.jit_time,
        stats.compile_time,
        stats.load_time,
        started.elapsed()
    );
}

#[test]
fn pinned_async_copies_round_trip_in_order() {
    let _serial = serial();
    let Some(cuda) = backend("pinned_async_copies_round_trip_in_order", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let n = 64 << 20; // 64 Mi f32 = 256 MiB: each fill below takes a while on the device.
    let bytes = n * 4;
    let pinned_before = pinned_bytes_in_use();
    let mut src = b.alloc_pinned(bytes).expect("pinned");
    assert_eq!(src.pinned_for(), Some(b.device()));
    assert!(pinned_bytes_in_use() >= pinned_before + bytes as u64);
    for (i, chunk) in src.as_mut_slice().chunks_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as f32).to_le_bytes());
    }
    let dst = buffer(&b, bytes);
    // Queue compute work on the block first: the copy must land after it, not under it.
    for _ in 0..8 {
        Kernel::Fill {
            out: arg(&dst, &[n], DType::F32),
            value: Scalar::Float(-1.0),
        }
        .run(&[&dst])
        .expect("fill");
    }
    let copy = dst.write_async(0, &src, bytes).expect("write_async");
    copy.wait().expect("wait");
    // And compute queued after the copy sees its data: double it in place, then read back
    // asynchronously.
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: arg(&dst, &[n], DType::F32),
        rhs: arg(&dst, &[n], DType::F32),
        out: arg(&dst, &[n], DType::F32),
    }
    .run(&[&dst])
    .expect("add");
    let mut back = b.alloc_pinned(bytes).expect("pinned");
    let read = dst.read_async(0, &mut back, bytes).expect("read_async");
    read.wait().expect("wait");
    for (i, chunk) in back.as_slice().chunks(4).enumerate().step_by(9973) {
        let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        assert_eq!(v, 2.0 * i as f32, "element {i}");
    }
}

/// 64 Mi i32 (256 MiB) holding 0, 1, 2, …, with `fills` more aranges queued behind the first so
/// that an asynchronous copy issued next has to wait for the device a while.
fn busy_arange(b: &Arc<dyn Backend>, n: usize, fills: usize) -> DeviceBuffer {
    let buf = buffer(b, n * 4);
    for _ in 0..fills {
        Kernel::Arange {
            out: arg(&buf, &[n], DType::I32),
            start: 0.0,
            step: 1.0,
        }
        .run(&[&buf])
        .expect("arange");
    }
    buf
}

#[test]
fn a_forgotten_copy_handle_still_guards_the_pinned_buffer() {
    let _serial = serial();
    let Some(cuda) = backend("a_forgotten_copy_handle_still_guards_the_pinned_buffer", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let n = 64 << 20;
    let bytes = n * 4;
    let expect_arange = |data: &[u8], what: &str| {
        let count = data.len() / 4;
        for i in (0..count).step_by(4099).chain([count - 1]) {
            let v = i32::from_le_bytes([data[4 * i], data[4 * i + 1], data[4 * i + 2], data[4 * i + 3]]);
            assert_eq!(v, i as i32, "{what}: element {i}");
        }
    };

    // Device → host: forget the handle, then touch the bytes at once. `as_mut_slice` must wait
    // for the copy, so it sees the device's data, and what is written next is not overwritten.
    let dev = busy_arange(&b, n, 64);
    let mut pinned = b.alloc_pinned(bytes).expect("pinned");
    let handle = dev.read_async(0, &mut pinned, bytes).expect("read_async");
    let in_flight = !handle.is_done();
    std::mem::forget(handle);
    let host = pinned.as_mut_slice();
    expect_arange(host, "read_async, handle forgotten");
    host[..4].copy_from_slice(&(-7i32).to_le_bytes());
    cuda.synchronize().expect("sync");
    assert_eq!(
        &pinned.as_slice()[..4],
        &(-7i32).to_le_bytes(),
        "a late copy overwrote the host write"
    );
    eprintln!("read_async still in flight when its handle was forgotten: {in_flight}");

    // Host → device: forget the handle, then overwrite the source at once. The device must get
    // the bytes as they were when the copy was issued.
    let target = busy_arange(&b, n, 64);
    let mut source = b.alloc_pinned(bytes).expect("pinned");
    for (i, chunk) in source.as_mut_slice().chunks_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as i32).to_le_bytes());
    }
    Kernel::Fill {
        out: arg(&target, &[n], DType::I32),
        value: Scalar::Int(-1),
    }
    .run(&[&target])
    .expect("fill");
    std::mem::forget(target.write_async(0, &source, bytes).expect("write_async"));
    source.as_mut_slice().fill(0xAB);
    let mut back = vec![0u8; bytes];
    target.read(0, &mut back).expect("read");
    expect_arange(&back, "write_async, handle forgotten, source overwritten");

    // Forgetting the handle and dropping the buffer: the drop waits before freeing the memory.
    let mut doomed = b.alloc_pinned(bytes).expect("pinned");
    std::mem::forget(dev.read_async(0, &mut doomed, bytes).expect("read_async"));
    drop(doomed);
    cuda.synchronize()
        .expect("sync after dropping a buffer with a copy in flight");
}

#[test]
fn pinned_memory_of_an_impossible_size_is_out_of_memory() {
    let _serial = serial();
    let Some(cuda) = backend("pinned_memory_of_an_impossible_size_is_out_of_memory", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let before = pinned_bytes_in_use();
    for bytes in [1usize << 45, usize::MAX] {
        match b.alloc_pinned(bytes) {
            Err(Error::OutOfMemory(report)) => {
                assert_eq!(report.requested, bytes);
                eprintln!("alloc_pinned({bytes}): {}", Error::OutOfMemory(report));
            }
            other => panic!("alloc_pinned({bytes}) must be OutOfMemory, got {other:?}"),
        }
        assert!(
            matches!(b.alloc_staging(bytes), Err(Error::OutOfMemory(_))),
            "alloc_staging({bytes})"
        );
    }
    assert_eq!(pinned_bytes_in_use(), before);
    // The device still pins ordinary sizes afterwards.
    let staging = b.alloc_staging(4096).expect("staging");
    assert!(staging.is_pinned() && staging.pinned_for() == Some(b.device()));
}

#[test]
fn pageable_memory_copies_synchronously_and_foreign_pinned_memory_is_refused() {
    let _serial = serial();
    let Some(cuda) = backend("pageable_memory_copies_synchronously", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    // Pageable memory through the asynchronous API: a correct copy, done when it returns.
    let len = (3 << 20) + 5;
    let mut host = PageableBuffer::new(len).expect("pageable");
    for (i, byte) in host.as_mut_slice().iter_mut().enumerate() {
        *byte = (i * 13 + 1) as u8;
    }
    let dev = buffer(&b, len);
    let handle = dev
        .write_async(0, &host, len)
        .expect("write_async from pageable memory");
    assert!(handle.is_done(), "a pageable copy completes before write_async returns");
    handle.wait().expect("wait");
    let mut back = PageableBuffer::new(len).expect("pageable");
    dev.read_async(0, &mut back, len)
        .expect("read_async into pageable memory")
        .wait()
        .expect("wait");
    assert!(back.as_slice() == host.as_slice(), "pageable round trip differs");

    // Memory pinned for cuda:0 used with cuda:1: a typed error naming both devices.
    let count = cartage_cuda::device_count().unwrap_or(0);
    if count < 2 {
        eprintln!(
            "SKIP cuda/pinned_memory_of_another_device_is_refused: {count} CUDA device(s); needs 2 \
             (the pageable part above ran)"
        );
        return;
    }
    let Some(cuda1) = backend("pinned_memory_of_another_device_is_refused", 1) else {
        return;
    };
    let b1 = dyn_backend(&cuda1);
    let mut pinned0 = b.alloc_pinned(4096).expect("pinned on cuda:0");
    let dev1 = buffer(&b1, 4096);
    let refusals = [
        dev1.write_async(0, &pinned0, 4096).map(|_| ()),
        dev1.read_async(0, &mut pinned0, 4096).map(|_| ()),
    ];
    for result in refusals {
        let err = result.expect_err("pinned memory of cuda:0 used with cuda:1");
        assert_eq!(err.kind_name(), "invalid-argument", "{err}");
        let message = err.to_string();
        assert!(
            message.contains("pinned for cuda:0, used with cuda:1") && message.contains("alloc_pinned"),
            "{message}"
        );
    }
}

#[test]
fn malformed_kernels_are_refused_before_launch() {
    let _serial = serial();
    let Some(cuda) = backend("malformed_kernels_are_refused_before_launch", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let n = 8;
    let x = upload_f32(&b, &(0..n + 1).map(|i| i as f32).collect::<Vec<_>>());
    let view = |offset: usize, len: usize, shape: &[usize], strides: Option<&[usize]>| TensorArg {
        buffer: x.range(offset, len).expect("range"),
        layout: match strides {
            Some(s) => Layout::from_parts(shape, s, 0).expect("layout"),
            None => Layout::contiguous(shape).expect("layout"),
        },
        dtype: DType::F32,
    };
    let add = |lhs, rhs, out| Kernel::Binary {
        op: BinaryOp::Add,
        lhs,
        rhs,
        out,
    };
    let cases = [
        (
            "a misaligned operand",
            add(
                view(2, n * 4, &[n], None),
                view(0, n * 4, &[n], None),
                view(0, n * 4, &[n], None),
            ),
            "aligned",
        ),
        (
            "an output overlapping an input",
            add(
                view(0, n * 4, &[n], None),
                view(0, n * 4, &[n], None),
                view(4, n * 4, &[n], None),
            ),
            "shares memory",
        ),
        (
            "a broadcast output",
            add(
                view(0, n * 4, &[n], None),
                view(0, n * 4, &[n], None),
                view(0, 4, &[n], Some(&[0])),
            ),
            "several elements to one address",
        ),
    ];
    for (what, kernel, needle) in cases {
        let err = kernel.run(&[&x]).expect_err(what);
        assert_eq!(err.kind_name(), "invalid-argument", "{what}: {err}");
        assert!(err.to_string().contains(needle), "{what}: {err}");
    }
    let shapes = add(
        view(0, n * 4, &[n], None),
        view(0, 16, &[4], None),
        view(0, n * 4, &[n], None),
    );
    let err = shapes.run(&[&x]).expect_err("mismatched shapes");
    assert_eq!(err.kind_name(), "shape-mismatch", "{err}");
    // Nothing was launched: the buffer is as written.
    assert_eq!(
        download_f32(&x, n + 1),
        (0..n + 1).map(|i| i as f32).collect::<Vec<_>>()
    );
}

#[test]
fn pageable_copies_of_every_size_round_trip() {
    let _serial = serial();
    let Some(cuda) = backend("pageable_copies_of_every_size_round_trip", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    // Below, at and above the staging chunk (16 MiB), odd lengths included.
    for len in [1usize, 4097, (1 << 20) + 3, (40 << 20) + 5] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let a = buffer(&b, len);
        a.write(0, &data).expect("write");
        let mut back = vec![0u8; len];
        a.read(0, &mut back).expect("read");
        assert!(back == data, "round trip of {len} bytes differs");
    }
}

/// A large pageable read is one DMA into pinned staging and one host copy into the caller's
/// slice: the host copies each byte exactly once (a second copy would double the count).
#[test]
fn pageable_reads_are_staged_and_copied_once() {
    let _serial = serial();
    let Some(cuda) = backend("pageable_reads_are_staged_and_copied_once", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let len = (40 << 20) + 12;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
    let a = buffer(&b, len);
    let before = cuda.transfer_stats();
    a.write(0, &data).expect("write");
    let written = cuda.transfer_stats();
    assert_eq!(written.staged_write_bytes - before.staged_write_bytes, len as u64);
    assert_eq!(written.host_copy_bytes - before.host_copy_bytes, len as u64);
    let mut back = vec![0u8; len];
    a.read(0, &mut back).expect("read");
    let read = cuda.transfer_stats();
    assert!(back == data, "the staged read differs");
    assert_eq!(read.staged_read_bytes - written.staged_read_bytes, len as u64);
    assert_eq!(
        read.host_copy_bytes - written.host_copy_bytes,
        len as u64,
        "each byte is copied once by the host"
    );
    assert_eq!(
        read.direct_bytes, written.direct_bytes,
        "nothing went around the staging"
    );
    // Reads from several threads at once each take a staging set from the pool.
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                let mut back = vec![0u8; len];
                a.read(0, &mut back).expect("concurrent read");
                assert!(back == data, "a concurrent read differs");
            });
        }
    });
    let after = cuda.transfer_stats();
    assert_eq!(after.host_copy_bytes - read.host_copy_bytes, 3 * len as u64);
    assert!(after.staging_sets >= 1);
    eprintln!("cuda/pageable_reads: {after:?}");
}

/// Strided copies on each of their paths, against the host: the tiled transpose (2-D, batched,
/// outer-dimension unit stride, ragged edges, every element width), the widened gather (inner
/// dimension contiguous on both sides) and the plain gather (a misaligned view).
#[test]
fn strided_copies_match_the_host_on_every_path() {
    let _serial = serial();
    let Some(cuda) = backend("strided_copies_match_the_host_on_every_path", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    // (source shape, permutation, element offset of the view)
    let cases: [(&[usize], &[usize], usize); 7] = [
        (&[67, 45], &[1, 0], 0),
        (&[3, 50, 33], &[0, 2, 1], 0),
        (&[20, 6, 40], &[2, 1, 0], 0),
        (&[2, 17, 3, 64], &[0, 2, 1, 3], 0),
        (&[4, 5, 6, 2], &[1, 0, 2, 3], 0),
        (&[2, 17, 3, 64], &[0, 2, 1, 3], 1),
        (&[9, 40], &[1, 0], 1),
    ];
    for dtype in [DType::U8, DType::F16, DType::F32, DType::F64] {
        let size = dtype.size_in_bytes();
        for (shape, perm, offset) in cases {
            let numel: usize = shape.iter().product();
            let src_bytes: Vec<u8> = (0..(numel + offset) * size).map(|i| (i * 31 % 251) as u8).collect();
            let src = buffer(&b, src_bytes.len());
            src.write(0, &src_bytes).expect("write");
            let base = Layout::contiguous(shape).expect("layout");
            let view = Layout::from_parts(shape, base.strides(), offset)
                .and_then(|l| l.permute(perm))
                .expect("view");
            let out_shape = view.shape().to_vec();
            let out = buffer(&b, numel * size);
            Kernel::Copy {
                input: src.arg(view.clone(), dtype),
                out: arg(&out, &out_shape, dtype),
            }
            .run(&[&src, &out])
            .expect("copy");
            let mut got = vec![0u8; numel * size];
            out.read(0, &mut got).expect("read");
            let want: Vec<u8> = view
                .offsets()
                .flat_map(|o| src_bytes[o * size..(o + 1) * size].to_vec())
                .collect();
            assert!(
                got == want,
                "{dtype} copy of {shape:?} permuted {perm:?} at {offset} differs"
            );
        }
    }
}

#[test]
fn out_of_range_indices_are_found_on_the_device() {
    let _serial = serial();
    let Some(cuda) = backend("out_of_range_indices_are_found_on_the_device", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let input = upload_f32(&b, &[10.0, 20.0, 30.0]);
    let index = buffer(&b, 16);
    let out = buffer(&b, 8);
    for (values, bad) in [([2i64, 5], Some(5)), ([-1, 0], Some(-1)), ([2, 0], None)] {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        index.write(0, &bytes).expect("write");
        let result = Kernel::IndexSelect {
            input: arg(&input, &[3], DType::F32),
            index: arg(&index, &[2], DType::I64),
            dim: 0,
            out: arg(&out, &[2], DType::F32),
        }
        .run(&[&input, &index, &out]);
        match (result, bad) {
            (Err(Error::IndexOutOfRange { index, size, .. }), Some(want)) => {
                assert_eq!((index, size), (want, 3));
            }
            (Ok(()), None) => assert_eq!(download_f32(&out, 2), vec![30.0, 10.0]),
            (other, want) => panic!("indices {values:?}: got {other:?}, wanted {want:?}"),
        }
    }
}

#[test]
fn matmul_precision_switches_between_f32_and_tf32() {
    let _serial = serial();
    let Some(cuda) = backend("matmul_precision_switches_between_f32_and_tf32", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
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
    let out = buffer(&b, m * n * 4);
    let error = |precision| {
        b.set_matmul_precision(precision).expect("set precision");
        Kernel::Matmul {
            lhs: arg(&l, &[1, m, k], DType::F32),
            rhs: arg(&r, &[1, k, n], DType::F32),
            out: arg(&out, &[1, m, n], DType::F32),
        }
        .run(&[&l, &r, &out])
        .expect("matmul");
        let got = download_f32(&out, m * n);
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
}

#[test]
fn events_time_device_work() {
    let _serial = serial();
    let Some(cuda) = backend("events_time_device_work", 0) else {
        return;
    };
    let b = dyn_backend(&cuda);
    let n = 16 << 20;
    let a = buffer(&b, n * 4);
    let start = b.record_event().expect("event");
    for _ in 0..4 {
        Kernel::Arange {
            out: arg(&a, &[n], DType::F32),
            start: 0.0,
            step: 1.0,
        }
        .run(&[&a])
        .expect("arange");
    }
    let end = b.record_event().expect("event");
    let elapsed = b.elapsed(&start, &end).expect("elapsed");
    assert!(elapsed.as_nanos() > 0, "{elapsed:?}");
    eprintln!("4 × arange of 16 Mi f32: {elapsed:?} on the device");
}

#[test]
fn two_devices_are_distinct_and_copy_peer_to_peer() {
    let _serial = serial();
    let count = cartage_cuda::device_count().unwrap_or(0);
    if count < 2 {
        eprintln!("SKIP cuda/two_devices_are_distinct_and_copy_peer_to_peer: {count} CUDA device(s); needs 2");
        return;
    }
    let (Some(c0), Some(c1)) = (backend("two_devices", 0), backend("two_devices", 1)) else {
        return;
    };
    let (b0, b1) = (dyn_backend(&c0), dyn_backend(&c1));
    assert_eq!(b0.device().to_string(), "cuda:0");
    assert_eq!(b1.device().to_string(), "cuda:1");
    assert_ne!(b0.device(), b1.device());
    let n = (3 << 20) + 1;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let src = upload_f32(&b0, &values);
    let dst = DeviceBuffer::new(&b1, n * 4).expect("alloc on cuda:1");
    assert!(src.copy_to_peer(0, &dst, 0, n * 4).expect("peer copy"));
    assert_eq!(download_f32(&dst, n), values);
}
