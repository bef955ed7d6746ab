//! The report as a list of [`Block`]s — headings, paragraphs, tables, charts — built once from a
//! [`Report`] and rendered by both the Markdown and the HTML writer.

use super::{ReferenceStatus, Report, Row, format_seconds, format_size};
use crate::bench::cases::Section;

mod section_devices;
mod section_matmul;
mod section_ops;
mod section_steps;
mod section_training;
mod section_transfers;

/// A table: header cells and rows of cells.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Header cells.
    pub headers: Vec<String>,
    /// Body rows.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers and no rows.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }
}

/// One piece of the report. Text may hold `code` spans (backticks).
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A heading of level 1–3.
    Heading(u8, String),
    /// A paragraph.
    Paragraph(String),
    /// A bulleted list.
    Bullets(Vec<String>),
    /// A table.
    Table(Table),
    /// An SVG chart; `name` is its file stem beside `report.md`.
    Chart {
        /// File stem (`sweep-time`).
        name: String,
        /// Alt text / caption.
        title: String,
        /// The SVG document.
        svg: String,
    },
}

/// The whole report as blocks, in reading order.
pub fn build(report: &Report) -> Vec<Block> {
    let mut blocks = header(report);
    for section in Section::ALL {
        blocks.push(Block::Heading(
            2,
            format!("{}. {} ({})", section.number(), section.title(), section.requirements()),
        ));
        blocks.extend(match section {
            Section::Devices => section_devices::build(report),
            Section::Sweep => section_matmul::sweep(report),
            Section::SmallTensors => section_matmul::small_tensors(report),
            Section::Transfers => section_transfers::build(report),
            Section::Syncs => section_steps::syncs(report),
            Section::Memory => section_steps::memory(report),
            Section::Precision => section_matmul::precision(report),
            Section::Elementwise => section_steps::elementwise(report),
            Section::Ops => section_ops::build(report),
            Section::Training => section_training::build(report),
        });
        let empty = report.section_rows(section).next().is_none() && report.section_skips(section).next().is_none();
        if empty && section != Section::Devices {
            blocks.push(Block::Paragraph("Nothing was measured in this section.".into()));
        }
        blocks.extend(skips(report, section));
        blocks.extend(reference_table(report, section));
    }
    blocks
}

fn header(report: &Report) -> Vec<Block> {
    let m = &report.meta;
    let mut facts = Table::new(&["", ""]);
    let mut fact = |k: &str, v: String| facts.push(vec![k.to_string(), v]);
    fact("Date", m.date.clone());
    fact("Commit", format!("`{}`", m.commit));
    fact("Host", format!("{} — {}, {} logical cores", m.host, m.cpu, m.cores));
    fact(
        "Devices",
        report
            .devices
            .iter()
            .map(|d| format!("`{}` {}", d.device, d.name))
            .collect::<Vec<_>>()
            .join("; "),
    );
    fact(
        "Mode",
        if m.quick {
            "quick (small sizes, short budgets: a smoke test, not a measurement to quote)".into()
        } else {
            "full".into()
        },
    );
    fact("Command", format!("`{}`", m.command));
    fact("Run time", format_seconds(m.duration_s));
    fact("Reference", reference_status(&report.reference));
    vec![
        Block::Heading(1, "cartage benchmark report".into()),
        Block::Table(facts),
        Block::Paragraph(
            "Every time is the median of the steady state after a warm-up, timed on the device's own clock \
             (CUDA events, wgpu timestamps, `Instant` on the CPU) and read only after the device finished; \
             p10–p90 give the spread. Each row is placed against its device's ceilings measured in this run \
             (section 1): its flops at the best matmul rate, its bytes at the copy bandwidth (or the host \
             link for transfers), and its op count at the cost of the cheapest op measured. The largest of \
             those predicted times names the bound — `compute`, `bandwidth` or `latency` (fixed costs per \
             op: checks, allocation, launch, sync) — and prediction ÷ measured time is the fraction of the \
             ceiling reached."
                .into(),
        ),
    ]
}

fn reference_status(status: &ReferenceStatus) -> String {
    match status {
        ReferenceStatus::NotRequested => "not run (pass `--vs-torch` to compare with PyTorch or numpy)".into(),
        ReferenceStatus::NotFound { reason } => format!("not found: {reason}"),
        ReferenceStatus::Failed { reason } => format!("failed: {reason}"),
        ReferenceStatus::Ran {
            python,
            torch,
            torch_cuda,
            numpy,
            measured,
            skipped,
        } => {
            let mut libs = Vec::new();
            if let Some(t) = torch {
                libs.push(format!(
                    "torch {t}{}",
                    torch_cuda.as_ref().map(|c| format!(" ({c})")).unwrap_or_default()
                ));
            }
            if let Some(n) = numpy {
                libs.push(format!("numpy {n}"));
            }
            format!(
                "`{python}` with {}; {measured} cases measured, {} without a counterpart",
                libs.join(", "),
                skipped.len()
            )
        }
    }
}

fn skips(report: &Report, section: Section) -> Option<Block> {
    let items: Vec<String> = report
        .section_skips(section)
        .map(|s| format!("`{}` {} {} {}: {}", s.device, s.case, s.dtype, s.size, s.reason))
        .collect();
    (!items.is_empty()).then(|| Block::Bullets(items.into_iter().map(|i| format!("not measured — {i}")).collect()))
}

fn reference_table(report: &Report, section: Section) -> Vec<Block> {
    if section == Section::Devices {
        return Vec::new();
    }
    match &report.reference {
        ReferenceStatus::NotFound { reason } | ReferenceStatus::Failed { reason } => {
            return vec![Block::Paragraph(format!(
                "PyTorch/numpy comparison: not available — {reason}."
            ))];
        }
        ReferenceStatus::NotRequested | ReferenceStatus::Ran { .. } => {}
    }
    let rows: Vec<&Row> = report.section_rows(section).filter(|r| r.reference.is_some()).collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let mut table = Table::new(&[
        "Device",
        "Case",
        "dtype",
        "Size",
        "cartage",
        "Reference",
        "cartage ÷ reference",
    ]);
    for row in rows {
        let Some(reference) = &row.reference else { continue };
        table.push(vec![
            format!("`{}`", row.device),
            row.case.clone(),
            row.dtype.clone(),
            format_size(row.size, &row.size_unit),
            format_seconds(row.median),
            format!("{} ({})", format_seconds(reference.median), reference.library),
            ratio(reference.ratio),
        ]);
    }
    vec![
        Block::Paragraph("Against the reference library, same cases, same method (below 1: cartage is faster):".into()),
        Block::Table(table),
    ]
}

/// `2.3×`, `0.41×`.
pub fn ratio(r: f64) -> String {
    if !r.is_finite() {
        "–".into()
    } else if r >= 10.0 {
        format!("{r:.0}×")
    } else if r >= 1.0 {
        format!("{r:.1}×")
    } else if r >= 0.1 {
        format!("{r:.2}×")
    } else {
        format!("{r:.1e}×")
    }
}

/// A rate with its unit: `123 GFLOP/s`, `7.7 GB/s`.
pub fn rate(value: f64, unit: &str) -> String {
    if value >= 100.0 {
        format!("{value:.0} {unit}")
    } else if value >= 10.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.2} {unit}")
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

/// `cuda:0 (NVIDIA H200)`.
pub fn device_label(report: &Report, device: &str) -> String {
    match report.devices.iter().find(|d| d.device == device) {
        Some(d) => format!("{} ({})", d.device, d.name),
        None => device.to_string(),
    }
}

/// The devices that have rows in `section`, in the order of the device list.
pub fn devices_in(report: &Report, section: Section) -> Vec<String> {
    report
        .devices
        .iter()
        .map(|d| d.device.clone())
        .filter(|d| report.section_rows(section).any(|r| &r.device == d))
        .collect()
}

/// A cell: the row's median and its spread, `1.23 ms (1.20 ms–1.31 ms)`.
pub fn time_cell(row: &Row) -> String {
    format!(
        "{} ({}–{})",
        format_seconds(row.median),
        format_seconds(row.p10),
        format_seconds(row.p90)
    )
}
