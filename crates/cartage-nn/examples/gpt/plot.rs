//! The loss curve as SVG (plotters): training and validation loss against the step, with the
//! unigram entropy as the line a model that learned nothing from context would sit on.

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::prelude::*;

/// One evaluation: the step, the mean training loss since the previous one (none before the
/// first step), the validation loss.
#[derive(Clone, Copy, Debug)]
pub struct LossPoint {
    pub step: usize,
    pub train: Option<f64>,
    pub val: f64,
}

/// Draw `points` with a dashed line at `unigram` into `path`.
pub fn write_loss_svg(path: &Path, title: &str, points: &[LossPoint], unigram: f64) -> anyhow::Result<()> {
    let mut svg = String::new();
    draw(&mut svg, title, points, unigram).map_err(|e| anyhow!("drawing the loss curve: {e}"))?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

fn draw(svg: &mut String, title: &str, points: &[LossPoint], unigram: f64) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let last = points.last().map_or(1, |p| p.step).max(1) as f64;
    let top = points
        .iter()
        .flat_map(|p| [p.train.unwrap_or(0.0), p.val])
        .chain([unigram])
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..last, 0.0..top.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy (nats per character)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let series = [
        (
            "training (mean since the previous point)",
            BLUE,
            points
                .iter()
                .filter_map(|p| Some((p.step as f64, p.train?)))
                .collect::<Vec<_>>(),
        ),
        (
            "validation (last 10% of the text)",
            RED,
            points.iter().map(|p| (p.step as f64, p.val)).collect(),
        ),
    ];
    for (label, color, line) in series {
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    let style = BLACK.stroke_width(1);
    chart
        .draw_series(DashedLineSeries::new([(0.0, unigram), (last, unigram)], 8, 4, style))?
        .label(format!("unigram entropy {unigram:.3}"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
