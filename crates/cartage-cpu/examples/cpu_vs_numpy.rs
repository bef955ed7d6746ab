//! Times the cpu backend's kernels for the comparison with numpy made by `cpu_vs_numpy.py`
//! (beside this file): matmul f32 n = 32…2048, add f32 of 4 and 16M elements, sum f32 of 16M
//! elements, a batch of 1000 8×8 matmuls, exp f32 of 16M elements, and softmax and layer norm
//! (with weight and bias) over 4096 rows of 4096 f32. Each case is launched through `Backend::launch`
//! on preallocated buffers; the figure is the median of many repetitions after a warm-up.
//!
//! ```text
//! cargo build --release -p cartage-cpu --example cpu_vs_numpy
//! python3 crates/cartage-cpu/examples/cpu_vs_numpy.py target/release/examples/cpu_vs_numpy
//! ```
//!
//! Prints one JSON object per line: `{"case": .., "seconds": .., "work": .., "unit": ..}`; an
//! argument keeps only the cases whose name starts with it, and `BENCH_MS` sets the time spent
//! on each case (default 600 ms).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cartage_core::{Backend, BinaryOp, DType, Dims, Kernel, Layout, NormKind, ReduceOp, TensorArg, UnaryOp};

fn tensor(backend: &Arc<dyn Backend>, shape: &[usize], seed: u32) -> TensorArg {
    let numel: usize = shape.iter().product();
    let data: Vec<f32> = (0..numel)
        .map(|i| ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0 - 0.5)
        .collect();
    let buffer = backend
        .alloc(numel * 4, std::panic::Location::caller())
        .expect("allocation")
        .slice();
    // SAFETY: `buffer` is a block of this backend that is never freed (the example leaks it).
    unsafe { backend.write(buffer, bytemuck::cast_slice(&data)) }.expect("upload");
    TensorArg {
        buffer,
        layout: Layout::contiguous(shape).expect("layout"),
        dtype: DType::F32,
    }
}

/// Median seconds of one call of `run`, which performs `inner` calls per sample.
fn median_seconds(inner: usize, budget: Duration, mut run: impl FnMut()) -> f64 {
    for _ in 0..3 {
        run();
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 11 || (start.elapsed() < budget && samples.len() < 5000) {
        let t = Instant::now();
        run();
        samples.push(t.elapsed().as_secs_f64() / inner as f64);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn report(case: &str, seconds: f64, work: f64, unit: &str) {
    println!(r#"{{"case": "{case}", "seconds": {seconds:e}, "work": {work}, "unit": "{unit}"}}"#);
}

fn main() {
    let backend = cartage_cpu::open(0).expect("cpu backend");
    let budget = Duration::from_millis(
        std::env::var("BENCH_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    // SAFETY: every operand comes from `tensor`, whose blocks are never freed.
    let launch = |kernel: &Kernel| unsafe { backend.launch(kernel) }.expect("launch");
    let only: Option<String> = std::env::args().nth(1);
    let wanted = |case: &str| only.as_deref().is_none_or(|o| case.starts_with(o));

    for n in [32usize, 64, 128, 256, 512, 1024, 2048] {
        let case = format!("matmul_f32_{n}");
        if !wanted(&case) {
            continue;
        }
        let kernel = Kernel::Matmul {
            lhs: tensor(&backend, &[1, n, n], 1),
            rhs: tensor(&backend, &[1, n, n], 2),
            out: tensor(&backend, &[1, n, n], 3),
        };
        let inner = (1 << 22) / (n * n * n).min(1 << 22);
        let s = median_seconds(inner, budget, || (0..inner).for_each(|_| launch(&kernel)));
        report(&case, s, 2.0 * (n * n * n) as f64, "flop");
    }
    for n in [4usize, 1 << 24] {
        let case = format!("add_f32_{n}");
        if !wanted(&case) {
            continue;
        }
        let kernel = Kernel::Binary {
            op: BinaryOp::Add,
            lhs: tensor(&backend, &[n], 1),
            rhs: tensor(&backend, &[n], 2),
            out: tensor(&backend, &[n], 3),
        };
        let inner = ((1 << 16) / n).max(1);
        let s = median_seconds(inner, budget, || (0..inner).for_each(|_| launch(&kernel)));
        report(&case, s, (3 * 4 * n) as f64, "byte");
    }
    let n = 1usize << 24;
    if wanted(&format!("sum_f32_{n}")) {
        let kernel = Kernel::Reduce {
            op: ReduceOp::Sum,
            input: tensor(&backend, &[n], 1),
            dims: Dims::from_slice(&[0]),
            out: tensor(&backend, &[1], 2),
        };
        let s = median_seconds(1, budget, || launch(&kernel));
        report(&format!("sum_f32_{n}"), s, (4 * n) as f64, "byte");
    }
    if wanted(&format!("exp_f32_{n}")) {
        let kernel = Kernel::Unary {
            op: UnaryOp::Exp,
            input: tensor(&backend, &[n], 1),
            out: tensor(&backend, &[n], 2),
        };
        let s = median_seconds(1, budget, || launch(&kernel));
        report(&format!("exp_f32_{n}"), s, (8 * n) as f64, "byte");
    }
    let (rows, cols) = (4096usize, 4096usize);
    if wanted("softmax_f32_4096x4096") {
        let kernel = Kernel::Softmax {
            input: tensor(&backend, &[rows, cols], 1),
            dim: 1,
            log: false,
            causal: false,
            out: tensor(&backend, &[rows, cols], 2),
        };
        let s = median_seconds(1, budget, || launch(&kernel));
        report("softmax_f32_4096x4096", s, (8 * rows * cols) as f64, "byte");
    }
    if wanted("layer_norm_f32_4096x4096") {
        let kernel = Kernel::Norm {
            kind: NormKind::Layer,
            input: tensor(&backend, &[rows, cols], 1),
            weight: Some(tensor(&backend, &[cols], 2)),
            bias: Some(tensor(&backend, &[cols], 3)),
            eps: 1e-5,
            out: tensor(&backend, &[rows, cols], 4),
        };
        let s = median_seconds(1, budget, || launch(&kernel));
        report("layer_norm_f32_4096x4096", s, (8 * rows * cols) as f64, "byte");
    }
    if wanted("bmm_f32_1000x8x8") {
        let kernel = Kernel::Matmul {
            lhs: tensor(&backend, &[1000, 8, 8], 1),
            rhs: tensor(&backend, &[1000, 8, 8], 2),
            out: tensor(&backend, &[1000, 8, 8], 3),
        };
        let s = median_seconds(1, budget, || launch(&kernel));
        report("bmm_f32_1000x8x8", s, 2.0 * 1000.0 * 512.0, "flop");
    }
}
