//! Benchmarks of the wgpu backend on `wgpu:0`: element-wise add (GB/s), sum (GB/s), matmul
//! (TFLOP/s, per tiling after tuning), a chain of small ops between two syncs (µs per op, end to
//! end on the host clock), and the read-back round trip (µs). `--half` runs instead the rows of
//! half precision and transfers: f16/bf16 add and copy (f16 native and packed, one or four
//! groups per invocation), f16/bf16/f32 matmul (f16 on cooperative matrices and tiled), and
//! 256 MiB copies host↔device from pinned and pageable memory (GB/s). `matmul-sweep` times
//! every matmul variant (`WgpuBackend::matmul_variant_names`) for f16, f32 and bf16 at n = 1024,
//! 2048 and 4096 and on a [4096, 512] × [512, 4096] product, checks each against an f64 product
//! on the host on sampled rows, and prints one JSON line per variant and problem.
//!
//! Device-side figures use timestamp queries where the adapter has them (else the host clock
//! after a synchronisation); each row is the median of `--reps` runs after warm-up.
//! Usage: `wgpu_bench [--quick] [--half] [--reps N]`, or
//! `wgpu_bench matmul-sweep [--reps N] [--dtype f16|f32|bf16] [--variant NAME]`. Rows are printed
//! as a table and as JSON lines.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cartage_core::{Backend, BinaryOp, DType, DeviceBuffer, Distribution, Kernel, Layout, ReduceOp, TensorArg};
use cartage_wgpu::{MatmulTiling, WgpuBackend};

struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    median: Duration,
}

struct Bench {
    backend: std::sync::Arc<WgpuBackend>,
    /// The same backend as a trait object, which device buffers hold.
    device: std::sync::Arc<dyn Backend>,
    reps: usize,
    device_name: String,
    rows: Vec<Row>,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

impl Bench {
    fn tensor(&self, shape: &[usize]) -> Result<(DeviceBuffer, TensorArg)> {
        self.tensor_of(shape, DType::F32)
    }

    fn tensor_of(&self, shape: &[usize], dtype: DType) -> Result<(DeviceBuffer, TensorArg)> {
        let layout = Layout::contiguous(shape)?;
        let buffer = DeviceBuffer::new(&self.device, layout.numel() * dtype.size_in_bytes())?;
        let arg = buffer.arg(layout, dtype);
        Kernel::Random {
            out: arg.clone(),
            distribution: Distribution::Uniform { low: -1.0, high: 1.0 },
            seed: 7,
            offset: 0,
        }
        .run(&[&buffer])?;
        Ok((buffer, arg))
    }

    /// Device time of `f` (median of `reps` after 3 warm-ups).
    fn time(&self, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
        for _ in 0..3 {
            f()?;
        }
        self.backend.synchronize()?;
        let mut times = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let start = self.backend.record_event()?;
            f()?;
            let end = self.backend.record_event()?;
            times.push(self.backend.elapsed(&start, &end)?);
        }
        Ok(median(times))
    }

    fn push(&mut self, op: &str, value: f64, unit: &'static str, median: Duration) {
        let name = format!("wgpu/{}/{op}", self.device_name);
        println!("{name:<60} {value:>10.3} {unit:<8} (median {median:?})");
        self.rows.push(Row {
            name,
            value,
            unit,
            median,
        });
    }

    fn add(&mut self, mib: usize) -> Result<()> {
        let n = mib * (1 << 20) / 4;
        let (ab, a) = self.tensor(&[n])?;
        let (bb, b) = self.tensor(&[n])?;
        let (cb, c) = self.tensor(&[n])?;
        let kernel = Kernel::Binary {
            op: BinaryOp::Add,
            lhs: a,
            rhs: b,
            out: c,
        };
        for quads in [4, 1] {
            self.backend.set_vec4_per_invocation(quads);
            let t = self.time(|| Ok(kernel.run(&[&ab, &bb, &cb])?))?;
            let gbs = 3.0 * (n * 4) as f64 / t.as_secs_f64() / 1e9;
            let suffix = if quads == 4 {
                String::new()
            } else {
                format!("[vec4x{quads}]")
            };
            self.push(&format!("add_f32_{mib}MiB{suffix}"), gbs, "GB/s", t);
        }
        self.backend.set_vec4_per_invocation(4);
        Ok(())
    }

    fn sum(&mut self, mib: usize) -> Result<()> {
        let n = mib * (1 << 20) / 4;
        let (ab, a) = self.tensor(&[n])?;
        let (ob, out) = self.tensor(&[1])?;
        let kernel = Kernel::Reduce {
            op: ReduceOp::Sum,
            input: a,
            dims: [0usize].into_iter().collect(),
            out,
        };
        let t = self.time(|| Ok(kernel.run(&[&ab, &ob])?))?;
        let gbs = (n * 4) as f64 / t.as_secs_f64() / 1e9;
        self.push(&format!("sum_f32_{mib}MiB"), gbs, "GB/s", t);
        Ok(())
    }

    fn matmul(&mut self, size: usize, tiling: Option<MatmulTiling>) -> Result<()> {
        let (ab, a) = self.tensor(&[1, size, size])?;
        let (bb, b) = self.tensor(&[1, size, size])?;
        let (cb, c) = self.tensor(&[1, size, size])?;
        let t = match tiling {
            // SAFETY: the operands are views of `ab`, `bb` and `cb`, which outlive the timing.
            Some(tiling) => self.time(|| Ok(unsafe { self.backend.matmul_with_tiling(&a, &b, &c, tiling) }?))?,
            None => {
                let kernel = Kernel::Matmul {
                    lhs: a.clone(),
                    rhs: b.clone(),
                    out: c.clone(),
                };
                self.time(|| Ok(kernel.run(&[&ab, &bb, &cb])?))?
            }
        };
        let tflops = 2.0 * (size as f64).powi(3) / t.as_secs_f64() / 1e12;
        let name = match tiling {
            Some(tiling) => format!("matmul_f32_{size}[{tiling}]"),
            None => format!("matmul_f32_{size}"),
        };
        self.push(&name, tflops, "TFLOP/s", t);
        Ok(())
    }

    /// Add and copy of 16 Mi f16/bf16 elements: every load/store path, one or four groups of four
    /// per invocation.
    fn half_elementwise(&mut self) -> Result<()> {
        let n = 16 << 20;
        for dtype in [DType::BF16, DType::F16] {
            let (ab, a) = self.tensor_of(&[n], dtype)?;
            let (bb, b) = self.tensor_of(&[n], dtype)?;
            let (cb, c) = self.tensor_of(&[n], dtype)?;
            let add = Kernel::Binary {
                op: BinaryOp::Add,
                lhs: a.clone(),
                rhs: b,
                out: c.clone(),
            };
            let copy = Kernel::Copy { input: a, out: c };
            let natives: &[bool] = if dtype == DType::F16 { &[true, false] } else { &[false] };
            for &native in natives {
                let native = self.backend.set_native_f16(native);
                for quads in [4, 1] {
                    self.backend.set_vec4_per_invocation(quads);
                    let path = match (dtype, native) {
                        (DType::F16, true) => "native",
                        (DType::F16, false) => "packed",
                        _ => "packed",
                    };
                    let t = self.time(|| Ok(add.run(&[&ab, &bb, &cb])?))?;
                    let gbs = 3.0 * (n * 2) as f64 / t.as_secs_f64() / 1e9;
                    self.push(&format!("add_{dtype}_16Mi[{path},x{quads}]"), gbs, "GB/s", t);
                    let t = self.time(|| Ok(copy.run(&[&ab, &cb])?))?;
                    let gbs = 2.0 * (n * 2) as f64 / t.as_secs_f64() / 1e9;
                    self.push(&format!("copy_{dtype}_16Mi[{path},x{quads}]"), gbs, "GB/s", t);
                }
            }
        }
        self.backend.set_native_f16(true);
        self.backend.set_vec4_per_invocation(4);
        Ok(())
    }

    /// `size`³ matmuls in f16 (cooperative matrices where the adapter has them, and tiled), bf16
    /// and f32.
    fn half_matmul(&mut self, size: usize) -> Result<()> {
        for (dtype, coop) in [
            (DType::F16, true),
            (DType::F16, false),
            (DType::BF16, false),
            (DType::F32, false),
        ] {
            let on = self.backend.set_cooperative_matrices(coop);
            if coop && !on {
                println!("# no cooperative matrices on this adapter: f16 runs tiled only");
                continue;
            }
            let (ab, a) = self.tensor_of(&[1, size, size], dtype)?;
            let (bb, b) = self.tensor_of(&[1, size, size], dtype)?;
            let (cb, c) = self.tensor_of(&[1, size, size], dtype)?;
            let kernel = Kernel::Matmul { lhs: a, rhs: b, out: c };
            let t = self.time(|| Ok(kernel.run(&[&ab, &bb, &cb])?))?;
            let tflops = 2.0 * (size as f64).powi(3) / t.as_secs_f64() / 1e12;
            let path = match (dtype, on) {
                (DType::F16, true) => "[cooperative]",
                (DType::F16, false) => "[tiled]",
                _ => "",
            };
            self.push(&format!("matmul_{dtype}_{size}{path}"), tflops, "TFLOP/s", t);
        }
        self.backend.set_cooperative_matrices(true);
        Ok(())
    }

    /// 256 MiB host→device and device→host, from and into pinned (mapped) and pageable memory,
    /// host clock end to end (the copy is complete when the call or its handle's wait returns).
    fn transfers(&mut self) -> Result<()> {
        let bytes = 256 << 20;
        let device = DeviceBuffer::new(&self.device, bytes)?;
        let mut pinned = self.backend.alloc_pinned(bytes)?;
        pinned.as_mut_slice().fill(7);
        let mut pageable = vec![5u8; bytes];
        let mut rows: Vec<(&str, Duration)> = Vec::new();
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
            for _ in 0..3 {
                f()?;
            }
            let mut times = Vec::new();
            for _ in 0..self.reps.min(10) {
                let start = Instant::now();
                f()?;
                times.push(start.elapsed());
            }
            Ok(median(times))
        };
        rows.push((
            "h2d_pinned_256MiB",
            time(&mut || Ok(device.write_async(0, &pinned, bytes)?.wait()?))?,
        ));
        rows.push((
            "d2h_pinned_256MiB",
            time(&mut || Ok(device.read_async(0, &mut pinned, bytes)?.wait()?))?,
        ));
        rows.push((
            "h2d_pageable_256MiB",
            time(&mut || {
                device.write(0, &pageable)?;
                Ok(self.backend.synchronize()?)
            })?,
        ));
        rows.push(("d2h_pageable_256MiB", time(&mut || Ok(device.read(0, &mut pageable)?))?));
        for (name, t) in rows {
            self.push(name, bytes as f64 / t.as_secs_f64() / 1e9, "GB/s", t);
        }
        Ok(())
    }

    /// 1000 small adds between two syncs, host clock end to end, for several batch sizes.
    fn chains(&mut self) -> Result<()> {
        for every in [1024, 64, 256] {
            self.backend.set_submit_every(every);
            self.chain(if every == 256 {
                String::new()
            } else {
                format!("[submit_every={every}]")
            })?;
        }
        Ok(())
    }

    fn chain(&mut self, suffix: String) -> Result<()> {
        let (ab, a) = self.tensor(&[1024])?;
        let (bb, b) = self.tensor(&[1024])?;
        let ops = 1000;
        let run = || -> Result<(Duration, Duration)> {
            self.backend.synchronize()?;
            let start = Instant::now();
            for _ in 0..ops {
                Kernel::Binary {
                    op: BinaryOp::Add,
                    lhs: a.clone(),
                    rhs: b.clone(),
                    out: a.clone(),
                }
                .run(&[&ab, &bb])?;
            }
            let recorded = start.elapsed();
            self.backend.synchronize()?;
            Ok((start.elapsed(), recorded))
        };
        for _ in 0..3 {
            run()?;
        }
        let runs = (0..self.reps).map(|_| run()).collect::<Result<Vec<_>>>()?;
        let total = median(runs.iter().map(|r| r.0).collect());
        let recording = median(runs.iter().map(|r| r.1).collect());
        self.push(
            &format!("chain_1000_add_f32_1024{suffix}"),
            total.as_secs_f64() * 1e6 / ops as f64,
            "us/op",
            total,
        );
        self.push(
            &format!("chain_1000_add_f32_1024_host_recording{suffix}"),
            recording.as_secs_f64() * 1e6 / ops as f64,
            "us/op",
            recording,
        );
        Ok(())
    }

    /// Read back 4 bytes written by a kernel: submit + map + copy, host clock.
    fn readback(&mut self) -> Result<()> {
        let (ab, a) = self.tensor(&[1])?;
        let run = || -> Result<Duration> {
            Kernel::Fill {
                out: a.clone(),
                value: cartage_core::Scalar::Float(1.0),
            }
            .run(&[&ab])?;
            let start = Instant::now();
            let mut bytes = [0u8; 4];
            ab.read(0, &mut bytes)?;
            Ok(start.elapsed())
        };
        for _ in 0..5 {
            run()?;
        }
        let times = (0..self.reps.max(50)).map(|_| run()).collect::<Result<Vec<_>>>()?;
        let t = median(times);
        self.push("readback_f32_1", t.as_secs_f64() * 1e6, "us", t);
        Ok(())
    }
}

/// A host matrix of `rows` × `cols` values in [-1, 1), rounded to `dtype`: the values and their
/// little-endian bytes in `dtype`.
fn host_matrix(rows: usize, cols: usize, dtype: DType, seed: u64) -> (Vec<f64>, Vec<u8>) {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut values = Vec::with_capacity(rows * cols);
    let mut bytes = Vec::with_capacity(rows * cols * dtype.size_in_bytes());
    for _ in 0..rows * cols {
        // xorshift64*: plenty for test data.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let x = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        let v = match dtype {
            DType::F16 => {
                let h = half::f16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                h.to_f64()
            }
            DType::BF16 => {
                let h = half::bf16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                h.to_f64()
            }
            _ => {
                let f = x as f32;
                bytes.extend_from_slice(&f.to_le_bytes());
                f64::from(f)
            }
        };
        values.push(v);
    }
    (values, bytes)
}

/// The elements of `bytes` (in `dtype`) as f64.
fn host_values(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F16 => bytes
            .chunks(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        _ => bytes
            .chunks(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    }
}

/// `matmul-sweep`: every variant for every dtype and problem, one JSON line each.
fn matmul_sweep(bench: &Bench, args: &[String]) -> Result<()> {
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let only_dtype = value_of("--dtype");
    let only_variant = value_of("--variant");
    // (m, k, n): squares, and a long-sequence projection with a short K.
    let problems = [
        (1024, 1024, 1024),
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (4096, 512, 4096),
    ];
    let started = Instant::now();
    println!("# f16 path: {}", bench.backend.f16_matmul_path());
    for dtype in [DType::F16, DType::F32, DType::BF16] {
        if only_dtype.as_ref().is_some_and(|d| *d != dtype.to_string()) {
            continue;
        }
        for (m, k, n) in problems {
            let (av, ab) = host_matrix(m, k, dtype, 1);
            let (bv, bb) = host_matrix(k, n, dtype, 2);
            let size = dtype.size_in_bytes();
            let a_buf = DeviceBuffer::new(&bench.device, ab.len())?;
            let b_buf = DeviceBuffer::new(&bench.device, bb.len())?;
            let c_buf = DeviceBuffer::new(&bench.device, m * n * size)?;
            a_buf.write(0, &ab)?;
            b_buf.write(0, &bb)?;
            let a = a_buf.arg(Layout::contiguous(&[1, m, k])?, dtype);
            let b = b_buf.arg(Layout::contiguous(&[1, k, n])?, dtype);
            let c = c_buf.arg(Layout::contiguous(&[1, m, n])?, dtype);
            // Sampled rows (whole rows read back) and columns of C.
            let rows: Vec<usize> = (0..8).map(|r| (r * m / 8 + r * 37) % m).collect();
            let cols: Vec<usize> = (0..64).map(|q| (q * n / 64 + q * 11) % n).collect();
            for variant in bench.backend.matmul_variant_names(dtype) {
                if only_variant.as_ref().is_some_and(|v| *v != variant) {
                    continue;
                }
                let mut ran = String::new();
                let t = bench.time(|| {
                    // SAFETY: the operands are views of `a_buf`, `b_buf` and `c_buf`, which
                    // outlive the timing and the read-back below.
                    ran = unsafe { bench.backend.matmul_with_variant(&a, &b, &c, &variant) }?;
                    Ok(())
                });
                let t = match t {
                    Ok(t) => t,
                    Err(e) => {
                        let message = e
                            .to_string()
                            .replace('\\', "\\\\")
                            .replace('"', "\\\"")
                            .replace('\n', " ");
                        println!(
                            "{{\"sweep\":\"matmul\",\"dtype\":\"{dtype}\",\"m\":{m},\"k\":{k},\"n\":{n},\"variant\":\"{variant}\",\"error\":\"{message}\"}}"
                        );
                        continue;
                    }
                };
                let mut worst = 0.0f64;
                for &i in &rows {
                    let mut bytes = vec![0u8; n * size];
                    c_buf.read(i * n * size, &mut bytes)?;
                    let got = host_values(&bytes, dtype);
                    for &j in &cols {
                        let (mut exact, mut scale) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let term = av[i * k + p] * bv[p * n + j];
                            exact += term;
                            scale += term.abs();
                        }
                        // Relative to the sum of the terms' magnitudes (the scale rounding errors
                        // grow with); NaN for a non-finite result.
                        let err = (got[j] - exact).abs() / scale.max(f64::MIN_POSITIVE);
                        worst = if err.is_nan() || worst.is_nan() {
                            f64::NAN
                        } else {
                            worst.max(err)
                        };
                    }
                }
                let tflops = 2.0 * (m * n * k) as f64 / t.as_secs_f64() / 1e12;
                let worst = if worst.is_finite() {
                    format!("{worst:.3e}")
                } else {
                    "null".into()
                };
                println!(
                    "{{\"sweep\":\"matmul\",\"dtype\":\"{dtype}\",\"m\":{m},\"k\":{k},\"n\":{n},\"variant\":\"{variant}\",\"ran\":\"{ran}\",\"tflops\":{tflops:.3},\"median_ns\":{},\"reps\":{},\"max_rel_err\":{worst}}}",
                    t.as_nanos(),
                    bench.reps
                );
            }
        }
    }
    println!("# matmul sweep done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sweep = args.get(1).is_some_and(|a| a == "matmul-sweep");
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick || sweep { 10 } else { 20 });
    let backend = cartage_wgpu::open_wgpu(0).context("opening wgpu:0")?;
    let info = backend.info();
    let timing = if backend.capabilities().device_timing {
        "timestamp queries"
    } else {
        "host clock after synchronisation"
    };
    println!("# {} — {}; timing: {timing}; median of {reps}", info.device, info.name);
    let device: std::sync::Arc<dyn Backend> = backend.clone();
    let mut bench = Bench {
        backend,
        device,
        reps,
        device_name: info.name.replace(' ', "_"),
        rows: Vec::new(),
    };
    if sweep {
        return matmul_sweep(&bench, &args);
    }
    if args.iter().any(|a| a == "--half") {
        bench.half_elementwise()?;
        bench.half_matmul(if quick { 512 } else { 4096 })?;
        bench.transfers()?;
        return Ok(());
    }
    let (add_sizes, sum_size, mm_sizes, tune_size): (&[usize], usize, &[usize], usize) = if quick {
        (&[16], 16, &[256, 512], 512)
    } else {
        (&[64, 256], 64, &[1024, 2048, 4096], 4096)
    };
    for &mib in add_sizes {
        bench.add(mib)?;
    }
    bench.sum(sum_size)?;
    let default_tiling = bench.backend.matmul_tiling();
    println!("# matmul default large tiling: {default_tiling}; tuning at {tune_size}");
    for (tiling, t) in bench.backend.tune_matmul(tune_size, reps.min(10))? {
        let tflops = 2.0 * (tune_size as f64).powi(3) / t.as_secs_f64() / 1e12;
        bench.push(&format!("tune_matmul_f32_{tune_size}[{tiling}]"), tflops, "TFLOP/s", t);
    }
    println!("# matmul tiling after tuning: {}", bench.backend.matmul_tiling());
    for &size in mm_sizes {
        bench.matmul(size, None)?;
    }
    bench.chains()?;
    bench.readback()?;
    for row in &bench.rows {
        println!(
            "{{\"name\":\"{}\",\"value\":{:.4},\"unit\":\"{}\",\"median_ns\":{}}}",
            row.name,
            row.value,
            row.unit,
            row.median.as_nanos()
        );
    }
    let (dispatches, submits) = bench.backend.dispatch_counters();
    println!(
        "# {dispatches} dispatches in {submits} submits; {} pipelines",
        bench.backend.pipelines_compiled()
    );
    Ok(())
}
