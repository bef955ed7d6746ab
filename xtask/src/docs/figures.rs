//! The figures the documents quote, each rendered as Markdown from the committed reports with
//! the report's own number formats and verdicts (`1.3× faster`, `on par` within 5%).
//!
//! - `h200-vs-pytorch`: the H200's headline rows against PyTorch (matmul, element-wise ops,
//!   softmax, transfers, training steps);
//! - `cpu-vs-numpy`: the 2-core VM's CPU rows against numpy;
//! - `lessons-measured`: one figure per lesson the report measures, on the H200 machine's GPU
//!   and CPU and on the VM's CPU.

use std::collections::BTreeMap;

use crate::bench::cases::{Case, Section, VectorOp};
use crate::bench::report::blocks::findings;
use crate::bench::report::blocks::{Block, Cell, Table};
use crate::bench::report::format::{
    format_bandwidth, format_bytes, format_flops, format_seconds, format_size, percent, speed, speed_from_ratio,
};
use crate::bench::report::{ReferenceStatus, Report, Row, markdown};

use super::Reports;

/// Every figure name, in the order the documents use them.
pub const NAMES: [&str; 3] = ["h200-vs-pytorch", "cpu-vs-numpy", "lessons-measured"];

/// The Markdown of figure `name`.
pub fn render(name: &str, reports: &Reports) -> anyhow::Result<String> {
    let blocks = match name {
        "h200-vs-pytorch" => versus(&reports.h200, "cuda", H200_ROWS),
        "cpu-vs-numpy" => versus(&reports.vm, "cpu", VM_ROWS),
        "lessons-measured" => lessons(reports),
        other => anyhow::bail!("no figure is named `{other}`; the figures are {}", NAMES.join(", ")),
    };
    Ok(markdown::render(&blocks))
}

/// A row to quote: its label, section, case, dtype, and size (the largest measured with a
/// reference when `None`).
type Pick = (&'static str, Section, &'static str, &'static str, Option<usize>);

const H200_ROWS: &[Pick] = &[
    ("matmul", Section::Sweep, "matmul", "f32", None),
    ("matmul, TF32", Section::Precision, "matmul_tf32", "f32", None),
    ("matmul", Section::Sweep, "matmul", "bf16", None),
    ("add", Section::Elementwise, "add", "f32", None),
    ("gelu", Section::Elementwise, "gelu", "f32", None),
    ("sum of each row", Section::Elementwise, "sum_rows", "f32", None),
    ("softmax of each row", Section::Elementwise, "softmax", "f32", None),
    ("softmax", Section::Ops, "softmax", "bf16", None),
    ("layer_norm", Section::Ops, "layer_norm", "f32", None),
    ("host → device, pinned", Section::Transfers, "h2d_pinned", "f32", None),
    ("device → host, pinned", Section::Transfers, "d2h_pinned", "f32", None),
    (
        "host → device, pageable",
        Section::Transfers,
        "h2d_pageable",
        "f32",
        None,
    ),
    ("MLP training step", Section::Training, "mlp_train", "f32", None),
    (
        "MLP training step",
        Section::Training,
        "mlp_train_bf16_autocast",
        "f32",
        None,
    ),
    ("GPT training step", Section::Training, "gpt_train", "f32", None),
    (
        "GPT training step",
        Section::Training,
        "gpt_train_bf16_autocast",
        "f32",
        None,
    ),
    ("AdamW update", Section::Training, "adamw_step", "f32", None),
];

const VM_ROWS: &[Pick] = &[
    ("matmul", Section::Sweep, "matmul", "f32", None),
    ("matmul", Section::Sweep, "matmul", "f32", Some(256)),
    (
        "1000 separate 8×8 matmuls",
        Section::SmallTensors,
        "matmul_loop",
        "f32",
        None,
    ),
    (
        "one batched [1000, 8, 8] matmul",
        Section::SmallTensors,
        "matmul_batched",
        "f32",
        None,
    ),
    ("add", Section::Elementwise, "add", "f32", None),
    ("exp", Section::Elementwise, "exp", "f32", None),
    ("sum of each row", Section::Elementwise, "sum_rows", "f32", None),
    ("softmax of each row", Section::Elementwise, "softmax", "f32", None),
    ("layer_norm", Section::Ops, "layer_norm", "f32", None),
    ("MLP forward and backward", Section::Training, "mlp_step", "f32", None),
    ("AdamW update", Section::Training, "adamw_step", "f32", None),
];

/// The row of `device`'s backend matching `pick`, with a reference.
fn find<'a>(report: &'a Report, backend: &str, pick: &Pick) -> Option<&'a Row> {
    let &(_, section, case, dtype, size) = pick;
    report
        .section_rows(section)
        .filter(|r| r.backend == backend && r.case == case && r.dtype == dtype && r.reference.is_some())
        .filter(|r| size.is_none_or(|s| r.size == s))
        .max_by_key(|r| r.size)
}

/// What one iteration of a row works on, as a reader reads a shape.
fn shape(row: &Row) -> String {
    match &row.params {
        Case::Matmul { n, .. } => format!("{n} × {n}"),
        Case::MatmulLoop { n, .. } | Case::MatmulBatched { n, .. } => format!("{n} × {n}"),
        Case::Vector {
            op: VectorOp::SumRows | VectorOp::Softmax,
            numel,
        } => {
            let side = (*numel as f64).sqrt() as usize;
            format!("[{side}, {side}]")
        }
        Case::HostToDevice { bytes, .. } | Case::DeviceToHost { bytes, .. } => format_bytes(*bytes),
        Case::Vector { numel, .. } => format!("{} elements", format_size(*numel, "elements")),
        Case::Model(op) => op.shape(),
        _ => format_size(row.size, &row.size_unit),
    }
}

/// Where a report was measured: the device, the reference library and the commit.
fn provenance(report: &Report, backend: &str) -> String {
    let device = report
        .devices
        .iter()
        .find(|d| d.backend == backend)
        .map_or_else(|| backend.to_string(), |d| format!("{} (`{}`)", d.name, d.device));
    let library = match &report.reference {
        ReferenceStatus::Ran { torch, numpy, .. } => match (backend, torch, numpy) {
            ("cpu", _, Some(n)) if report.rows.iter().any(|r| r.backend == "cpu" && is_numpy(r)) => {
                format!("numpy {n}")
            }
            (_, Some(t), _) => format!("PyTorch {t}"),
            (_, None, Some(n)) => format!("numpy {n}"),
            _ => "no reference".into(),
        },
        _ => "no reference".into(),
    };
    format!(
        "{device} against {library}, {} logical cores on the host; commit `{}`, {}.",
        report.meta.cores,
        report.meta.commit,
        report.meta.date.split('T').next().unwrap_or(&report.meta.date)
    )
}

fn is_numpy(row: &Row) -> bool {
    row.reference.as_ref().is_some_and(|r| r.library.starts_with("numpy"))
}

/// A table of picked rows of `backend` against the reference library.
fn versus(report: &Report, backend: &str, picks: &[Pick]) -> Vec<Block> {
    let rows: Vec<&Row> = picks.iter().filter_map(|p| find(report, backend, p)).collect();
    let reference = crate::bench::report::blocks::reference_title(rows.iter().copied());
    let against = format!("cartage against {reference}");
    let mut table = Table::new(&["Op", "Shape", "dtype", "cartage", &reference, &against]);
    for pick in picks {
        let Some(row) = find(report, backend, pick) else {
            continue;
        };
        let Some(r) = &row.reference else { continue };
        let dtype = if row.case.ends_with("bf16_autocast") {
            "f32, bf16 autocast".to_string()
        } else {
            row.dtype.clone()
        };
        table.push(vec![
            Cell::plain(pick.0),
            Cell::plain(shape(row)),
            Cell::plain(dtype),
            Cell::plain(format_seconds(row.median)),
            Cell::plain(format_seconds(r.median)),
            speed_from_ratio(r.ratio),
        ]);
    }
    vec![Block::Paragraph(provenance(report, backend)), Block::Table(table)]
}

/// One device's column of the lessons table.
struct Column<'a> {
    report: &'a Report,
    device: String,
}

impl Column<'_> {
    fn row(&self, section: Section, case: &str, dtype: &str) -> Option<&Row> {
        findings::largest(self.report, section, &self.device, case, dtype)
    }

    /// `a` against `b` in words (`5.1× faster`), both the largest rows of their case.
    fn compare(&self, section: Section, a: &str, b: &str) -> String {
        match (self.row(section, a, "f32"), self.row(section, b, "f32")) {
            (Some(a), Some(b)) => speed(a.median, b.median).text,
            _ => "–".into(),
        }
    }
}

/// Per lesson measured, one figure on each of the three devices.
fn lessons(reports: &Reports) -> Vec<Block> {
    let column = |report, backend: &str| -> Option<Column> {
        let device = report_device(report, backend)?;
        Some(Column { report, device })
    };
    let columns: Vec<(String, Column)> = [
        (&reports.h200, "cuda", "the H200 machine"),
        (&reports.h200, "cpu", "the H200 machine"),
        (&reports.vm, "cpu", "the 2-core VM"),
    ]
    .into_iter()
    .filter_map(|(report, backend, host)| {
        column(report, backend).map(|c| (format!("`{}` on {host} ({} cores)", c.device, report.meta.cores), c))
    })
    .collect();
    let mut headers = vec!["Lesson".to_string(), "Measure".to_string()];
    headers.extend(columns.iter().map(|(h, _)| h.clone()));
    let mut table = Table {
        headers,
        rows: Vec::new(),
    };
    type Measure = fn(&Column) -> String;
    let measures: [(&str, &str, Measure); 11] = [
        ("R1", "memory bandwidth (copy)", |c| {
            ceiling(c, |e| e.copy_gbps.map(|g| format_bandwidth(g * 1e9)))
        }),
        ("R1", "best f32 matmul", |c| {
            ceiling(c, |e| e.matmul_gflops.get("f32").map(|g| format_flops(g * 1e9)))
        }),
        ("R1", "cheapest op", |c| {
            ceiling(c, |e| e.op_floor_s.map(format_seconds))
        }),
        (
            "R30",
            "f32 matmul ahead of the CPU from",
            |c| match findings::crossover(c.report, &c.device, "f32") {
                Some(x)
                    if c.report
                        .devices
                        .iter()
                        .any(|d| d.device == c.device && d.backend != "cpu") =>
                {
                    x.from.map_or_else(|| "never".into(), |n| format!("n = {n}"))
                }
                _ => "–".into(),
            },
        ),
        (
            "R30",
            "f32 matmul at the largest n, against the CPU",
            |c| match findings::crossover(c.report, &c.device, "f32") {
                Some(x)
                    if c.report
                        .devices
                        .iter()
                        .any(|d| d.device == c.device && d.backend != "cpu") =>
                {
                    let (n, cpu, gpu) = x.last();
                    format!("{} (n = {n})", speed(gpu, cpu).text)
                }
                _ => "–".into(),
            },
        ),
        ("R3", "one batched matmul against 1000 separate 8×8 ones", |c| {
            c.compare(Section::SmallTensors, "matmul_batched", "matmul_loop")
        }),
        ("R9", "host → device, pinned against pageable (largest size)", |c| {
            c.compare(Section::Transfers, "h2d_pinned", "h2d_pageable")
        }),
        ("R10", "copy–compute overlap achieved by prefetching", overlap),
        ("R5", "reading the loss every step, against once", |c| {
            c.compare(Section::Syncs, "loss_item_every_step", "loss_accumulate_on_device")
        }),
        ("R21", "`empty_cache` every step, against keeping the cache", |c| {
            c.compare(Section::Memory, "alloc_empty_cache_every_step", "alloc_keep_cache")
        }),
        ("R24", "bf16 matmul against f32 (precision section)", |c| {
            match (
                c.row(Section::Precision, "matmul", "bf16"),
                c.row(Section::Precision, "matmul", "f32"),
            ) {
                (Some(h), Some(f)) => speed(h.median, f.median).text,
                _ => "–".into(),
            }
        }),
    ];
    for (lesson, what, measure) in measures {
        let mut cells = vec![Cell::plain(lesson), Cell::plain(what)];
        cells.extend(columns.iter().map(|(_, c)| Cell::plain(measure(c))));
        table.push(cells);
    }
    let commits: BTreeMap<&str, &str> = [
        ("the H200 machine", reports.h200.meta.commit.as_str()),
        ("the 2-core VM", reports.vm.meta.commit.as_str()),
    ]
    .into_iter()
    .collect();
    vec![
        Block::Paragraph(format!(
            "Measured by the committed reports: {}.",
            commits
                .iter()
                .map(|(host, commit)| format!("{host} at commit `{commit}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Block::Table(table),
    ]
}

/// The first device of `backend` in a report.
fn report_device(report: &Report, backend: &str) -> Option<String> {
    report
        .devices
        .iter()
        .find(|d| d.backend == backend)
        .map(|d| d.device.clone())
}

fn ceiling(c: &Column, get: impl Fn(&crate::bench::report::Ceilings) -> Option<String>) -> String {
    c.report
        .devices
        .iter()
        .find(|d| d.device == c.device)
        .and_then(|d| get(&d.ceilings))
        .unwrap_or_else(|| "–".into())
}

/// The time prefetching saved over the most overlap could hide, min(copy, compute), as the
/// transfers section computes it; `–` where that is a sliver of a serial pass.
fn overlap(c: &Column) -> String {
    let get = |mode: &str| c.row(Section::Transfers, &format!("pipeline_{mode}"), "f32");
    match (get("copy_only"), get("compute_only"), get("serial"), get("prefetch")) {
        (Some(copy), Some(compute), Some(serial), Some(prefetch)) => {
            let hideable = copy.median.min(compute.median);
            if hideable > 0.05 * serial.median {
                percent(((serial.median - prefetch.median) / hideable).clamp(0.0, 1.0))
            } else {
                "–".into()
            }
        }
        _ => "–".into(),
    }
}
