//! Measures the candidate matmul crates on this machine (the choice of the cpu backend's matmul is
//! made from these figures): `matrixmultiply` (thread count from `MATMUL_NUM_THREADS`, read once)
//! against `gemm` single-threaded and on rayon, for f32 and f64 square matrices.
//!
//! `cargo run --release -p cartage-cpu --example matmul_crates [f32|f64] [sizes…]`

use std::hint::black_box;
use std::time::{Duration, Instant};

fn median_seconds(mut run: impl FnMut()) -> f64 {
    run();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 7 || (start.elapsed() < Duration::from_millis(400) && samples.len() < 2000) {
        let t = Instant::now();
        run();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

trait Real: Copy + Default + Send + Sync + 'static {
    fn from_index(i: usize) -> Self;
    /// `c = a·b` through matrixmultiply, all row-major.
    fn mm(n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        Self::mm_rect(n, n, a, b, c)
    }
    /// `c = a·b` by the textbook loop (i, p, j), for comparison at tiny sizes.
    fn naive(n: usize, a: &[Self], b: &[Self], c: &mut [Self]);
    /// `c = a·b` for an m×n `a`, n×n `b`.
    fn mm_rect(m: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]);
}

impl Real for f32 {
    fn naive(n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        for i in 0..n {
            let row = &mut c[i * n..(i + 1) * n];
            row.fill(0.0);
            for p in 0..n {
                let x = a[i * n + p];
                for (r, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *r += x * y;
                }
            }
        }
    }
    fn from_index(i: usize) -> Self {
        (i % 17) as f32 * 0.25 - 2.0
    }
    fn mm_rect(m: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        let s = n as isize;
        // SAFETY: a and c hold m*n elements, b n*n, row-major with the strides given.
        unsafe {
            matrixmultiply::sgemm(
                m,
                n,
                n,
                1.0,
                a.as_ptr(),
                s,
                1,
                b.as_ptr(),
                s,
                1,
                0.0,
                c.as_mut_ptr(),
                s,
                1,
            )
        }
    }
}

impl Real for f64 {
    fn naive(n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        for i in 0..n {
            let row = &mut c[i * n..(i + 1) * n];
            row.fill(0.0);
            for p in 0..n {
                let x = a[i * n + p];
                for (r, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *r += x * y;
                }
            }
        }
    }
    fn from_index(i: usize) -> Self {
        (i % 17) as f64 * 0.25 - 2.0
    }
    fn mm_rect(m: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        let s = n as isize;
        // SAFETY: a and c hold m*n elements, b n*n, row-major with the strides given.
        unsafe {
            matrixmultiply::dgemm(
                m,
                n,
                n,
                1.0,
                a.as_ptr(),
                s,
                1,
                b.as_ptr(),
                s,
                1,
                0.0,
                c.as_mut_ptr(),
                s,
                1,
            )
        }
    }
}

fn gemm_crate<T: Real>(n: usize, a: &[T], b: &[T], c: &mut [T], parallelism: gemm::Parallelism) {
    let s = n as isize;
    let (zero, one) = (T::from_index(8), T::from_index(12));
    // SAFETY: every slice holds n*n elements, row-major (column stride 1, row stride n).
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            s,
            false,
            a.as_ptr(),
            1,
            s,
            b.as_ptr(),
            1,
            s,
            zero,
            one,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// Rows of `c` split into one band per rayon thread, each band one single-threaded call.
fn split_rows<T: Real>(n: usize, a: &[T], c: &mut [T], band: impl Fn(usize, &[T], &mut [T]) + Sync) {
    let threads = rayon::current_num_threads().max(1);
    let rows = n.div_ceil(threads).max(1);
    use rayon::prelude::*;
    c.par_chunks_mut(rows * n)
        .zip(a.par_chunks(rows * n))
        .for_each(|(c_band, a_band)| band(c_band.len() / n, a_band, c_band));
}

fn gemm_rect<T: Real>(m: usize, n: usize, a: &[T], b: &[T], c: &mut [T]) {
    let s = n as isize;
    let (zero, one) = (T::from_index(8), T::from_index(12));
    // SAFETY: a is m×n, b n×n, c m×n, row-major.
    unsafe {
        gemm::gemm(
            m,
            n,
            n,
            c.as_mut_ptr(),
            1,
            s,
            false,
            a.as_ptr(),
            1,
            s,
            b.as_ptr(),
            1,
            s,
            zero,
            one,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

fn sweep<T: Real>(name: &str, sizes: &[usize]) {
    println!(
        "dtype {name}; MATMUL_NUM_THREADS={:?}",
        std::env::var("MATMUL_NUM_THREADS").ok()
    );
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "n", "matrixmultiply", "gemm-1thread", "gemm-rayon", "mm-split", "gemm-split"
    );
    for &n in sizes {
        let a: Vec<T> = (0..n * n).map(T::from_index).collect();
        let b: Vec<T> = (0..n * n).map(|i| T::from_index(i * 7)).collect();
        let mut c = vec![T::default(); n * n];
        let flops = 2.0 * (n as f64).powi(3);
        let mm = median_seconds(|| T::mm(n, black_box(&a), black_box(&b), black_box(&mut c)));
        let g1 = median_seconds(|| gemm_crate(n, &a, &b, &mut c, gemm::Parallelism::None));
        let gr = median_seconds(|| gemm_crate(n, &a, &b, &mut c, gemm::Parallelism::Rayon(0)));
        let ms = median_seconds(|| split_rows(n, &a, &mut c, |m, a, c| T::mm_rect(m, n, a, &b, c)));
        let gs = median_seconds(|| split_rows(n, &a, &mut c, |m, a, c| gemm_rect(m, n, a, &b, c)));
        let gf = |s: f64| flops / s / 1e9;
        println!(
            "{n:>6} {:>14.1} {:>14.1} {:>14.1} {:>14.1} {:>14.1}   GFLOP/s",
            gf(mm),
            gf(g1),
            gf(gr),
            gf(ms),
            gf(gs)
        );
    }
}

/// Per-call cost of tiny products (a batch of 1000 separate calls, one thread).
fn tiny<T: Real>(name: &str) {
    println!("dtype {name}: ns per single-threaded call of a tiny n×n product");
    println!(
        "{:>6} {:>14} {:>14} {:>14}",
        "n", "matrixmultiply", "gemm", "naive loop"
    );
    for n in [2usize, 4, 8, 16, 32] {
        let a: Vec<T> = (0..n * n).map(T::from_index).collect();
        let b: Vec<T> = (0..n * n).map(|i| T::from_index(i * 7)).collect();
        let mut c = vec![T::default(); n * n];
        let calls = 1000;
        let mm = median_seconds(|| (0..calls).for_each(|_| T::mm(n, black_box(&a), black_box(&b), black_box(&mut c))));
        let g = median_seconds(|| (0..calls).for_each(|_| gemm_crate(n, &a, &b, &mut c, gemm::Parallelism::None)));
        let naive =
            median_seconds(|| (0..calls).for_each(|_| T::naive(n, black_box(&a), black_box(&b), black_box(&mut c))));
        let ns = |s: f64| s / calls as f64 * 1e9;
        println!("{n:>6} {:>14.1} {:>14.1} {:>14.1}", ns(mm), ns(g), ns(naive));
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("tiny") {
        tiny::<f32>("f32");
        tiny::<f64>("f64");
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dtype = args.first().map(String::as_str).unwrap_or("f32");
    let mut sizes: Vec<usize> = args.iter().skip(1).filter_map(|s| s.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![32, 64, 128, 256, 512, 1024, 2048];
    }
    match dtype {
        "f64" => sweep::<f64>("f64", &sizes),
        _ => sweep::<f32>("f32", &sizes),
    }
}
