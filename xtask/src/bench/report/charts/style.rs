//! How series look: a colour per device (a family of shades, one per variant of the device's
//! series), a dash pattern and a point marker per variant, so that no two series of a chart are
//! drawn alike and the legend draws each exactly as the plot does.

use plotters::style::RGBColor;

/// A line's dash pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dash {
    /// A continuous line.
    Solid,
    /// 8 px dashes, 5 px gaps.
    Dashed,
    /// 2 px dots, 4 px gaps.
    Dotted,
    /// 16 px dashes, 5 px gaps.
    Long,
}

impl Dash {
    /// (dash, gap) in pixels; `None` for a solid line.
    pub fn pattern(self) -> Option<(i32, i32)> {
        match self {
            Dash::Solid => None,
            Dash::Dashed => Some((8, 5)),
            Dash::Dotted => Some((2, 4)),
            Dash::Long => Some((16, 5)),
        }
    }
}

/// A point marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mark {
    /// A filled circle.
    Circle,
    /// A filled square.
    Square,
    /// A filled triangle.
    Triangle,
    /// A cross.
    Cross,
}

/// How one series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Style {
    /// Line and marker colour.
    pub color: RGBColor,
    /// The line's dash pattern.
    pub dash: Dash,
    /// The point marker.
    pub mark: Mark,
}

/// The colour families, one per device in the order of the report's device list: the base
/// shade, a lighter and a darker one.
pub const FAMILIES: [[RGBColor; 3]; 6] = [
    // Blue.
    [RGBColor(31, 119, 180), RGBColor(120, 180, 230), RGBColor(10, 55, 105)],
    // Orange.
    [RGBColor(232, 113, 10), RGBColor(250, 185, 95), RGBColor(140, 60, 0)],
    // Green.
    [RGBColor(44, 160, 44), RGBColor(150, 215, 135), RGBColor(15, 90, 25)],
    // Purple.
    [RGBColor(145, 90, 200), RGBColor(205, 175, 235), RGBColor(75, 30, 125)],
    // Red.
    [RGBColor(215, 40, 40), RGBColor(245, 150, 150), RGBColor(125, 10, 60)],
    // Olive.
    [RGBColor(150, 150, 30), RGBColor(215, 215, 120), RGBColor(85, 85, 0)],
];

/// Grey for reference lines (datasheet peaks, the bandwidth ceiling).
pub const REFERENCE: RGBColor = RGBColor(90, 90, 90);

/// The style of variant `variant` of device `family`: variant 0 is the device's main series
/// (base shade, solid, circles), 1 a second measurement of it (lighter, dashed, squares), 2 the
/// reference library's figure (darker, dotted, triangles), 3 a fourth (base, long dashes,
/// crosses). Families past the palette's end wrap round with a different dash.
pub fn style(family: usize, variant: usize) -> Style {
    let shades = FAMILIES[family % FAMILIES.len()];
    let round = family / FAMILIES.len();
    const DASHES: [Dash; 4] = [Dash::Solid, Dash::Dashed, Dash::Dotted, Dash::Long];
    const MARKS: [Mark; 4] = [Mark::Circle, Mark::Square, Mark::Triangle, Mark::Cross];
    Style {
        color: shades[[0, 1, 2, 0][variant % 4]],
        dash: DASHES[(variant + round) % 4],
        mark: MARKS[variant % 4],
    }
}

/// `#1F77B4`, as the SVG writes it.
#[cfg(test)]
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// Euclidean distance between two colours in RGB space.
#[cfg(test)]
pub fn distance(a: RGBColor, b: RGBColor) -> f64 {
    let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
    (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt()
}
