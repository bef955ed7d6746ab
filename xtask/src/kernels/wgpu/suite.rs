//! The `suite` mode: f32 add and sum (GB/s), matmul at the default tiling and per tiling while
//! tuning (TFLOP/s), chains of 1000 small adds between two syncs for several submit batch sizes
//! (µs per op), and the 4-byte read-back round trip (µs); then every row as a JSON line and the
//! dispatch and pipeline counters.

use std::time::{Duration, Instant};

use anyhow::Result;
use cartage_core::{Backend, BinaryOp, Kernel, ReduceOp};
use cartage_wgpu::MatmulTiling;

use super::{Bench, median};

/// Run the suite (smaller sizes with `quick`).
pub(super) fn run(bench: &mut Bench, quick: bool) -> Result<()> {
    let reps = bench.reps;
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

impl Bench {
    /// f32 add of `mib` MiB per operand, four and one vec4 per invocation, in GB/s.
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

    /// f32 sum of `mib` MiB, in GB/s read.
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

    /// An f32 `size`³ matmul in TFLOP/s: through `Kernel::Matmul`, or at one `tiling`.
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

    /// One chain of 1000 adds: total time per op, and the host's recording time per op.
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
