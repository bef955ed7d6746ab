//! The memory curve as SVG (plotters' SVG backend): allocated bytes against the step on top, with
//! the leak check's fitted line over its window, and reserved bytes below, each panel in the unit
//! that suits its own range (reserved is usually far larger and would flatten the leak).

use std::path::Path;

use cartage_core::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::tracker::{LeakCheck, MemorySample, fit_line};

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A drawing failure (the curve is drawn into memory, so this is never the file system's).
fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::io(
        path.display(),
        std::io::Error::other(format!("drawing the memory curve failed: {e}")),
    )
}

/// The unit (name, bytes) in which `max` reads as a number below 1024.
fn unit_for(max: f64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 4] = [
        ("B", 1.0),
        ("KiB", 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("GiB", 1024.0 * 1024.0 * 1024.0),
    ];
    UNITS
        .into_iter()
        .rev()
        .find(|&(_, size)| max >= size)
        .unwrap_or(UNITS[0])
}

/// One panel: `series` (step, bytes) as a line, plus an optional extra line (the fit).
fn panel(
    area: &Area<'_>,
    path: &Path,
    caption: &str,
    (label, color): (&str, RGBColor),
    series: &[(f64, f64)],
    fit: Option<(String, [(f64, f64); 2])>,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| io_error(path, e);
    let first = series.first().map_or(0.0, |p| p.0);
    let last = series.last().map_or(1.0, |p| p.0).max(first + 1.0);
    let max = series.iter().map(|p| p.1).fold(0.0, f64::max);
    let (unit, size) = unit_for(max);
    let top = if max > 0.0 { max / size * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(first..last, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(unit)
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            series.iter().map(|&(x, y)| (x, y / size)),
            color.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    if let Some((fit_label, ends)) = fit {
        let style = BLACK.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(ends.map(|(x, y)| (x, y / size)), 8, 4, style))
            .map_err(|e| err(&e))?
            .label(fit_label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// Write the curves of `samples` to `path`.
pub(super) fn write_memory_svg(
    path: &Path,
    title: &str,
    samples: &[MemorySample],
    leak: Option<&LeakCheck>,
) -> Result<()> {
    // Drawn into a string, then written in one call, so that a file-system failure keeps its
    // `std::io::ErrorKind` (not found, permission denied…) instead of a drawing error's text.
    let mut svg = String::new();
    draw_memory_svg(&mut svg, path, title, samples, leak)?;
    std::fs::write(path, svg).map_err(|source| Error::io(path.display(), source))
}

/// Draw the curves of `samples` into `svg` (`path` names the file in errors).
fn draw_memory_svg(
    svg: &mut String,
    path: &Path,
    title: &str,
    samples: &[MemorySample],
    leak: Option<&LeakCheck>,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| io_error(path, e);
    let root = SVGBackend::with_string(svg, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (upper, lower) = root.split_vertically(420);

    let allocated: Vec<(f64, f64)> = samples.iter().map(|s| (s.step as f64, s.allocated as f64)).collect();
    let fit = leak.filter(|c| samples.len() >= c.window).map(|check| {
        let window = &samples[samples.len() - check.window..];
        let (intercept, slope) = fit_line(window);
        let ends =
            [window[0].step, window[window.len() - 1].step].map(|step| (step as f64, intercept + slope * step as f64));
        let verdict = if check.is_leak() { "LEAK" } else { "steady" };
        let label = format!(
            "fit over the last {} steps: {:+.0} B/step, R² {:.2} ({verdict})",
            check.window, check.bytes_per_step, check.r_squared
        );
        (label, ends)
    });
    let caption = format!("{title}: allocated (live tensors)");
    panel(&upper, path, &caption, ("allocated", RED), &allocated, fit)?;

    let reserved: Vec<(f64, f64)> = samples.iter().map(|s| (s.step as f64, s.reserved as f64)).collect();
    let caption = "reserved (allocated + cached free blocks: growth here alone is not a leak)";
    panel(&lower, path, caption, ("reserved", BLUE), &reserved, None)?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
