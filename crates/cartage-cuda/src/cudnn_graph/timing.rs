//! Device time of one queued call, measured with the crate's timing events on the compute
//! stream (`events`): one untimed warm-up (which also surfaces a refusal and lets an engine
//! compile its kernels at run time), then [`RUNS`] calls between two events, averaged.
//! Waits for the device, so never used during a graph capture.

use cartage_core::Result;

use crate::backend::CudaBackend;
use crate::events;

/// Timed calls per measurement.
pub(crate) const RUNS: u32 = 3;

/// Milliseconds one call of `run` takes on the device (the mean of [`RUNS`] after a warm-up).
/// An error of the warm-up or a timed call is returned as it is.
pub(crate) fn time_ms(backend: &CudaBackend, mut run: impl FnMut() -> Result<()>) -> Result<f32> {
    run()?;
    let start = events::record(backend)?;
    for _ in 0..RUNS {
        run()?;
    }
    let end = events::record(backend)?;
    let elapsed = events::elapsed(backend, &start, &end)?;
    Ok((elapsed.as_secs_f64() * 1000.0 / f64::from(RUNS)) as f32)
}
