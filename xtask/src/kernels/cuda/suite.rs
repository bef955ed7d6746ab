//! The suite's steady-state rows: tiny-op overhead (through the backend, its parts, and a bare
//! cuLaunchKernel of the same compiled kernel), matmul in f32 (true and TF32), f16 and bf16 with
//! small f32 products per call, add and reductions in GB/s, and host↔device copies from pinned
//! and pageable memory beside raw cuMemcpy.

use std::ffi::c_void;

use anyhow::Result;
use cartage_core::{BinaryOp, DType, DeviceBuffer, Kernel, MatmulPrecision, ReduceOp};
use cartage_cuda::CudaBackend;
use cartage_cuda::modules::{KernelName, SourceFile};

use super::{Dyn, MIB, alloc_random, device_time, host_time, result, tensor, wall_time};

/// Matmul of n × n in TFLOP/s per dtype and precision, and the host time per call of small f32
/// products.
pub(super) fn matmul(b: &Dyn, quick: bool) -> Result<()> {
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

/// The host cost of a 4-element add: through the backend (allocation, launch, free), its parts,
/// and a bare cuLaunchKernel of the same compiled kernel.
pub(super) fn tiny_ops(b: &Dyn, cuda: &CudaBackend) -> Result<()> {
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

/// f32 and bf16 add of 256 MiB (and 1 GiB) per operand, in GB/s of two reads and a write.
pub(super) fn elementwise(b: &Dyn, quick: bool) -> Result<()> {
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

/// Sum, mean and max of 64 MiB (and 1 GiB) of f32, whole and per row of 4096, in GB/s read.
pub(super) fn reductions(b: &Dyn, quick: bool) -> Result<()> {
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

/// Host↔device copies of 16, 64 and 256 MiB from pinned and pageable memory, through the backend
/// and as raw cuMemcpy, in GB/s on the host clock.
pub(super) fn copies(b: &Dyn, cuda: &CudaBackend, quick: bool) -> Result<()> {
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
