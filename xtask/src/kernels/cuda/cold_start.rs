//! The suite's cold start: opening `cuda:0` and the first call of one kernel from every module in
//! an empty kernel cache, then the same in a second process (`kernels cuda --cold-child`) that
//! finds them in the on-disk cache the first one filled.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cartage_core::{BinaryOp, DType, DeviceBuffer, Kernel, ReduceOp};
use cartage_cuda::CudaBackend;
use cartage_cuda::modules::SourceFile;

use super::{Dyn, alloc_random, result, tensor};

/// One kernel from every module; returns the wall time of each first call (launch + sync).
fn first_calls(b: &Dyn) -> Result<Vec<(SourceFile, Duration)>> {
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
                causal: false,
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

/// The second process: open `cuda:0` and run every first call again, reporting how many modules
/// came from the on-disk cache rather than NVRTC.
pub(super) fn cold_child() -> Result<()> {
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

/// The first process, in a fresh kernel cache: open `cuda:0`, compile and run every first call,
/// then start the second process on the same cache. Returns the opened backend.
pub(super) fn cold_start() -> Result<Arc<CudaBackend>> {
    // A fresh private folder (created by `tempfile`, removed when `scratch` drops).
    let scratch = tempfile::Builder::new().prefix("cartage-bench-cache-").tempdir()?;
    let dir = scratch.path().to_path_buf();
    // SAFETY: set before any other thread exists: xtask starts none before the suite, and the
    // CUDA backend is opened below, after this.
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
        .args(super::super::CUDA_COLD_CHILD_ARGS)
        .env("XDG_CACHE_HOME", &dir)
        .output()?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    drop(scratch);
    Ok(b)
}
