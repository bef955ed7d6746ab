//! cuda_bench: the CUDA backend's performance figures, as `RESULT<TAB>case<TAB>value<TAB>unit`
//! lines that `bench/compare.py` joins with `bench/torch_bench.py`'s (same case names).
//!
//! Device time comes from CUDA events around each call (median of ≥ 20 after warm-up); host
//! time per call from a loop ended by a synchronisation. Raw-driver baselines (cuLaunchKernel,
//! cuMemcpy from pinned and pageable memory) are measured here too. `--cold-child` is the second
//! process of the cold-start measurement (kernels found in the on-disk cache).
//!
//! `ops` mode times only the row-wise model ops (layer/RMS norm, softmax, log-softmax,
//! cross-entropy) over 2^26 elements, reporting GB/s of the bytes each must move (`bench/ops_torch.py`
//! prints the same rows for PyTorch).
//!
//! `strided` mode times `contiguous()` of 1 GiB transposed and permuted views, and reading back
//! into a fresh vector (as `to_vec` does).
//!
//! `attention` mode times the fused flash-attention kernel (B·H = 128, L = S = 1024) in TFLOP/s.
//!
//! `conv` mode times `Kernel::Conv2d` (cuDNN) on ResNet-like 3×3 convolutions (batch 32,
//! 64→64 channels, 56×56, padding 1) in f32 (true f32 and TF32), bf16 and f16, and bf16 read
//! from a channels-last buffer, in TFLOP/s of `2·N·O·OH·OW·C/g·kh·kw`.
//!
//! Usage: `cuda_bench [--quick]`, `cuda_bench strided`, `cuda_bench conv`, `cuda_bench ops` or `cuda_bench attention` on a machine with a
//! CUDA device.

use std::ffi::c_void;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cartage_core::{
    Backend, BinaryOp, DType, DeviceBuffer, Distribution, Kernel, Layout, MatmulPrecision, NormKind, ReduceOp,
    TensorArg,
};
use cartage_cuda::CudaBackend;
use cartage_cuda::modules::{KernelName, SourceFile};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The backend as core's trait object, which [`DeviceBuffer`] holds.
type Dyn = Arc<dyn Backend>;

const MIB: usize = 1 << 20;

fn result(case: &str, value: f64, unit: &str) {
    println!("RESULT\t{case}\t{value:.4}\t{unit}");
}

fn tensor(a: &DeviceBuffer, shape: &[usize], dtype: DType) -> TensorArg {
    a.arg(Layout::contiguous(shape).expect("layout"), dtype)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median device seconds of `f` over `reps` runs after `warmup`.
fn device_time(b: &Dyn, warmup: usize, reps: usize, mut f: impl FnMut()) -> Res<f64> {
    for _ in 0..warmup {
        f();
    }
    b.synchronize()?;
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = b.record_event()?;
        f();
        events.push((start, b.record_event()?));
    }
    let mut times = Vec::with_capacity(reps);
    for (start, end) in &events {
        times.push(b.elapsed(start, end)?.as_secs_f64());
    }
    Ok(median(times))
}

/// Host seconds per call of `f`, over `iters` calls ended by a synchronisation.
fn host_time(b: &Dyn, iters: usize, mut f: impl FnMut()) -> Res<f64> {
    for _ in 0..iters.min(100) {
        f();
    }
    b.synchronize()?;
    let started = Instant::now();
    for _ in 0..iters {
        f();
    }
    b.synchronize()?;
    Ok(started.elapsed().as_secs_f64() / iters as f64)
}

/// Median wall seconds of `f` (which waits for its own completion).
fn wall_time(reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        f()?;
        times.push(started.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

fn alloc_random(b: &Dyn, shape: &[usize], dtype: DType, seed: u64) -> Res<DeviceBuffer> {
    let n: usize = shape.iter().product();
    let a = DeviceBuffer::new(b, n * dtype.size_in_bytes())?;
    Kernel::Random {
        out: tensor(&a, shape, dtype),
        distribution: Distribution::Normal { mean: 0.0, std: 1.0 },
        seed,
        offset: 0,
    }
    .run(&[&a])?;
    Ok(a)
}

fn matmul(b: &Dyn, quick: bool) -> Res<()> {
    let sizes: &[usize] = if quick {
        &[1024, 4096]
    } else {
        &[256, 512, 1024, 2048, 4096, 8192]
    };
    let cases = [
        ("f32_highest", DType::F32, MatmulPrecision::Highest, 256),
        ("f32_high", DType::F32, MatmulPrecision::High, 256),
        ("f16", DType::F16, MatmulPrecision::Highest, 2048),
        ("bf16", DType::BF16, MatmulPrecision::Highest, 2048),
    ];
    for (name, dtype, precision, min) in cases {
        b.set_matmul_precision(precision)?;
        for &n in sizes.iter().filter(|&&n| n >= min) {
            let (x, y) = (
                alloc_random(b, &[1, n, n], dtype, 1)?,
                alloc_random(b, &[1, n, n], dtype, 2)?,
            );
            let out = DeviceBuffer::new(b, n * n * dtype.size_in_bytes())?;
            let k = Kernel::Matmul {
                lhs: tensor(&x, &[1, n, n], dtype),
                rhs: tensor(&y, &[1, n, n], dtype),
                out: tensor(&out, &[1, n, n], dtype),
            };
            let reps = if n >= 4096 { 20 } else { 50 };
            let t = device_time(b, 5, reps, || k.run(&[&x, &y, &out]).expect("matmul"))?;
            result(
                &format!("matmul_{name}_{n}"),
                2.0 * (n as f64).powi(3) / t / 1e12,
                "TFLOP/s",
            );
        }
    }
    b.set_matmul_precision(MatmulPrecision::Highest)?;
    for n in [16usize, 32, 64, 128, 256] {
        let dtype = DType::F32;
        let (x, y) = (
            alloc_random(b, &[1, n, n], dtype, 3)?,
            alloc_random(b, &[1, n, n], dtype, 4)?,
        );
        let out = DeviceBuffer::new(b, n * n * 4)?;
        let k = Kernel::Matmul {
            lhs: tensor(&x, &[1, n, n], dtype),
            rhs: tensor(&y, &[1, n, n], dtype),
            out: tensor(&out, &[1, n, n], dtype),
        };
        let t = host_time(b, 2000, || k.run(&[&x, &y, &out]).expect("matmul"))?;
        result(&format!("small_matmul_f32_{n}"), t * 1e6, "us/call");
    }
    Ok(())
}

fn tiny_ops(b: &Dyn, cuda: &CudaBackend) -> Res<()> {
    let n = 4usize;
    let (x, y) = (
        alloc_random(b, &[n], DType::F32, 5)?,
        alloc_random(b, &[n], DType::F32, 6)?,
    );
    // Through the backend as the frontend drives it: a cached allocation, a launch, a free.
    let t = host_time(b, 20000, || {
        let out = DeviceBuffer::new(b, n * 4).expect("alloc");
        Kernel::Binary {
            op: BinaryOp::Add,
            lhs: tensor(&x, &[n], DType::F32),
            rhs: tensor(&y, &[n], DType::F32),
            out: tensor(&out, &[n], DType::F32),
        }
        .run(&[&x, &y, &out])
        .expect("add");
    })?;
    result("tiny_add_f32", t * 1e6, "us/op");
    // Its parts: the cached allocation and free alone, and the launch of a prebuilt kernel value.
    let t = host_time(b, 20000, || {
        drop(DeviceBuffer::new(b, n * 4).expect("alloc"));
    })?;
    result("tiny_alloc_free", t * 1e6, "us/op");
    let fixed = DeviceBuffer::new(b, n * 4)?;
    let prebuilt = Kernel::Binary {
        op: BinaryOp::Add,
        lhs: tensor(&x, &[n], DType::F32),
        rhs: tensor(&y, &[n], DType::F32),
        out: tensor(&fixed, &[n], DType::F32),
    };
    let t = host_time(b, 20000, || prebuilt.run(&[&x, &y, &fixed]).expect("add"))?;
    result("tiny_launch_prebuilt", t * 1e6, "us/op");
    drop(fixed);
    // The same compiled kernel through a bare cuLaunchKernel.
    let f = cuda
        .modules()
        .function(KernelName::new(SourceFile::Binary, ["binary", "add", "f32", "contig"]))?;
    let out = DeviceBuffer::new(b, n * 4)?;
    let (mut po, mut pa, mut pb, mut pn) = (out.slice().addr(), x.slice().addr(), y.slice().addr(), n as u64);
    let stream = cuda.compute_stream().cu_stream();
    let t = host_time(b, 20000, || {
        let mut params: [*mut c_void; 4] = [
            &mut po as *mut u64 as *mut c_void,
            &mut pa as *mut u64 as *mut c_void,
            &mut pb as *mut u64 as *mut c_void,
            &mut pn as *mut u64 as *mut c_void,
        ];
        // SAFETY: `binary_add_f32_contig(out, lhs, rhs, n)` takes three device addresses and a
        // u64; all three blocks hold n f32 and stay allocated until after the synchronisation.
        unsafe {
            cudarc::driver::result::launch_kernel(f.cu_function(), (1, 1, 1), (256, 1, 1), 0, stream, &mut params)
        }
        .expect("cuLaunchKernel");
    })?;
    result("raw_launch", t * 1e6, "us/op");
    Ok(())
}

fn elementwise(b: &Dyn, quick: bool) -> Res<()> {
    let sizes: &[(usize, &str)] = if quick {
        &[(256 * MIB, "256MiB")]
    } else {
        &[(256 * MIB, "256MiB"), (1024 * MIB, "1GiB")]
    };
    for &(bytes, label) in sizes {
        for dtype in [DType::F32, DType::BF16] {
            let n = bytes / dtype.size_in_bytes();
            let (x, y) = (alloc_random(b, &[n], dtype, 7)?, alloc_random(b, &[n], dtype, 8)?);
            let out = DeviceBuffer::new(b, bytes)?;
            let k = Kernel::Binary {
                op: BinaryOp::Add,
                lhs: tensor(&x, &[n], dtype),
                rhs: tensor(&y, &[n], dtype),
                out: tensor(&out, &[n], dtype),
            };
            let t = device_time(b, 3, 20, || k.run(&[&x, &y, &out]).expect("add"))?;
            result(&format!("add_{dtype}_{label}"), 3.0 * bytes as f64 / t / 1e9, "GB/s");
        }
    }
    Ok(())
}

fn reductions(b: &Dyn, quick: bool) -> Res<()> {
    let sizes: &[(usize, &str)] = if quick {
        &[(64 * MIB, "64MiB")]
    } else {
        &[(64 * MIB, "64MiB"), (1024 * MIB, "1GiB")]
    };
    let cols = 4096;
    for &(bytes, label) in sizes {
        let n = bytes / 4;
        let x = alloc_random(b, &[n], DType::F32, 9)?;
        let out = DeviceBuffer::new(b, (n / cols) * 4)?;
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let full = Kernel::Reduce {
                op,
                input: tensor(&x, &[n], DType::F32),
                dims: [0].into_iter().collect(),
                out: tensor(&out, &[1], DType::F32),
            };
            let t = device_time(b, 3, 20, || full.run(&[&x, &out]).expect("reduce"))?;
            result(
                &format!("{}_full_f32_{label}", op.name()),
                bytes as f64 / t / 1e9,
                "GB/s",
            );
            let rows = Kernel::Reduce {
                op,
                input: tensor(&x, &[n / cols, cols], DType::F32),
                dims: [1].into_iter().collect(),
                out: tensor(&out, &[n / cols, 1], DType::F32),
            };
            let t = device_time(b, 3, 20, || rows.run(&[&x, &out]).expect("reduce"))?;
            result(
                &format!("{}_rows_f32_{label}", op.name()),
                bytes as f64 / t / 1e9,
                "GB/s",
            );
        }
    }
    Ok(())
}

/// Elements per `ops` case: 256 MiB of f32.
const OPS_ELEMENTS: usize = 1 << 26;

/// Class targets in [0, classes) as i64: uniform floats cast down (truncation).
fn alloc_targets(b: &Dyn, rows: usize, classes: usize) -> Res<DeviceBuffer> {
    let uniform = DeviceBuffer::new(b, rows * 4)?;
    Kernel::Random {
        out: tensor(&uniform, &[rows], DType::F32),
        distribution: Distribution::Uniform {
            low: 0.0,
            high: classes as f64 - 0.5,
        },
        seed: 11,
        offset: 0,
    }
    .run(&[&uniform])?;
    let targets = DeviceBuffer::new(b, rows * 8)?;
    Kernel::Cast {
        input: tensor(&uniform, &[rows], DType::F32),
        out: tensor(&targets, &[rows], DType::I64),
    }
    .run(&[&uniform, &targets])?;
    Ok(targets)
}

/// The row-wise model ops on [2^26 / cols, cols] (GB/s of the bytes each must read and write).
fn ops(b: &Dyn) -> Res<()> {
    let time = |k: &Kernel, bufs: &[&DeviceBuffer]| device_time(b, 5, 30, || k.run(bufs).expect("op"));
    for dtype in [DType::F32, DType::BF16] {
        let size = dtype.size_in_bytes();
        for cols in [64usize, 256, 1024, 4096, 16384, 32768] {
            let rows = OPS_ELEMENTS / cols;
            let shape = [rows, cols];
            let bytes = (OPS_ELEMENTS * size) as f64;
            let x = alloc_random(b, &shape, dtype, 21)?;
            let out = DeviceBuffer::new(b, OPS_ELEMENTS * size)?;
            for log in [false, true] {
                let k = Kernel::Softmax {
                    input: tensor(&x, &shape, dtype),
                    dim: 1,
                    log,
                    out: tensor(&out, &shape, dtype),
                };
                let name = if log { "log_softmax" } else { "softmax" };
                let t = time(&k, &[&x, &out])?;
                result(&format!("{name}_{dtype}_{cols}"), 2.0 * bytes / t / 1e9, "GB/s");
            }
            if cols != 4096 {
                continue;
            }
            let (w, bias) = (
                alloc_random(b, &[cols], dtype, 22)?,
                alloc_random(b, &[cols], dtype, 23)?,
            );
            for kind in [NormKind::Layer, NormKind::Rms] {
                let k = Kernel::Norm {
                    kind,
                    input: tensor(&x, &shape, dtype),
                    weight: Some(tensor(&w, &[cols], dtype)),
                    bias: (kind == NormKind::Layer).then(|| tensor(&bias, &[cols], dtype)),
                    eps: 1e-5,
                    out: tensor(&out, &shape, dtype),
                };
                let t = time(&k, &[&x, &w, &bias, &out])?;
                result(
                    &format!("{}_{dtype}_{cols}", kind.name()),
                    2.0 * bytes / t / 1e9,
                    "GB/s",
                );
            }
            let targets = alloc_targets(b, rows, cols)?;
            let loss = DeviceBuffer::new(b, rows * size)?;
            let k = Kernel::CrossEntropy {
                logits: tensor(&x, &shape, dtype),
                target: tensor(&targets, &[rows], DType::I64),
                ignore_index: -100,
                label_smoothing: 0.0,
                out: tensor(&loss, &[rows], dtype),
            };
            let t = time(&k, &[&x, &targets, &loss])?;
            let moved = bytes + (rows * (8 + size)) as f64;
            result(&format!("cross_entropy_{dtype}_{cols}"), moved / t / 1e9, "GB/s");
        }
    }
    Ok(())
}

fn copies(b: &Dyn, cuda: &CudaBackend, quick: bool) -> Res<()> {
    let sizes: &[usize] = if quick {
        &[64 * MIB]
    } else {
        &[16 * MIB, 64 * MIB, 256 * MIB]
    };
    cuda.context().bind_to_thread()?;
    let stream = cuda.compute_stream().clone();
    for &bytes in sizes {
        let label = format!("{}MiB", bytes / MIB);
        let gbs = |t: f64| bytes as f64 / t / 1e9;
        let dev = DeviceBuffer::new(b, bytes)?;
        let mut pinned = b.alloc_pinned(bytes)?;
        pinned.as_mut_slice().fill(7);
        let t = wall_time(20, || Ok(dev.write_async(0, &pinned, bytes)?.wait()?))?;
        result(&format!("h2d_pinned_{label}"), gbs(t), "GB/s");
        let t = wall_time(20, || Ok(dev.read_async(0, &mut pinned, bytes)?.wait()?))?;
        result(&format!("d2h_pinned_{label}"), gbs(t), "GB/s");
        let addr = dev.slice().addr();
        let t = wall_time(20, || {
            cuda.context().bind_to_thread()?;
            // SAFETY: `dev` holds `bytes` bytes and `pinned` as many; the copy completes at the
            // synchronisation below, before either is touched again.
            unsafe { cudarc::driver::result::memcpy_htod_async(addr, pinned.as_slice(), stream.cu_stream()) }?;
            Ok(stream.synchronize()?)
        })?;
        result(&format!("raw_h2d_pinned_{label}"), gbs(t), "GB/s");
        let t = wall_time(20, || {
            cuda.context().bind_to_thread()?;
            // SAFETY: as above, device to host.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(pinned.as_mut_slice(), addr, stream.cu_stream()) }?;
            Ok(stream.synchronize()?)
        })?;
        result(&format!("raw_d2h_pinned_{label}"), gbs(t), "GB/s");
        drop(pinned);
        let mut host = vec![3u8; bytes];
        let t = wall_time(10, || Ok(dev.write(0, &host)?))?;
        result(&format!("h2d_pageable_{label}"), gbs(t), "GB/s");
        let t = wall_time(10, || Ok(dev.read(0, &mut host)?))?;
        result(&format!("d2h_pageable_{label}"), gbs(t), "GB/s");
        let t = wall_time(10, || {
            cuda.context().bind_to_thread()?;
            // SAFETY: a synchronous copy of `bytes` bytes from an owned slice into `dev`.
            Ok(unsafe { cudarc::driver::result::memcpy_htod_sync(addr, &host) }?)
        })?;
        result(&format!("raw_h2d_pageable_{label}"), gbs(t), "GB/s");
        let t = wall_time(10, || {
            cuda.context().bind_to_thread()?;
            // SAFETY: a synchronous copy of `bytes` bytes from `dev` into an owned slice.
            Ok(unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, addr) }?)
        })?;
        result(&format!("raw_d2h_pageable_{label}"), gbs(t), "GB/s");
    }
    Ok(())
}

/// `strided` mode: `contiguous()` of 1 GiB views (2-D transpose, batched transpose, permute with
/// a contiguous inner dimension) in TB/s of bytes read and written, against a dense copy; and
/// reading 256 MiB back into a fresh vector each time, as `to_vec` does.
fn strided(b: &Dyn, cuda: &CudaBackend) -> Res<()> {
    let cases: [(&str, DType, &[usize], &[usize]); 5] = [
        ("copy_dense_f32_1GiB", DType::F32, &[1 << 28], &[0]),
        ("transpose_2d_f32_1GiB", DType::F32, &[16384, 16384], &[1, 0]),
        ("transpose_2d_bf16_1GiB", DType::BF16, &[16384, 32768], &[1, 0]),
        ("permute_021_f32_1GiB", DType::F32, &[64, 2048, 2048], &[0, 2, 1]),
        ("permute_0213_f32_1GiB", DType::F32, &[32, 1024, 128, 64], &[0, 2, 1, 3]),
    ];
    for (case, dtype, shape, perm) in cases {
        let numel: usize = shape.iter().product();
        let bytes = numel * dtype.size_in_bytes();
        let src = DeviceBuffer::new(b, bytes)?;
        let out = DeviceBuffer::new(b, bytes)?;
        let view = Layout::contiguous(shape)?.permute(perm)?;
        let out_shape = view.shape().to_vec();
        let kernel = Kernel::Copy {
            input: src.arg(view, dtype),
            out: tensor(&out, &out_shape, dtype),
        };
        let t = device_time(b, 3, 20, || kernel.run(&[&src, &out]).expect("copy"))?;
        result(case, 2.0 * bytes as f64 / t / 1e12, "TB/s");
    }
    let bytes = 256 * MIB;
    let dev = DeviceBuffer::new(b, bytes)?;
    let before = cuda.transfer_stats();
    let t = wall_time(10, || {
        let mut host = vec![0u8; bytes];
        dev.read(0, &mut host)?;
        std::hint::black_box(&host);
        Ok(())
    })?;
    result("d2h_fresh_vec_256MiB", bytes as f64 / t / 1e9, "GB/s");
    let after = cuda.transfer_stats();
    eprintln!("transfer stats over the fresh-vector reads: before {before:?} after {after:?}");
    Ok(())
}

/// One kernel from every module; returns the wall time of each first call (launch + sync).
fn first_calls(b: &Dyn) -> Res<Vec<(SourceFile, Duration)>> {
    let n = 256;
    let x = alloc_random(b, &[n], DType::F32, 10)?;
    b.synchronize()?;
    let out = DeviceBuffer::new(b, n * 8)?;
    let idx = DeviceBuffer::new(b, 8)?;
    idx.write(0, &0i64.to_le_bytes())?;
    let t = |a: &DeviceBuffer, dtype| tensor(a, &[n], dtype);
    let kernels = [
        (
            SourceFile::Unary,
            Kernel::Unary {
                op: cartage_core::UnaryOp::Exp,
                input: t(&x, DType::F32),
                out: t(&out, DType::F32),
            },
        ),
        (
            SourceFile::Binary,
            Kernel::Binary {
                op: BinaryOp::Mul,
                lhs: t(&x, DType::F32),
                rhs: t(&x, DType::F32),
                out: t(&out, DType::F32),
            },
        ),
        (
            SourceFile::Compare,
            Kernel::Compare {
                op: cartage_core::CompareOp::Gt,
                lhs: t(&x, DType::F32),
                rhs: t(&x, DType::F32),
                out: t(&out, DType::Bool),
            },
        ),
        (
            SourceFile::Construct,
            Kernel::Arange {
                out: t(&out, DType::F32),
                start: 0.0,
                step: 1.0,
            },
        ),
        (
            SourceFile::Cast,
            Kernel::Cast {
                input: t(&x, DType::F32),
                out: t(&out, DType::F64),
            },
        ),
        (
            SourceFile::Reduce,
            Kernel::Reduce {
                op: ReduceOp::Sum,
                input: t(&x, DType::F32),
                dims: [0].into_iter().collect(),
                out: tensor(&out, &[1], DType::F32),
            },
        ),
        (
            SourceFile::Extreme,
            Kernel::Reduce {
                op: ReduceOp::Max,
                input: t(&x, DType::F32),
                dims: [0].into_iter().collect(),
                out: tensor(&out, &[1], DType::F32),
            },
        ),
        (
            SourceFile::Softmax,
            Kernel::Softmax {
                input: t(&x, DType::F32),
                dim: 0,
                log: false,
                out: t(&out, DType::F32),
            },
        ),
        (
            SourceFile::Index,
            Kernel::IndexSelect {
                input: t(&x, DType::F32),
                index: tensor(&idx, &[1], DType::I64),
                dim: 0,
                out: tensor(&out, &[1], DType::F32),
            },
        ),
    ];
    let mut times = Vec::new();
    for (file, k) in &kernels {
        let started = Instant::now();
        k.run(&[&x, &out, &idx])?;
        b.synchronize()?;
        times.push((*file, started.elapsed()));
    }
    Ok(times)
}

fn cold_child() -> Res<()> {
    let started = Instant::now();
    let b = cartage_cuda::open_cuda(0)?;
    result("cold_open_second_process", started.elapsed().as_secs_f64() * 1e3, "ms");
    let times = first_calls(&(b.clone() as Dyn))?;
    let stats = b.modules().stats();
    result("cold_second_process_compiled_modules", stats.compiled as f64, "modules");
    result("cold_second_process_disk_hits", stats.disk_hits as f64, "modules");
    let worst = times.iter().map(|(_, d)| d.as_secs_f64()).fold(0.0, f64::max);
    result("first_call_cached_kernel_max", worst * 1e3, "ms");
    for (file, d) in times {
        result(
            &format!("first_call_cached_{}", file.file_name()),
            d.as_secs_f64() * 1e3,
            "ms",
        );
    }
    Ok(())
}

fn cold_start() -> Res<Arc<CudaBackend>> {
    // A fresh private folder (created by `tempfile`, removed when `scratch` drops).
    let scratch = tempfile::Builder::new().prefix("cartage-bench-cache-").tempdir()?;
    let dir = scratch.path().to_path_buf();
    // SAFETY: set before any other thread exists (the first thing main does besides parsing).
    unsafe { std::env::set_var("XDG_CACHE_HOME", &dir) };
    let started = Instant::now();
    let b = cartage_cuda::open_cuda(0)?;
    result("cold_open_first_process", started.elapsed().as_secs_f64() * 1e3, "ms");
    let times = first_calls(&(b.clone() as Dyn))?;
    let compile: f64 = b.modules().stats().compile_time.as_secs_f64();
    result("cold_compile_all_modules", compile, "s");
    let worst = times.iter().map(|(_, d)| d.as_secs_f64()).fold(0.0, f64::max);
    result("first_call_compiling_max", worst * 1e3, "ms");
    let output = Command::new(std::env::current_exe()?)
        .arg("--cold-child")
        .env("XDG_CACHE_HOME", &dir)
        .output()?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    drop(scratch);
    Ok(b)
}

/// `attention` mode: the fused flash-attention kernel, B·H = 128 and L = S = 1024 (bf16 and f16,
/// head dims 64 and 128, causal and not), in TFLOP/s of `4·B·L·S·E` (half that when causal, the
/// usual count: the masked half is skipped).
fn attention(b: &Dyn) -> Res<()> {
    let (batch, seq) = (128usize, 1024usize);
    for dtype in [DType::BF16, DType::F16] {
        for head in [64usize, 128] {
            let shape = [batch, seq, head];
            let q = alloc_random(b, &shape, dtype, 31)?;
            let k = alloc_random(b, &shape, dtype, 32)?;
            let v = alloc_random(b, &shape, dtype, 33)?;
            let out = DeviceBuffer::new(b, batch * seq * head * dtype.size_in_bytes())?;
            for causal in [false, true] {
                let kernel = Kernel::Attention {
                    q: tensor(&q, &shape, dtype),
                    k: tensor(&k, &shape, dtype),
                    v: tensor(&v, &shape, dtype),
                    scale: 1.0 / (head as f64).sqrt(),
                    causal,
                    out: tensor(&out, &shape, dtype),
                };
                let t = device_time(b, 5, 30, || kernel.run(&[&q, &k, &v, &out]).expect("attention"))?;
                let mut flops = 4.0 * (batch * seq * seq * head) as f64;
                if causal {
                    flops /= 2.0;
                }
                let case = format!("attention_{dtype}_d{head}_{}", if causal { "causal" } else { "full" });
                result(&case, flops / t / 1e12, "TFLOP/s");
                result(&format!("{case}_time"), t * 1e3, "ms");
            }
        }
    }
    Ok(())
}

/// `conv` mode: see the module docs. Each row is the median of 50 event-timed launches.
fn conv(b: &Dyn) -> Res<()> {
    let (n, c, o, hw, k) = (32usize, 64usize, 64usize, 56usize, 3usize);
    let flops = 2.0 * (n * o * hw * hw * c * k * k) as f64;
    let cases = [
        ("f32_highest", DType::F32, MatmulPrecision::Highest, false),
        ("f32_high", DType::F32, MatmulPrecision::High, false),
        ("bf16", DType::BF16, MatmulPrecision::Highest, false),
        ("f16", DType::F16, MatmulPrecision::Highest, false),
        ("bf16_nhwc_input", DType::BF16, MatmulPrecision::Highest, true),
    ];
    for (name, dtype, precision, nhwc) in cases {
        if !b.capabilities().supports(cartage_core::Op::Conv2d, dtype) {
            eprintln!("conv2d {dtype} is not listed by this backend (is cuDNN on the loader's path?)");
            continue;
        }
        b.set_matmul_precision(precision)?;
        let x = alloc_random(b, &[n, c, hw, hw], dtype, 41)?;
        let w = alloc_random(b, &[o, c, k, k], dtype, 42)?;
        let out = DeviceBuffer::new(b, n * o * hw * hw * dtype.size_in_bytes())?;
        let input = if nhwc {
            // The same buffer seen as [N, C, H, W] over channels-last memory [N, H, W, C].
            x.arg(Layout::contiguous(&[n, hw, hw, c])?.permute(&[0, 3, 1, 2])?, dtype)
        } else {
            tensor(&x, &[n, c, hw, hw], dtype)
        };
        let kernel = Kernel::Conv2d {
            input,
            weight: tensor(&w, &[o, c, k, k], dtype),
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            out: tensor(&out, &[n, o, hw, hw], dtype),
        };
        let t = device_time(b, 10, 50, || kernel.run(&[&x, &w, &out]).expect("conv2d"))?;
        result(&format!("conv2d_resnet3x3_{name}"), flops / t / 1e12, "TFLOP/s");
        result(&format!("conv2d_resnet3x3_{name}_time"), t * 1e3, "ms");
    }
    b.set_matmul_precision(MatmulPrecision::Highest)?;
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--cold-child") {
        return cold_child();
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "attention") {
        let b = cartage_cuda::open_cuda(0)?;
        eprintln!("cuda_bench attention on {}", b.info());
        let d: Dyn = b.clone();
        return attention(&d);
    }
    if args.iter().any(|a| a == "conv") {
        let b = cartage_cuda::open_cuda(0)?;
        eprintln!("cuda_bench conv on {}", b.info());
        let d: Dyn = b.clone();
        return conv(&d);
    }
    if args.iter().any(|a| a == "strided") {
        let b = cartage_cuda::open_cuda(0)?;
        eprintln!("cuda_bench strided on {}", b.info());
        let d: Dyn = b.clone();
        return strided(&d, &b);
    }
    if args.iter().any(|a| a == "ops") {
        let b = cartage_cuda::open_cuda(0)?;
        eprintln!("cuda_bench ops on {}", b.info());
        let d: Dyn = b.clone();
        return ops(&d);
    }
    let b = cold_start()?;
    eprintln!("cuda_bench on {}", b.info());
    let d: Dyn = b.clone();
    tiny_ops(&d, &b)?;
    matmul(&d, quick)?;
    elementwise(&d, quick)?;
    reductions(&d, quick)?;
    copies(&d, &b, quick)?;
    Ok(())
}
