//! Device timing: CUDA events recorded on the compute stream, timed with `cuEventElapsedTime`
//! (R29: benchmarks time the device, not the host's dispatch).

use std::time::Duration;

use cartage_core::{Device, Error, Event, Result};
use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use crate::backend::CudaBackend;
use crate::driver;

/// A timing event of one CUDA device.
pub(crate) struct TimingEvent {
    device: Device,
    event: CudaEvent,
}

/// Record a timing event after the work queued so far on the compute stream.
pub(crate) fn record(backend: &CudaBackend) -> Result<Event> {
    backend.bind()?;
    let event = backend
        .ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver::error(backend.device, "create event"))?;
    event
        .record(&backend.compute)
        .map_err(driver::error(backend.device, "record event"))?;
    Ok(Event::new(TimingEvent {
        device: backend.device,
        event,
    }))
}

/// Device time from `start` to `end` (waits for `end`).
pub(crate) fn elapsed(backend: &CudaBackend, start: &Event, end: &Event) -> Result<Duration> {
    let (Some(start), Some(end)) = (start.downcast_ref::<TimingEvent>(), end.downcast_ref::<TimingEvent>()) else {
        return Err(Error::invalid(
            "elapsed",
            format!("both events must come from `record_event` on {}", backend.device),
        ));
    };
    if start.device != backend.device || end.device != backend.device {
        return Err(Error::invalid(
            "elapsed",
            format!(
                "events of {} and {} timed on {}; time events of one device on that device",
                start.device, end.device, backend.device
            ),
        ));
    }
    let ms = start
        .event
        .elapsed_ms(&end.event)
        .map_err(driver::error(backend.device, "event elapsed time"))?;
    Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1000.0))
}
