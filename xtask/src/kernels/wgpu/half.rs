//! The `half` mode: f16/bf16 add and copy on every load/store path, f16/bf16/f32 matmul (f16 on
//! cooperative matrices where the adapter has them, and tiled), and 256 MiB host↔device copies
//! from pinned and pageable memory.

use std::time::{Duration, Instant};

use anyhow::Result;
use cartage_core::{Backend, BinaryOp, DType, DeviceBuffer, Kernel};

use super::{Bench, median};

/// Run the half-precision rows and the transfers (512³ matmuls with `quick`, else 4096³).
pub(super) fn run(bench: &mut Bench, quick: bool) -> Result<()> {
    bench.half_elementwise()?;
    bench.half_matmul(if quick { 512 } else { 4096 })?;
    bench.transfers()
}

impl Bench {
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
}
