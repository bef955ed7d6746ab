//! SVG charts of the report, drawn with plotters' SVG backend into strings (inlined in
//! `report.html`, written beside `report.md`).

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// One line of a chart: a name for the legend and its points.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a second variant of the same device).
    pub dashed: bool,
}

/// Axis scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Base-10 logarithmic.
    Log,
}

/// A line chart: title, axis labels and scales, series.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// The title.
    pub title: String,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// The x scale.
    pub x_scale: Scale,
    /// The y scale.
    pub y_scale: Scale,
    /// Labels for integer x positions (category axes); empty for numeric axes.
    pub x_categories: Vec<String>,
    /// The lines.
    pub series: Vec<Series>,
}

const WIDTH: u32 = 760;
const HEIGHT: u32 = 420;

/// Distinct colours that read on white.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

impl LineChart {
    /// The chart as a standalone SVG document; `None` when no series has a point.
    pub fn to_svg(&self) -> Option<String> {
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&p| self.plottable(p))
            .collect();
        if points.is_empty() {
            return None;
        }
        let (x_range, y_range) = (
            range(points.iter().map(|p| p.0), self.x_scale),
            range(points.iter().map(|p| p.1), self.y_scale),
        );
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
            let drawn = match (self.x_scale, self.y_scale) {
                (Scale::Log, Scale::Log) => self.draw(&root, x_range.log_scale(), y_range.log_scale()),
                (Scale::Log, Scale::Linear) => self.draw(&root, x_range.log_scale(), y_range),
                (Scale::Linear, Scale::Log) => self.draw(&root, x_range, y_range.log_scale()),
                (Scale::Linear, Scale::Linear) => self.draw(&root, x_range, y_range),
            };
            if let Err(e) = drawn {
                tracing::warn!(title = %self.title, error = %e, "chart could not be drawn");
                return None;
            }
        }
        Some(svg)
    }

    /// Finite, and positive on a log axis.
    fn plottable(&self, (x, y): (f64, f64)) -> bool {
        x.is_finite()
            && y.is_finite()
            && (self.x_scale == Scale::Linear || x > 0.0)
            && (self.y_scale == Scale::Linear || y > 0.0)
    }

    fn draw<X, Y>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        x: X,
        y: Y,
    ) -> Result<(), Box<dyn std::error::Error + '_>>
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x, y)?;
        let categories = &self.x_categories;
        let x_format = |v: &f64| {
            if categories.is_empty() {
                format_tick(*v)
            } else {
                let index = v.round();
                if (v - index).abs() < 1e-6 && index >= 0.0 {
                    categories.get(index as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
        };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&x_format)
            .y_label_formatter(&|v: &f64| format_tick(*v))
            .light_line_style(RGBColor(235, 235, 235));
        if !categories.is_empty() {
            mesh.x_labels(categories.len() + 1);
        }
        mesh.draw()?;
        for (i, series) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let points: Vec<(f64, f64)> = series.points.iter().copied().filter(|&p| self.plottable(p)).collect();
            let style = ShapeStyle::from(&color).stroke_width(2);
            let drawn = if series.dashed {
                chart.draw_series(DashedLineSeries::new(points.iter().copied(), 6, 4, style))?
            } else {
                chart.draw_series(LineSeries::new(points.iter().copied(), style))?
            };
            drawn
                .label(series.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

/// A range covering `values` with some room, suited to `scale`.
fn range(values: impl Iterator<Item = f64>, scale: Scale) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    match scale {
        Scale::Log => {
            lo /= 1.5;
            hi *= 1.5;
        }
        Scale::Linear => {
            let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.05).max(1e-9);
            lo = if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad };
            hi += pad;
        }
    }
    if lo >= hi {
        hi = lo * 2.0 + 1.0;
    }
    lo..hi
}

/// Ticks as short numbers: `0.5`, `12`, `4096`, `1.5e-5`.
fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_log_chart_is_an_svg_with_its_legend() {
        let chart = LineChart {
            title: "matmul f32".into(),
            x_label: "n".into(),
            y_label: "seconds".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Log,
            x_categories: Vec::new(),
            series: vec![
                Series {
                    name: "cpu".into(),
                    points: vec![(32.0, 1e-5), (64.0, 6e-5), (128.0, 4e-4)],
                    dashed: false,
                },
                Series {
                    name: "wgpu:0 (lavapipe)".into(),
                    points: vec![(32.0, 1e-4), (64.0, 2e-4)],
                    dashed: true,
                },
            ],
        };
        let svg = chart.to_svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..60]);
        assert!(svg.contains("matmul f32") && svg.contains("wgpu:0 (lavapipe)"));
    }

    #[test]
    fn no_points_no_chart() {
        let chart = LineChart {
            title: "empty".into(),
            x_label: String::new(),
            y_label: String::new(),
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
            x_categories: vec!["a".into()],
            series: vec![Series {
                name: "cpu".into(),
                points: vec![(0.0, 0.0)],
                dashed: false,
            }],
        };
        assert!(chart.to_svg().is_none());
    }
}
