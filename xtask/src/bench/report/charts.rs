//! SVG charts of the report, drawn with plotters' SVG backend into strings (inlined in
//! `report.html`, written beside `report.md`): line charts over sizes ([`LineChart`]) and
//! grouped bar charts over categories ([`BarChart`]).
//!
//! Every chart has its legend in a panel to the right of the plot, drawing each entry exactly
//! as the plot does (colour, dash pattern, marker); reference lines — datasheet peaks,
//! crossovers — are listed there too, so no label sits on the data.

pub mod axis;
pub mod style;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::{CoordTranslate, Shift};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub use axis::{Axis, Scale, Unit};
pub use style::{Dash, Mark, Style};

/// One line of a chart: a name for the legend, its points and how it is drawn.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Colour, dash pattern and marker.
    pub style: Style,
}

/// A reference line across the plot: horizontal at a y value (a peak) or vertical at an x value
/// (a crossover), with its legend text.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Where it is drawn (in the axis's values).
    pub at: f64,
    /// Legend text (`\n` breaks the line).
    pub label: String,
    /// Its colour.
    pub color: RGBColor,
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// The title.
    pub title: String,
    /// The x axis.
    pub x: Axis,
    /// The y axis.
    pub y: Axis,
    /// The lines.
    pub series: Vec<Series>,
    /// Horizontal reference lines (peaks).
    pub levels: Vec<Rule>,
    /// Vertical markers (crossovers).
    pub marks: Vec<Rule>,
}

/// One group of bars: a device's value per category.
#[derive(Clone, Debug)]
pub struct Bars {
    /// Legend text.
    pub name: String,
    /// One value per category; `None` where it was not measured.
    pub values: Vec<Option<f64>>,
    /// The bars' colour.
    pub color: RGBColor,
}

/// A grouped bar chart: categories along x, one bar per group in each.
#[derive(Clone, Debug)]
pub struct BarChart {
    /// The title.
    pub title: String,
    /// The x axis title.
    pub x_label: String,
    /// The categories, in order.
    pub categories: Vec<String>,
    /// The y axis.
    pub y: Axis,
    /// The groups of bars.
    pub groups: Vec<Bars>,
    /// Horizontal reference lines.
    pub levels: Vec<Rule>,
}

/// Width of every line chart, in pixels (a bar chart widens with its categories).
pub const WIDTH: u32 = 660;
/// Height of every chart.
pub const HEIGHT: u32 = 420;
const FONT: &str = "sans-serif";
const LEGEND_FONT: u32 = 16;
const LINE_HEIGHT: i32 = 17;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One legend entry as drawn.
enum Swatch {
    Line(Style),
    Rule(RGBColor, Dash, bool),
    Bar(RGBColor),
}

impl LineChart {
    /// The chart as an SVG document; `None` when no series has a point to draw.
    pub fn to_svg(&self) -> Option<String> {
        let drawable = |&(x, y): &(f64, f64)| self.x.to_plot(x).is_some() && self.y.to_plot(y).is_some();
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(drawable)
            .collect();
        if points.is_empty() {
            return None;
        }
        let mut legend: Vec<(Swatch, String)> = self
            .series
            .iter()
            .filter(|s| s.points.iter().any(drawable))
            .map(|s| (Swatch::Line(s.style), s.name.clone()))
            .collect();
        legend.extend(
            self.levels
                .iter()
                .map(|r| (Swatch::Rule(r.color, Dash::Long, false), r.label.clone())),
        );
        legend.extend(
            self.marks
                .iter()
                .map(|r| (Swatch::Rule(r.color, Dash::Dotted, true), r.label.clone())),
        );
        render(&self.title, WIDTH, &legend, |area| self.draw(area, &points))
    }

    fn draw(&self, area: &DrawingArea<SVGBackend<'_>, Shift>, points: &[(f64, f64)]) -> Result<()> {
        let mut xs: Vec<f64> = points.iter().map(|p| p.0).collect();
        xs.extend(self.marks.iter().map(|r| r.at));
        let mut ys: Vec<f64> = points.iter().map(|p| p.1).collect();
        ys.extend(self.levels.iter().map(|r| r.at));
        let (x_range, y_range) = (self.x.range(&xs), self.y.range(&ys));
        let (x_ticks, y_ticks) = (self.x.tick_positions(&x_range), self.y.tick_positions(&y_range));
        let mut chart = ChartBuilder::on(area)
            .margin_top(8)
            .margin_right(14)
            .x_label_area_size(46)
            .y_label_area_size(112)
            .build_cartesian_2d(
                Ticked::new(x_range.clone(), x_ticks),
                Ticked::new(y_range.clone(), y_ticks),
            )?;
        chart
            .configure_mesh()
            .x_desc(self.x.label.as_str())
            .y_desc(self.y.label.as_str())
            .x_label_formatter(&|p: &f64| self.x.label_at(*p))
            .y_label_formatter(&|p: &f64| self.y.label_at(*p))
            .bold_line_style(RGBColor(226, 226, 226))
            .light_line_style(WHITE)
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17))
            .draw()?;
        for level in &self.levels {
            let Some(y) = self.y.to_plot(level.at) else { continue };
            let ends = [(x_range.start, y), (x_range.end, y)];
            draw_line(&mut chart, &ends, level.color, Dash::Long, 1)?;
        }
        for mark in &self.marks {
            let Some(x) = self.x.to_plot(mark.at) else { continue };
            let ends = [(x, y_range.start), (x, y_range.end)];
            draw_line(&mut chart, &ends, mark.color, Dash::Dotted, 2)?;
        }
        for series in &self.series {
            let drawn: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter_map(|&(x, y)| Some((self.x.to_plot(x)?, self.y.to_plot(y)?)))
                .collect();
            draw_line(&mut chart, &drawn, series.style.color, series.style.dash, 2)?;
            for &p in &drawn {
                draw_mark(chart.plotting_area(), p, series.style)?;
            }
        }
        Ok(())
    }
}

impl BarChart {
    /// The chart as an SVG document; `None` when no bar has a value.
    pub fn to_svg(&self) -> Option<String> {
        let values: Vec<f64> = self
            .groups
            .iter()
            .flat_map(|g| g.values.iter().flatten().copied())
            .filter(|v| self.y.to_plot(*v).is_some())
            .collect();
        if values.is_empty() || self.categories.is_empty() {
            return None;
        }
        let mut legend: Vec<(Swatch, String)> = self
            .groups
            .iter()
            .map(|g| (Swatch::Bar(g.color), g.name.clone()))
            .collect();
        legend.extend(
            self.levels
                .iter()
                .map(|r| (Swatch::Rule(r.color, Dash::Long, false), r.label.clone())),
        );
        // Room for every category's label: about 64 px each beside the axis and the legend.
        let width = (126 + legend_width(&legend) + 64 * self.categories.len() as u32).max(WIDTH);
        render(&self.title, width, &legend, |area| self.draw(area, &values))
    }

    fn draw(&self, area: &DrawingArea<SVGBackend<'_>, Shift>, values: &[f64]) -> Result<()> {
        let mut ys = values.to_vec();
        ys.extend(self.levels.iter().map(|r| r.at));
        if self.y.scale == Scale::Linear {
            ys.push(0.0);
        }
        let y_range = self.y.range(&ys);
        let y_ticks = self.y.tick_positions(&y_range);
        let n = self.categories.len();
        let x_ticks: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
        let mut chart = ChartBuilder::on(area)
            .margin_top(8)
            .margin_right(14)
            .x_label_area_size(46)
            .y_label_area_size(112)
            .build_cartesian_2d(
                Ticked::new(0.0..n as f64, x_ticks),
                Ticked::new(y_range.clone(), y_ticks),
            )?;
        let categories = &self.categories;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y.label.as_str())
            .x_label_formatter(&|p: &f64| categories.get(p.floor().max(0.0) as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|p: &f64| self.y.label_at(*p))
            .bold_line_style(RGBColor(226, 226, 226))
            .light_line_style(WHITE)
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17))
            .draw()?;
        let groups = self.groups.len().max(1) as f64;
        let width = 0.8 / groups;
        let base = y_range.start;
        for (g, group) in self.groups.iter().enumerate() {
            let bars = group.values.iter().enumerate().filter_map(|(i, v)| {
                let top = self.y.to_plot((*v)?)?;
                let left = i as f64 + 0.1 + g as f64 * width;
                Some(Rectangle::new(
                    [(left, base), (left + width * 0.92, top)],
                    group.color.filled(),
                ))
            });
            chart.draw_series(bars)?;
        }
        for level in &self.levels {
            let Some(y) = self.y.to_plot(level.at) else { continue };
            draw_line(&mut chart, &[(0.0, y), (n as f64, y)], level.color, Dash::Long, 1)?;
        }
        Ok(())
    }
}

/// A linear axis over a drawn range with its ticks where the chart puts them (plotters'
/// own ranges choose their ticks themselves).
#[derive(Clone, Debug)]
struct Ticked {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ticked {
    fn new(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Ticked {
        Ticked { range, ticks }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let share = if span > 0.0 {
            (value - self.range.start) / span
        } else {
            0.0
        };
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Ticked, Ticked>>;

/// A polyline in `color` with `dash`, `width` pixels wide.
fn draw_line(chart: &mut Chart<'_, '_>, points: &[(f64, f64)], color: RGBColor, dash: Dash, width: u32) -> Result<()> {
    let style = ShapeStyle::from(&color).stroke_width(width);
    match dash.pattern() {
        None => chart.draw_series(LineSeries::new(points.iter().copied(), style))?,
        Some((on, off)) => chart.draw_series(DashedLineSeries::new(points.iter().copied(), on, off, style))?,
    };
    Ok(())
}

/// A marker centred on `at`, in the plot's coordinates or the legend's pixels.
fn draw_mark<C: CoordTranslate>(area: &DrawingArea<SVGBackend<'_>, C>, at: C::From, style: Style) -> Result<()>
where
    C::From: Clone + 'static,
{
    let fill = ShapeStyle::from(&style.color).filled();
    match style.mark {
        Mark::Circle => area.draw(&Circle::new(at, 4, fill))?,
        Mark::Square => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], fill)))?,
        Mark::Triangle => area.draw(&TriangleMarker::new(at, 6, fill))?,
        Mark::Cross => area.draw(&Cross::new(at, 4, ShapeStyle::from(&style.color).stroke_width(2)))?,
    }
    Ok(())
}

/// The legend panel's width for these entries: the longest line, within bounds.
fn legend_width(entries: &[(Swatch, String)]) -> u32 {
    let longest = entries
        .iter()
        .flat_map(|(_, text)| text.lines())
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0) as u32;
    (longest * 7 + 52).clamp(140, 260)
}

/// Draw a chart `width` pixels wide: the title across the top, the plot on the left, the legend
/// on the right.
fn render(
    title: &str,
    width: u32,
    legend: &[(Swatch, String)],
    plot: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<()>,
) -> Option<String> {
    let mut svg = String::new();
    let drawn = (|| -> Result<()> {
        let root = SVGBackend::with_string(&mut svg, (width, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(title, (FONT, 21))?;
        let (plot_area, legend_area) = body.split_horizontally(width - legend_width(legend));
        plot(&plot_area)?;
        draw_legend(&legend_area, legend)?;
        root.present()?;
        Ok(())
    })();
    match drawn {
        Ok(()) => Some(svg),
        Err(e) => {
            tracing::warn!(title, error = %e, "chart could not be drawn");
            None
        }
    }
}

/// The legend: one entry per series, bar group or reference line, top to bottom.
fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[(Swatch, String)]) -> Result<()> {
    let text = TextStyle::from((FONT, LEGEND_FONT).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let (x0, x1) = (6, 36);
    let mut y = 18;
    for (swatch, label) in entries {
        match *swatch {
            Swatch::Line(style) => {
                legend_line(area, (x0, x1), y, style.color, style.dash, 2)?;
                draw_mark(area, ((x0 + x1) / 2, y), style)?;
            }
            Swatch::Rule(color, dash, vertical) => {
                if vertical {
                    let x = (x0 + x1) / 2;
                    area.draw(&DashedPathElement::new(
                        vec![(x, y - 7), (x, y + 7)],
                        2,
                        3,
                        ShapeStyle::from(&color).stroke_width(2),
                    ))?;
                } else {
                    legend_line(area, (x0, x1), y, color, dash, 1)?;
                }
            }
            Swatch::Bar(color) => {
                area.draw(&Rectangle::new([(x0 + 6, y - 6), (x1 - 6, y + 6)], color.filled()))?;
            }
        }
        for (i, line) in label.lines().enumerate() {
            area.draw(&Text::new(
                line.to_string(),
                (x1 + 8, y + i as i32 * LINE_HEIGHT),
                text.clone(),
            ))?;
        }
        y += LINE_HEIGHT * label.lines().count().max(1) as i32 + 8;
    }
    Ok(())
}

fn legend_line(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    (x0, x1): (i32, i32),
    y: i32,
    color: RGBColor,
    dash: Dash,
    width: u32,
) -> Result<()> {
    let style = ShapeStyle::from(&color).stroke_width(width);
    match dash.pattern() {
        None => area.draw(&PathElement::new(vec![(x0, y), (x1, y)], style))?,
        Some((on, off)) => area.draw(&DashedPathElement::new(vec![(x0, y), (x1, y)], on, off, style))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::svg_texts as texts;

    fn line(name: &str, family: usize, variant: usize, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            style: style::style(family, variant),
        }
    }

    #[test]
    fn a_log_log_chart_has_its_legend_and_unit_ticks() {
        let chart = LineChart {
            title: "matmul f32".into(),
            x: Axis::new("n", Scale::Log, Unit::Count).ticks_at([32.0, 64.0, 128.0]),
            y: Axis::new("time", Scale::Log, Unit::Seconds),
            series: vec![
                line("cpu", 0, 0, vec![(32.0, 1e-5), (64.0, 6e-5), (128.0, 4e-4)]),
                line("wgpu:0", 1, 0, vec![(32.0, 1e-4), (64.0, 2e-4)]),
            ],
            levels: Vec::new(),
            marks: vec![Rule {
                at: 64.0,
                label: "wgpu:0 ahead from n = 64".into(),
                color: style::style(1, 0).color,
            }],
        };
        let svg = chart.to_svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..60]);
        let texts = texts(&svg);
        for text in [
            "matmul f32",
            "wgpu:0 ahead from n = 64",
            "32",
            "64",
            "128",
            "10 µs",
            "100 µs",
        ] {
            assert!(texts.iter().any(|t| t == text), "`{text}` missing from {texts:?}");
        }
        assert!(!texts.iter().any(|t| t.contains("e-")), "no raw exponents on the axes");
    }

    #[test]
    fn no_points_no_chart() {
        let chart = LineChart {
            title: "empty".into(),
            x: Axis::new("", Scale::Linear, Unit::Count),
            y: Axis::new("", Scale::Log, Unit::Seconds),
            series: vec![line("cpu", 0, 0, vec![(0.0, 0.0)])],
            levels: Vec::new(),
            marks: Vec::new(),
        };
        assert!(chart.to_svg().is_none());
    }

    #[test]
    fn bars_are_drawn_per_category_with_their_names() {
        let chart = BarChart {
            title: "ops".into(),
            x_label: "op".into(),
            categories: vec!["copy".into(), "gelu".into()],
            y: Axis::new("% of ceiling", Scale::Linear, Unit::Percent),
            groups: vec![Bars {
                name: "cpu".into(),
                values: vec![Some(90.0), Some(3.0)],
                color: style::style(0, 0).color,
            }],
            levels: Vec::new(),
        };
        let svg = chart.to_svg().unwrap();
        let texts = texts(&svg);
        assert!(
            texts.contains(&"copy".to_string()) && texts.contains(&"gelu".to_string()),
            "{texts:?}"
        );
        assert!(svg.contains("<rect"), "bars, not a line");
    }
}
