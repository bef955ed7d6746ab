//! Axes: what a value means ([`Unit`]), how it is spread ([`Scale`]), and where the ticks go —
//! at the sizes measured when the chart gives them, else at round values — each labelled in the
//! unit its value calls for (`10 µs`, `16 MiB`, `990 TFLOP/s`).

use crate::bench::report::format::{format_bandwidth, format_bytes, format_flops, format_seconds};

/// Axis scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Base-10 logarithmic.
    Log,
}

/// What an axis measures, which decides how its ticks read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds: `953 ns`, `10 µs`, `2 ms`.
    Seconds,
    /// Bytes: `64 KiB`, `16 MiB`.
    Bytes,
    /// FLOP per second: `10 GFLOP/s`, `1 PFLOP/s`.
    Flops,
    /// Bytes per second: `10 GB/s`.
    Bandwidth,
    /// A percentage given as 0–100: `50%`.
    Percent,
    /// A plain count: `128`, `4096`.
    Count,
}

/// One axis of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The axis title.
    pub label: String,
    /// How values are spread.
    pub scale: Scale,
    /// What the values are.
    pub unit: Unit,
    /// Where to put the ticks (the sizes measured); empty for round values.
    pub ticks: Vec<f64>,
}

impl Axis {
    /// An axis with ticks at round values.
    pub fn new(label: impl Into<String>, scale: Scale, unit: Unit) -> Axis {
        Axis {
            label: label.into(),
            scale,
            unit,
            ticks: Vec::new(),
        }
    }

    /// The same axis with ticks at `ticks`.
    pub fn ticks_at(mut self, ticks: impl IntoIterator<Item = f64>) -> Axis {
        self.ticks = ticks.into_iter().collect();
        self
    }

    /// A value where the chart draws it (its logarithm on a log axis); `None` when it cannot be
    /// drawn (not finite, or not positive on a log axis).
    pub fn to_plot(&self, v: f64) -> Option<f64> {
        match self.scale {
            _ if !v.is_finite() => None,
            Scale::Log if v > 0.0 => Some(v.log10()),
            Scale::Log => None,
            Scale::Linear => Some(v),
        }
    }

    /// A drawn position back to its value.
    pub fn value_at(&self, p: f64) -> f64 {
        match self.scale {
            Scale::Log => 10f64.powf(p),
            Scale::Linear => p,
        }
    }

    /// The drawn range covering `values` (in values, not positions) with some room.
    pub fn range(&self, values: &[f64]) -> std::ops::Range<f64> {
        let drawn: Vec<f64> = values.iter().filter_map(|&v| self.to_plot(v)).collect();
        let lo = drawn.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = drawn.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() || !hi.is_finite() {
            return 0.0..1.0;
        }
        let (lo, hi) = match self.scale {
            Scale::Log => {
                let pad = ((hi - lo) * 0.06).max(0.08);
                (lo - pad, hi + pad)
            }
            Scale::Linear => {
                let pad = ((hi - lo) * 0.06).max(hi.abs() * 0.05).max(1e-9);
                (if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad }, hi + pad)
            }
        };
        if lo < hi { lo..hi } else { lo..lo + 1.0 }
    }

    /// Tick positions inside the drawn range `range`: the given ticks, or round values.
    pub fn tick_positions(&self, range: &std::ops::Range<f64>) -> Vec<f64> {
        let inside = |p: &f64| *p >= range.start && *p <= range.end;
        if !self.ticks.is_empty() {
            let mut drawn: Vec<f64> = self
                .ticks
                .iter()
                .filter_map(|&v| self.to_plot(v))
                .filter(inside)
                .collect();
            drawn.sort_by(f64::total_cmp);
            drawn.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
            return thin(drawn, 12);
        }
        match self.scale {
            Scale::Log => {
                let decades = range.end - range.start;
                let steps: &[f64] = if decades <= 1.7 {
                    &[1.0, 2.0, 5.0]
                } else if decades <= 3.2 {
                    &[1.0, 3.0]
                } else {
                    &[1.0]
                };
                let mut ticks = Vec::new();
                for decade in (range.start.floor() as i32)..=(range.end.ceil() as i32) {
                    for s in steps {
                        let p = f64::from(decade) + s.log10();
                        if inside(&p) {
                            ticks.push(p);
                        }
                    }
                }
                thin(ticks, 9)
            }
            Scale::Linear => {
                let span = range.end - range.start;
                let raw = span / 6.0;
                let magnitude = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 2.5, 5.0, 10.0]
                    .iter()
                    .map(|m| m * magnitude)
                    .find(|s| *s >= raw)
                    .unwrap_or(magnitude * 10.0);
                let mut t = (range.start / step).ceil() * step;
                let mut ticks = Vec::new();
                while t <= range.end + step * 1e-9 {
                    ticks.push(t);
                    t += step;
                }
                ticks
            }
        }
    }

    /// A tick's label at drawn position `p`.
    pub fn label_at(&self, p: f64) -> String {
        tick_label(self.value_at(p), self.unit)
    }
}

/// Every other tick until at most `max` remain (labels would collide).
fn thin(mut ticks: Vec<f64>, max: usize) -> Vec<f64> {
    while ticks.len() > max {
        ticks = ticks.into_iter().step_by(2).collect();
    }
    ticks
}

/// A tick label: the value in its unit, without trailing zeros (`10 µs`, `1.5 MiB`).
pub fn tick_label(v: f64, unit: Unit) -> String {
    let text = match unit {
        Unit::Seconds => format_seconds(v),
        Unit::Bytes => return format_bytes(v.max(0.0).round() as usize),
        Unit::Flops => format_flops(v),
        Unit::Bandwidth => format_bandwidth(v),
        Unit::Percent => return format!("{}%", trim(&format!("{v:.1}"))),
        Unit::Count => {
            return if (v - v.round()).abs() < 1e-6 * v.abs().max(1.0) {
                format!("{}", v.round())
            } else {
                trim(&format!("{v:.2}"))
            };
        }
    };
    match text.split_once(' ') {
        Some((number, unit)) => format!("{} {unit}", trim(number)),
        None => text,
    }
}

/// `10.0` → `10`, `1.50` → `1.5`.
fn trim(number: &str) -> String {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        number.to_string()
    }
}
