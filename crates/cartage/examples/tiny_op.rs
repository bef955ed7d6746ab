//! The cost of a tiny op through the whole frontend: a 4-element f32 `add` on the CPU —
//! device and dtype checks, output allocation from the cache, the kernel, the `Tensor` — and
//! dropping the result (its block goes back to the cache). numpy's 4-element add costs about
//! 0.23 µs on the 2-core development machine; a tiny op must stay far cheaper than a GPU launch.
//!
//! ```text
//! cargo run --release -p cartage --example tiny_op
//! ```

use std::hint::black_box;
use std::time::Instant;

use cartage::prelude::*;

fn main() -> Result<()> {
    let device = Device::cpu();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], &device)?;
    let b = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.5], &[4], &device)?;
    assert_eq!(a.add(&b)?.to_vec::<f32>()?, vec![1.5, 2.5, 3.5, 4.5]);

    let iterations = 200_000;
    let rounds = 15;
    let mut per_op = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iterations {
            black_box(black_box(&a).add(black_box(&b))?);
        }
        per_op.push(start.elapsed().as_secs_f64() * 1e9 / iterations as f64);
    }
    per_op.sort_by(f64::total_cmp);
    let median = per_op[rounds / 2];
    println!(
        "cpu/add_f32_4 through the frontend: median {median:.1} ns per op (min {:.1}, max {:.1}; {rounds} rounds of {iterations})",
        per_op[0],
        per_op[rounds - 1]
    );
    Ok(())
}
