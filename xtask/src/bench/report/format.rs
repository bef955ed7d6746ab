//! How the report writes numbers: times, sizes and rates scaled to their value (`692 TFLOP/s`,
//! `4.01 TB/s`, `16 MiB`, `2.56 µs`), comparisons as words (`56× faster`, `1.8× slower`), and
//! a row's roofline verdict, which names a bound only when the row comes near its ceiling.

use super::blocks::{Cell, Tone};
use super::{Bound, Row};

/// Below this fraction of its nearest ceiling, a row is not said to be bound by it: something
/// the roofline does not count (transcendental arithmetic, conversions, the implementation)
/// limits it instead.
pub const BOUND_FLOOR: f64 = 0.25;

/// Two times within this factor of each other are "on par".
pub const PAR: f64 = 1.05;

/// Three significant digits: `692`, `51.1`, `4.01`, `0.953`.
fn sig3(value: f64) -> String {
    let a = value.abs();
    if a >= 100.0 {
        format!("{value:.0}")
    } else if a >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// `value` scaled by powers of `step` to the first of `units` that keeps it under `step`.
fn scaled(value: f64, step: f64, units: &[&str]) -> String {
    let mut v = value;
    let mut i = 0;
    while v.abs() >= step * 0.9995 && i + 1 < units.len() {
        v /= step;
        i += 1;
    }
    format!("{} {}", sig3(v), units[i])
}

/// `953 ns`, `2.56 µs`, `12.3 ms`, `2.00 s`.
pub fn format_seconds(s: f64) -> String {
    if !s.is_finite() {
        return "–".into();
    }
    // The largest unit the value reaches; 999.7 µs reads `1.00 ms`, not `1000 µs`.
    let (scale, unit) = [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs")]
        .into_iter()
        .find(|(scale, _)| s.abs() >= scale * 0.9995)
        .unwrap_or((1e-9, "ns"));
    format!("{} {unit}", sig3(s / scale))
}

/// `512 B`, `64 KiB`, `1.5 MiB`, `140 GiB`: binary units, trailing zeros dropped.
pub fn format_bytes(bytes: usize) -> String {
    let text = scaled(bytes as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"]);
    let (number, unit) = text.split_once(' ').unwrap_or((&text, ""));
    let number = if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    };
    format!("{number} {unit}")
}

/// Arithmetic rate: `3.70 GFLOP/s`, `51.1 TFLOP/s`, `692 TFLOP/s`.
pub fn format_flops(flop_per_s: f64) -> String {
    scaled(
        flop_per_s,
        1000.0,
        &["FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"],
    )
}

/// Bandwidth in decimal units, as datasheets give it: `650 MB/s`, `55.1 GB/s`, `4.01 TB/s`.
pub fn format_bandwidth(bytes_per_s: f64) -> String {
    scaled(bytes_per_s, 1000.0, &["B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"])
}

/// A rate the JSON gives in `GFLOP/s` or `GB/s`, scaled to its value.
pub fn format_rate(value: f64, unit: &str) -> String {
    match unit {
        "GFLOP/s" => format_flops(value * 1e9),
        "GB/s" => format_bandwidth(value * 1e9),
        other => format!("{} {other}", sig3(value)),
    }
}

/// A row's size as a reader expects it: `4096`, `16 MiB`, `100 steps`, `16Mi elements`.
pub fn format_size(size: usize, unit: &str) -> String {
    match unit {
        "bytes" => format_bytes(size),
        "n" => size.to_string(),
        "elements" if size >= 1 << 20 && size.is_multiple_of(1 << 20) => format!("{}Mi", size >> 20),
        "elements" if size >= 1 << 10 && size.is_multiple_of(1 << 10) => format!("{}Ki", size >> 10),
        other => format!("{size} {other}"),
    }
}

/// A percentage: `87%`, `3.2%`.
pub fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// A factor: `56×`, `1.8×`.
pub fn times(factor: f64) -> String {
    if !factor.is_finite() {
        "–".into()
    } else if factor >= 10.0 {
        format!("{factor:.0}×")
    } else {
        format!("{factor:.1}×")
    }
}

/// How a time compares with another: `ours` against `theirs` (both in seconds), as
/// `56× faster`, `1.8× slower` or `on par` (within 5%), with the tone of the verdict.
pub fn speed(ours: f64, theirs: f64) -> Cell {
    if !(ours > 0.0 && theirs > 0.0 && ours.is_finite() && theirs.is_finite()) {
        return Cell::plain("–");
    }
    let factor = theirs / ours;
    if factor >= PAR {
        Cell::toned(format!("{} faster", times(factor)), Tone::Good)
    } else if factor <= 1.0 / PAR {
        Cell::toned(format!("{} slower", times(1.0 / factor)), Tone::Bad)
    } else {
        Cell::toned("on par", Tone::Even)
    }
}

/// [`speed`] from a ratio of times, ours ÷ theirs (the JSON's `ratio`).
pub fn speed_from_ratio(ours_over_theirs: f64) -> Cell {
    speed(ours_over_theirs, 1.0)
}

/// A row's roofline verdict: the bound and the fraction of its ceiling (`compute 98%`), or,
/// under [`BOUND_FLOOR`], `below ceilings` with the nearest one named (`3.2% of bandwidth`).
pub fn bound_cell(row: &Row) -> Cell {
    match (row.bound, row.fraction_of_ceiling) {
        (Some(bound), Some(f)) => verdict(bound, f),
        _ => Cell::plain("–"),
    }
}

/// The verdict for `fraction` of the ceiling of `bound`.
pub fn verdict(bound: Bound, fraction: f64) -> Cell {
    if fraction >= BOUND_FLOOR {
        Cell::toned(format!("{} {}", bound.name(), percent(fraction)), Tone::Plain)
    } else {
        Cell::toned(
            format!("below ceilings ({} of {})", percent(fraction), bound.name()),
            Tone::Muted,
        )
    }
}

/// A wgpu `Features { … }` debug dump as the feature names, lower-case, sorted, deduplicated:
/// `shader-f16, subgroup, timestamp-query`. Any other text is returned as is.
pub fn feature_list(value: &str) -> String {
    if !value.contains("Features") {
        return value.to_string();
    }
    let mut names: Vec<String> = value
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| {
            t.len() > 1
                && t.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|t| t.to_ascii_lowercase().replace('_', "-"))
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// How a device's rows were timed, in words: the CPU on the host clock (`Instant`), CUDA with
/// events, wgpu with timestamp queries, or the host clock around a device synchronisation.
pub fn clock(backend: &str, timing: &str) -> String {
    match (backend, timing) {
        (_, "host-synchronized") => "host clock around a device sync".into(),
        ("cpu", _) => "host clock (`Instant`)".into(),
        ("cuda", "device-events") => "CUDA events".into(),
        ("wgpu", "device-events") => "wgpu timestamp queries".into(),
        (_, other) => other.to_string(),
    }
}
