//! The report as a list of [`Block`]s — headings, paragraphs, tables, charts — built once from a
//! [`Report`] and rendered by both the Markdown and the HTML writer.
//!
//! Reading order: the run's facts, a table of contents, the summary (per device: where the GPU
//! pays, how close to PyTorch and to the hardware), then one part per section, each ending with
//! every measurement of the section (time, rate, bound, reference) in a collapsed table.

use std::collections::{BTreeMap, BTreeSet};

use super::format::{bound_cell, clock, format_rate, format_seconds, format_size, speed_from_ratio};
use super::{ReferenceStatus, Report, Row};
use crate::bench::cases::Section;

mod fair_reference;
pub(crate) mod findings;
mod matmul_algo;
pub(crate) mod ops_pairs;
mod precision_error;
mod section_devices;
mod section_distributed;
mod section_matmul;
mod section_ops;
mod section_steps;
mod section_training;
mod section_transfers;
mod summary;
mod training_memory;
mod training_pipeline;

/// How a cell reads at a glance (the HTML colours it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tone {
    /// No judgement.
    #[default]
    Plain,
    /// Better: cartage faster, a device ahead.
    Good,
    /// Worse.
    Bad,
    /// On par.
    Even,
    /// Of little weight (below every ceiling, not measured).
    Muted,
}

/// A table cell: its text, an optional note under it (a spread, a share of a peak), its tone.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cell {
    /// The main text; may hold `code` spans.
    pub text: String,
    /// A second, smaller line.
    pub note: Option<String>,
    /// How it reads.
    pub tone: Tone,
}

impl Cell {
    /// A cell without tone or note.
    pub fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            ..Cell::default()
        }
    }

    /// A cell with a tone.
    pub fn toned(text: impl Into<String>, tone: Tone) -> Cell {
        Cell {
            text: text.into(),
            note: None,
            tone,
        }
    }

    /// The same cell with a note under it.
    pub fn with_note(mut self, note: impl Into<String>) -> Cell {
        self.note = Some(note.into());
        self
    }

    /// `–`: not measured.
    pub fn none() -> Cell {
        Cell::toned("–", Tone::Muted)
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::plain(text)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::plain(text)
    }
}

/// A table: header cells and rows of cells.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Header cells.
    pub headers: Vec<String>,
    /// Body rows.
    pub rows: Vec<Vec<Cell>>,
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
    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }
}

/// One piece of the report. Text may hold `code` spans (backticks) and `**strong**` spans.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A heading of level 1–3, with the anchor links point to.
    Heading {
        /// 1–3.
        level: u8,
        /// The text.
        text: String,
        /// The anchor (`sweep`), if links point to it.
        anchor: Option<String>,
    },
    /// A paragraph.
    Paragraph(String),
    /// A bulleted list.
    Bullets(Vec<String>),
    /// Facts as name–value pairs (no header row).
    Facts(Vec<(String, String)>),
    /// A table of contents: (anchor, text) per entry.
    Contents(Vec<(String, String)>),
    /// A table.
    Table(Table),
    /// An SVG chart; `name` is its file stem beside `report.md`.
    Chart {
        /// File stem (`sweep-time-f32`).
        name: String,
        /// Alt text / caption.
        title: String,
        /// The SVG document.
        svg: String,
    },
    /// Blocks shown collapsed under a one-line summary (no charts inside: their files are
    /// written from the top-level blocks only).
    Details {
        /// The line shown while collapsed.
        summary: String,
        /// The collapsed blocks.
        blocks: Vec<Block>,
    },
}

impl Block {
    /// A heading without an anchor.
    pub fn heading(level: u8, text: impl Into<String>) -> Block {
        Block::Heading {
            level,
            text: text.into(),
            anchor: None,
        }
    }

    /// A heading that links can point to.
    pub fn anchored(level: u8, text: impl Into<String>, anchor: impl Into<String>) -> Block {
        Block::Heading {
            level,
            text: text.into(),
            anchor: Some(anchor.into()),
        }
    }
}

/// The anchor of a section (`sweep`, `small-tensors`).
pub fn section_anchor(section: Section) -> String {
    serde_json::to_value(section)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("section-{}", section.number()))
}

/// The whole report as blocks, in reading order.
pub fn build(report: &Report) -> Vec<Block> {
    let mut blocks = header(report);
    let mut contents = vec![("summary".to_string(), "Summary".to_string())];
    contents.extend(
        Section::ALL
            .iter()
            .map(|&s| (section_anchor(s), format!("{}. {}", s.number(), s.title()))),
    );
    blocks.push(Block::Contents(contents));
    blocks.push(Block::anchored(2, "Summary", "summary"));
    blocks.extend(summary::build(report));
    for section in Section::ALL {
        blocks.push(Block::anchored(
            2,
            format!("{}. {} ({})", section.number(), section.title(), section.requirements()),
            section_anchor(section),
        ));
        blocks.extend(match section {
            Section::Devices => section_devices::build(report),
            Section::Sweep => section_matmul::sweep(report),
            Section::SmallTensors => section_matmul::small_tensors(report),
            Section::Transfers => section_transfers::build(report),
            Section::Syncs => section_steps::syncs(report),
            Section::Memory => section_steps::memory(report),
            Section::Precision => {
                let mut blocks = section_matmul::precision(report);
                blocks.extend(matmul_algo::build(report));
                blocks
            }
            Section::Elementwise => section_steps::elementwise(report),
            Section::Ops => section_ops::build(report),
            Section::Training => section_training::build(report),
            Section::Distributed => section_distributed::build(report),
        });
        let empty = report.section_rows(section).next().is_none() && report.section_skips(section).next().is_none();
        if empty && section != Section::Devices {
            blocks.push(Block::Paragraph("Nothing was measured in this section.".into()));
        }
        blocks.extend(skips(report, section));
        blocks.extend(every_row(report, section));
    }
    blocks
}

fn header(report: &Report) -> Vec<Block> {
    let m = &report.meta;
    let devices = report
        .devices
        .iter()
        .map(|d| {
            format!(
                "`{}` {}{} — timed with {}",
                d.device,
                d.name,
                if d.software { ", software" } else { "" },
                clock(&d.backend, &d.timing)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let facts = vec![
        ("Date".to_string(), m.date.clone()),
        ("Commit".to_string(), format!("`{}`", m.commit)),
        (
            "Host".to_string(),
            format!("{} — {}, {} logical cores", m.host, m.cpu, m.cores),
        ),
        ("Devices".to_string(), devices),
        (
            "Mode".to_string(),
            if m.quick {
                "quick (small sizes, short budgets: a smoke test, not a measurement to quote)".into()
            } else {
                "full".into()
            },
        ),
        ("Command".to_string(), format!("`{}`", m.command)),
        ("Run time".to_string(), format_seconds(m.duration_s)),
        ("Reference".to_string(), reference_status(report)),
    ];
    let mut blocks = vec![
        Block::heading(1, "cartage benchmark report"),
        Block::Facts(facts),
        Block::Paragraph(
            "Every time is the median of the steady state after a warm-up, read only after the device \
             finished; p10–p90 give the spread (the small line under a time). Each row is placed against its \
             device's ceilings measured in this run (section 1): its flops at the best matmul rate, its bytes \
             at the copy bandwidth (or the host link for transfers), and its op count at the cost of the \
             cheapest op measured. The largest of those predicted times names the bound — `compute`, \
             `bandwidth` or `latency` (fixed costs per op: checks, allocation, launch, sync) — and \
             prediction ÷ measured time is the share of that ceiling reached. Under 25% of it, no ceiling \
             explains the time (transcendental arithmetic, conversions or the implementation do), and the \
             row reads `below ceilings`."
                .into(),
        ),
    ];
    blocks.extend(fair_reference::paragraph(report));
    blocks
}

/// `PyTorch` for `torch 2.11.0`, `numpy` for `numpy 2.4.6`.
pub fn library_name(library: &str) -> &str {
    match library.split_whitespace().next().unwrap_or(library) {
        "torch" => "PyTorch",
        other => other,
    }
}

/// The reference libraries of these rows, by name, with the devices each ran for.
fn libraries<'a>(rows: impl Iterator<Item = &'a Row>) -> BTreeMap<String, BTreeSet<String>> {
    let mut libs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in rows {
        if let Some(r) = &row.reference {
            libs.entry(library_name(&r.library).to_string())
                .or_default()
                .insert(row.device.clone());
        }
    }
    libs
}

/// The header's reference line: each library's version once, and the devices it ran for.
fn reference_status(report: &Report) -> String {
    match &report.reference {
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
            settings,
        } => {
            let used = libraries(report.rows.iter());
            let devices = |name: &str| match used.get(name) {
                Some(d) => format!(
                    " for {}",
                    d.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", ")
                ),
                None => " (not used)".into(),
            };
            let mut libs = Vec::new();
            if let Some(t) = torch {
                let cuda = torch_cuda
                    .as_ref()
                    .map(|c| format!(", CUDA on {c}"))
                    .unwrap_or_default();
                libs.push(format!("PyTorch {t}{}{cuda}", devices("PyTorch")));
            }
            if let Some(n) = numpy {
                libs.push(format!("numpy {n}{}", devices("numpy")));
            }
            let settings = if settings.is_empty() {
                String::new()
            } else {
                format!(
                    "; run with {}",
                    settings
                        .iter()
                        .map(|(name, value)| format!("`{name}` = `{value}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            format!(
                "{} (`{python}`); {measured} cases measured, {} without a counterpart{settings}",
                libs.join("; "),
                skipped.len()
            )
        }
    }
}

/// The column title for the reference of these rows: `PyTorch`, `numpy`, or `Reference` when
/// they mix libraries.
pub fn reference_title<'a>(rows: impl Iterator<Item = &'a Row>) -> String {
    let libs = libraries(rows);
    match libs.keys().collect::<Vec<_>>().as_slice() {
        [one] => (*one).clone(),
        _ => "Reference".into(),
    }
}

fn skips(report: &Report, section: Section) -> Option<Block> {
    let items: Vec<String> = report
        .section_skips(section)
        .map(|s| format!("`{}` {} {} {}: {}", s.device, s.case, s.dtype, s.size, s.reason))
        .collect();
    match items.len() {
        0 => None,
        1..=4 => Some(Block::Bullets(
            items.into_iter().map(|i| format!("not measured — {i}")).collect(),
        )),
        n => Some(Block::Details {
            summary: format!("{n} cases not measured, with the reason"),
            blocks: vec![Block::Bullets(items)],
        }),
    }
}

/// Every measurement of a section, collapsed: time, rate, bound and the reference's figure.
fn every_row(report: &Report, section: Section) -> Option<Block> {
    let rows: Vec<&Row> = report.section_rows(section).collect();
    if rows.is_empty() {
        return None;
    }
    let with_reference = rows.iter().any(|r| r.reference.is_some());
    let reference = reference_title(rows.iter().copied());
    let mixed = reference == "Reference";
    let mut headers = vec!["Device", "Case", "dtype", "Size", "Time", "Rate", "Bound"];
    let against = format!("cartage against {reference}");
    if with_reference {
        headers.push(&reference);
        headers.push(&against);
    }
    let mut table = Table::new(&headers);
    for row in &rows {
        let mut cells = vec![
            Cell::plain(format!("`{}`", row.device)),
            Cell::plain(row.case.clone()),
            Cell::plain(row.dtype.clone()),
            Cell::plain(format_size(row.size, &row.size_unit)),
            time_cell(row),
            rate_cell(row),
            bound_cell(row),
        ];
        if with_reference {
            match &row.reference {
                Some(r) => {
                    let time = Cell::plain(format_seconds(r.median));
                    cells.push(if mixed {
                        time.with_note(library_name(&r.library))
                    } else {
                        time
                    });
                    cells.push(speed_from_ratio(r.ratio));
                }
                None => cells.extend([Cell::none(), Cell::none()]),
            }
        }
        table.push(cells);
    }
    Some(Block::Details {
        summary: format!(
            "Every measurement of this section ({} rows): time, rate, bound{}",
            rows.len(),
            if with_reference {
                format!(" and {reference}")
            } else {
                String::new()
            }
        ),
        blocks: vec![Block::Table(table)],
    })
}

/// The position of `device` in the report's device list: its colour family in the charts.
pub fn family(report: &Report, device: &str) -> usize {
    report.devices.iter().position(|d| d.device == device).unwrap_or(0)
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

/// A row's median, with its p10–p90 spread as the note: `1.23 ms` over `1.20–1.31 ms`.
pub fn time_cell(row: &Row) -> Cell {
    Cell::plain(format_seconds(row.median)).with_note(spread(row.p10, row.p90))
}

/// `1.20–1.31 ms`, or `953 µs–1.02 ms` across units.
pub fn spread(p10: f64, p90: f64) -> String {
    let (a, b) = (format_seconds(p10), format_seconds(p90));
    match (a.split_once(' '), b.split_once(' ')) {
        (Some((x, ua)), Some((y, ub))) if ua == ub => format!("{x}–{y} {ub}"),
        _ => format!("{a}–{b}"),
    }
}

/// The range of a case run several times, for the note under its median: `3 runs: 1.20–1.31 ms`
/// (min–max of the per-run medians); `None` for a case run once.
pub fn runs_note(runs: &[f64]) -> Option<String> {
    let s = super::spread::Spread::of(runs).filter(|_| runs.len() > 1)?;
    Some(format!("{} runs: {}", runs.len(), spread(s.min, s.max)))
}

/// A row's rate, scaled to its value (`51.1 TFLOP/s`, `4.01 TB/s`).
pub fn rate_cell(row: &Row) -> Cell {
    match (row.rate, &row.rate_unit) {
        (Some(v), Some(unit)) => Cell::plain(format_rate(v, unit)),
        _ => Cell::none(),
    }
}
