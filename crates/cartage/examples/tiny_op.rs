//! The cost of a tiny op through the whole frontend: a 4-element f32 `add` on the CPU —
//! device and dtype checks, output allocation from the cache, the kernel, the `Tensor` — and
//! dropping the result (its block goes back to the cache). numpy's 4-element add costs about
//! 0.23 µs on the 2-core development machine; a tiny op must stay far cheaper than a GPU launch.
//!
//! ```text
//! cargo run --release -p cartage --example tiny_op
//! python3 crates/cartage/examples/tiny_op_numpy.py   # numpy, measured the same way
//! ```
//!
//! Both report wall time and the thread's CPU time per op (median of rounds): on a busy machine
//! the CPU time is the fairer figure, since it leaves out the time the thread waited for a core.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cartage::prelude::*;

#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// CPU time consumed by the calling thread (Linux `CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> Duration {
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: `clock_gettime` writes one `struct timespec` (two 64-bit fields on 64-bit Linux,
    // matching `Timespec`'s C layout) through a pointer to a live, writable local.
    let status = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut time) };
    assert_eq!(status, 0, "clock_gettime failed");
    Duration::new(time.seconds as u64, time.nanoseconds as u32)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

// cartage: device-entry (this example measures the CPU's tiny-op path on purpose)
fn main() -> Result<()> {
    let device = Device::cpu();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], &device)?;
    let b = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.5], &[4], &device)?;
    assert_eq!(a.add(&b)?.to_vec::<f32>()?, vec![1.5, 2.5, 3.5, 4.5]);

    let iterations = 200_000;
    let rounds = 21;
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (start, cpu_start) = (Instant::now(), thread_cpu_time());
        for _ in 0..iterations {
            drop(black_box(black_box(&a).add(black_box(&b))?));
        }
        cpu.push((thread_cpu_time() - cpu_start).as_secs_f64() * 1e9 / iterations as f64);
        wall.push(start.elapsed().as_secs_f64() * 1e9 / iterations as f64);
    }
    println!(
        "cpu/add_f32_4 through the frontend: {:.1} ns per op (thread CPU time), {:.1} ns wall; median of {rounds} rounds of {iterations}",
        median(cpu),
        median(wall)
    );
    Ok(())
}
