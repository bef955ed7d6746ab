//! The memory curve as SVG (plotters' SVG backend): allocated and reserved MiB against the step,
//! with the leak check's fitted line over its window.

use std::path::Path;

use cartage_core::{Error, Result};
use plotters::prelude::*;

use super::tracker::{LeakCheck, MemorySample, fit_line};

const MIB: f64 = (1u64 << 20) as f64;

fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// Write the curve of `samples` to `path`.
pub(super) fn write_memory_svg(
    path: &Path,
    title: &str,
    samples: &[MemorySample],
    leak: Option<&LeakCheck>,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| io_error(path, e);
    let first = samples.first().map_or(0, |s| s.step);
    let last = samples.last().map_or(1, |s| s.step).max(first + 1);
    let top = samples.iter().map(|s| s.reserved.max(s.allocated)).max().unwrap_or(0) as f64 / MIB;
    let top = if top > 0.0 { top * 1.1 } else { 1.0 };

    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(first as f64..last as f64, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("MiB")
        .draw()
        .map_err(|e| err(&e))?;

    let reserved = samples.iter().map(|s| (s.step as f64, s.reserved as f64 / MIB));
    chart
        .draw_series(LineSeries::new(reserved, &BLUE))
        .map_err(|e| err(&e))?
        .label("reserved (allocated + cached free)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    let allocated = samples.iter().map(|s| (s.step as f64, s.allocated as f64 / MIB));
    chart
        .draw_series(LineSeries::new(allocated, &RED))
        .map_err(|e| err(&e))?
        .label("allocated (live tensors)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));

    if let Some(check) = leak
        && samples.len() >= check.window
    {
        let window = &samples[samples.len() - check.window..];
        let (intercept, slope) = fit_line(window);
        let ends = [window[0].step, window[window.len() - 1].step]
            .map(|step| (step as f64, (intercept + slope * step as f64) / MIB));
        let verdict = if check.is_leak() { "LEAK" } else { "steady" };
        let label = format!(
            "fit over last {} steps: {:+.0} B/step ({verdict})",
            check.window, check.bytes_per_step
        );
        let style = ShapeStyle::from(&BLACK).stroke_width(2);
        chart
            .draw_series(LineSeries::new(ends, style))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
