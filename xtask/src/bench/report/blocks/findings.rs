//! What the rows say, computed once for the summary and the sections: where a device overtakes
//! the CPU in the matmul sweep, and how a device's rows compare with the reference library.

use super::library_name;
use crate::bench::cases::Section;
use crate::bench::report::format::PAR;
use crate::bench::report::{Report, Row};

/// A device against the CPU over the matmul sweep of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Crossover {
    /// (n, CPU seconds, device seconds) at every size both measured, in size order.
    pub pairs: Vec<(usize, f64, f64)>,
    /// The smallest n from which the device stays ahead; `None` if it never does.
    pub from: Option<usize>,
}

impl Crossover {
    /// The largest size measured on both: (n, CPU seconds, device seconds).
    pub fn last(&self) -> (usize, f64, f64) {
        self.pairs[self.pairs.len() - 1]
    }

    /// The smallest size measured on both.
    pub fn first(&self) -> (usize, f64, f64) {
        self.pairs[0]
    }
}

/// The CPU device's name in the report, if it measured one.
pub fn cpu(report: &Report) -> Option<&str> {
    report
        .devices
        .iter()
        .find(|d| d.backend == "cpu")
        .map(|d| d.device.as_str())
}

/// The sweep's `matmul` rows of `device` in `dtype`, by size.
pub fn sweep_rows<'a>(report: &'a Report, device: &str, dtype: &str) -> Vec<&'a Row> {
    let mut rows: Vec<&Row> = report
        .section_rows(Section::Sweep)
        .filter(|r| r.device == device && r.dtype == dtype && r.case == "matmul")
        .collect();
    rows.sort_by_key(|r| r.size);
    rows
}

/// `device` against the CPU over the sweep in `dtype`; `None` without a size both measured.
pub fn crossover(report: &Report, device: &str, dtype: &str) -> Option<Crossover> {
    let cpu = cpu(report)?;
    let gpu_rows = sweep_rows(report, device, dtype);
    let pairs: Vec<(usize, f64, f64)> = sweep_rows(report, cpu, dtype)
        .iter()
        .filter_map(|c| {
            gpu_rows
                .iter()
                .find(|g| g.size == c.size)
                .map(|g| (c.size, c.median, g.median))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let from = (0..pairs.len())
        .find(|&i| pairs[i..].iter().all(|&(_, c, g)| g < c))
        .map(|i| pairs[i].0);
    Some(Crossover { pairs, from })
}

/// A device's rows against the reference library.
#[derive(Clone, Debug)]
pub struct Versus<'a> {
    /// The library (`PyTorch`, `numpy`, or both names joined).
    pub library: String,
    /// The rows with a reference, from cartage's best ratio to its worst.
    pub rows: Vec<&'a Row>,
    /// The geometric mean of cartage's time ÷ the reference's.
    pub geomean: f64,
    /// Rows where cartage is faster by more than 5%.
    pub faster: usize,
    /// Rows within 5%.
    pub par: usize,
    /// Rows where cartage is slower by more than 5%.
    pub slower: usize,
}

/// `device`'s rows against the reference; `None` when none has one.
pub fn versus<'a>(report: &'a Report, device: &str) -> Option<Versus<'a>> {
    let mut rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.device == device)
        .filter(|r| {
            r.reference
                .as_ref()
                .is_some_and(|x| x.ratio.is_finite() && x.ratio > 0.0)
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let ratio = |r: &Row| r.reference.as_ref().map_or(1.0, |x| x.ratio);
    rows.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let geomean = (rows.iter().map(|r| ratio(r).ln()).sum::<f64>() / rows.len() as f64).exp();
    let faster = rows.iter().filter(|r| ratio(r) <= 1.0 / PAR).count();
    let slower = rows.iter().filter(|r| ratio(r) >= PAR).count();
    let mut names: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.reference.as_ref().map(|x| library_name(&x.library)))
        .collect();
    names.sort_unstable();
    names.dedup();
    Some(Versus {
        library: names.join(" or "),
        geomean,
        faster,
        par: rows.len() - faster - slower,
        slower,
        rows,
    })
}

/// The first row of `device` in `section` for `case`, at its largest size.
pub fn largest<'a>(report: &'a Report, section: Section, device: &str, case: &str, dtype: &str) -> Option<&'a Row> {
    report
        .section_rows(section)
        .filter(|r| r.device == device && r.case == case && r.dtype == dtype)
        .max_by_key(|r| r.size)
}

/// The row of `device` in `section` for `case` (any dtype, any size: the first).
pub fn first<'a>(report: &'a Report, section: Section, device: &str, case: &str) -> Option<&'a Row> {
    report
        .section_rows(section)
        .find(|r| r.device == device && r.case == case)
}
