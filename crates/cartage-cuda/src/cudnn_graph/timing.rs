//! Device time of one queued call, measured with the crate's timing events on the compute
//! stream (`events`): one untimed warm-up (which also surfaces a refusal and lets an engine
//! compile its kernels at run time), then [`RUNS`] calls between two events, averaged.
//! Waits for the device, so never used during a graph capture.

use cartage_core::Result;

use super::descriptor::Outcome;
use super::engines::ExecPlan;
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

/// The engines of `candidates` timed with `run` and ordered fastest first: an engine cuDNN
/// refuses (`run` gives `Ok(Err(failure))`) is dropped and logged; an error that is not cuDNN's
/// stops the timing, is returned, and leaves the untimed engines after the timed ones. `search`
/// names the search in the logs, `op` the operation in a refusal's error.
pub(crate) fn rank_engines(
    backend: &CudaBackend,
    candidates: Vec<ExecPlan>,
    search: &'static str,
    op: &str,
    mut run: impl FnMut(&ExecPlan) -> Result<Outcome<()>>,
) -> (Vec<ExecPlan>, Result<()>) {
    let device = backend.device;
    let mut outcome = Ok(());
    let mut timed: Vec<ExecPlan> = Vec::new();
    let mut untimed: Vec<ExecPlan> = Vec::new();
    for mut candidate in candidates {
        if outcome.is_err() {
            untimed.push(candidate);
            continue;
        }
        let mut refused = None;
        let measured = time_ms(backend, || {
            run(&candidate)?.map_err(|failure| {
                let e = failure.error(device, op);
                refused = Some(failure);
                e
            })
        });
        match (measured, refused) {
            (Ok(ms), _) => {
                candidate.time_ms = Some(ms);
                timed.push(candidate);
            }
            (Err(_), Some(failure)) => {
                tracing::debug!(%device, search, %failure, "cuDNN refused this graph engine; dropped");
            }
            (Err(e), None) => {
                untimed.push(candidate);
                outcome = Err(e);
            }
        }
    }
    timed.sort_by(|a, b| a.time_ms.partial_cmp(&b.time_ms).unwrap_or(std::cmp::Ordering::Equal));
    tracing::debug!(
        %device,
        search,
        timed = ?timed.iter().map(|c| (c.engine.index, c.workspace, c.time_ms)).collect::<Vec<_>>(),
        "cuDNN graph engines timed"
    );
    timed.extend(untimed);
    (timed, outcome)
}
