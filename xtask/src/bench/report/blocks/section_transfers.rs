//! Section 4: pageable against pinned bandwidth over sizes (R9), per-field moves against one packed
//! move (R4), and a prefetching pipeline against a serial one (R10).

use std::collections::BTreeSet;

use super::{Block, Cell, Table, devices_in, family, library_name, time_cell};
use crate::bench::cases::{Case, Section};
use crate::bench::report::charts::{Axis, LineChart, Rule, Scale, Series, Unit, style};
use crate::bench::report::format::{format_bandwidth, format_bytes, format_seconds, percent, speed};
use crate::bench::report::{Report, Row, peaks};

fn find<'a>(report: &'a Report, device: &str, case: &str, size: usize) -> Option<&'a Row> {
    report
        .section_rows(Section::Transfers)
        .find(|r| r.device == device && r.case == case && r.size == size)
}

/// Bytes per second over the host link.
fn bandwidth(row: &Row) -> f64 {
    row.work.link_bytes / row.median
}

pub(super) fn build(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Transfers);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut blocks = vec![Block::Paragraph(
        "Host→device (`Tensor::from_slice` from ordinary memory, against `copy_from_pinned_async` from a \
         `PinnedBuffer`) and device→host (`to_vec`, against `copy_to_pinned_async`). A driver copies \
         pageable memory through its own pinned staging buffer, so pinned memory saves a copy and can run \
         asynchronously. On the CPU both are memory copies. The charts draw pinned copies solid and \
         pageable ones dashed, the reference library's pinned copies dotted, and the host link's \
         datasheet bandwidth where the device is a known one."
            .into(),
    )];
    let mut table = Table::new(&[
        "Device",
        "Size",
        "H2D pageable",
        "H2D pinned",
        "pinned against pageable",
        "D2H pageable",
        "D2H pinned",
        "pinned against pageable",
    ]);
    for d in &devices {
        let sizes: BTreeSet<usize> = report
            .section_rows(Section::Transfers)
            .filter(|r| &r.device == d && (r.case.starts_with("h2d") || r.case.starts_with("d2h")))
            .map(|r| r.size)
            .collect();
        for &size in &sizes {
            let row = |case: &str| find(report, d, case, size);
            let cell = |r: Option<&Row>| {
                r.map(|r| Cell::plain(format_bandwidth(bandwidth(r))).with_note(format_seconds(r.median)))
                    .unwrap_or_else(Cell::none)
            };
            let versus = |pinned: Option<&Row>, pageable: Option<&Row>| match (pinned, pageable) {
                (Some(p), Some(q)) => speed(p.median, q.median),
                _ => Cell::none(),
            };
            table.push(vec![
                format!("`{d}`").into(),
                format_bytes(size).into(),
                cell(row("h2d_pageable")),
                cell(row("h2d_pinned")),
                versus(row("h2d_pinned"), row("h2d_pageable")),
                cell(row("d2h_pageable")),
                cell(row("d2h_pinned")),
                versus(row("d2h_pinned"), row("d2h_pageable")),
            ]);
        }
    }
    blocks.push(Block::Table(table));
    for (direction, title) in [("h2d", "Host→device bandwidth"), ("d2h", "Device→host bandwidth")] {
        let chart = transfer_chart(report, &devices, direction, title);
        let has_reference = chart.series.iter().any(|s| s.style.dash == style::Dash::Dotted);
        let caption = format!(
            "{title} against the size of one copy: from pinned memory solid, from pageable memory dashed{}.{}",
            if has_reference {
                ", the reference library's pinned copies dotted"
            } else {
                ""
            },
            if chart.levels.is_empty() {
                ""
            } else {
                " The grey dashed line is the host link's datasheet bandwidth in one direction."
            }
        );
        if let Some(svg) = chart.to_svg() {
            blocks.push(Block::Chart {
                name: format!("transfers-{direction}"),
                title: caption,
                svg,
            });
        }
    }
    blocks.extend(move_batch(report, &devices));
    blocks.extend(pipeline(report, &devices));
    blocks
}

/// Bandwidth over sizes for one direction: pinned and pageable per device, the reference's
/// pinned copies, and each known host link's datasheet bandwidth.
fn transfer_chart(report: &Report, devices: &[String], direction: &str, title: &str) -> LineChart {
    let mut series = Vec::new();
    let mut sizes = BTreeSet::new();
    for d in devices {
        let f = family(report, d);
        for (kind, variant) in [("pinned", 0), ("pageable", 1)] {
            let case = format!("{direction}_{kind}");
            let mut rows: Vec<&Row> = report
                .section_rows(Section::Transfers)
                .filter(|r| &r.device == d && r.case == case)
                .collect();
            rows.sort_by_key(|r| r.size);
            if rows.is_empty() {
                continue;
            }
            sizes.extend(rows.iter().map(|r| r.size));
            series.push(Series {
                name: format!("{d} {kind}"),
                points: rows.iter().map(|r| (r.size as f64, bandwidth(r))).collect(),
                style: style::style(f, variant),
            });
            if kind != "pinned" {
                continue;
            }
            let reference: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|r| Some((r.size as f64, r.work.link_bytes / r.reference.as_ref()?.median)))
                .collect();
            if let Some(library) = rows.iter().find_map(|r| r.reference.as_ref()) {
                series.push(Series {
                    name: format!("{d} {} pinned", library_name(&library.library)),
                    points: reference,
                    style: style::style(f, 2),
                });
            }
        }
    }
    let mut levels: Vec<Rule> = Vec::new();
    for d in devices {
        let Some(entry) = report.devices.iter().find(|e| &e.device == d) else {
            continue;
        };
        let Some(p) = peaks::lookup(&entry.name, entry.software) else {
            continue;
        };
        if levels.iter().any(|l| l.at == p.host_link) {
            continue;
        }
        levels.push(Rule {
            at: p.host_link,
            label: format!(
                "{} datasheet:\n{}, {}",
                p.link,
                format_bandwidth(p.host_link),
                "one way"
            ),
            color: style::REFERENCE,
        });
    }
    LineChart {
        title: title.into(),
        x: Axis::new("bytes per copy", Scale::Log, Unit::Bytes).ticks_at(sizes.iter().map(|&s| s as f64)),
        y: Axis::new("bandwidth", Scale::Log, Unit::Bandwidth),
        series,
        levels,
        marks: Vec::new(),
    }
}

fn move_batch(report: &Report, devices: &[String]) -> Vec<Block> {
    let mut table = Table::new(&[
        "Device",
        "Batch",
        "one move per field",
        "one packed move",
        "packed against per-field",
    ]);
    for d in devices {
        let rows = |case: &str| {
            report
                .section_rows(Section::Transfers)
                .find(|r| &r.device == d && r.case == case)
        };
        let (per_field, packed) = (rows("move_per_field"), rows("move_packed"));
        let Some(any) = per_field.or(packed) else { continue };
        let batch = match any.params {
            Case::MoveBatch {
                fields, field_bytes, ..
            } => format!("{fields} fields × {}", format_bytes(field_bytes)),
            _ => format_bytes(any.size),
        };
        table.push(vec![
            format!("`{d}`").into(),
            batch.into(),
            per_field.map(time_cell).unwrap_or_else(Cell::none),
            packed.map(time_cell).unwrap_or_else(Cell::none),
            match (per_field, packed) {
                (Some(a), Some(b)) => speed(b.median, a.median),
                _ => Cell::none(),
            },
        ]);
    }
    if table.rows.is_empty() {
        return Vec::new();
    }
    vec![
        Block::heading(3, "Per-field moves against one packed move"),
        Block::Paragraph(
            "A batch of small fields moved to the device one tensor at a time, against the same bytes packed \
             in one host buffer, moved once and split into views on the device."
                .into(),
        ),
        Block::Table(table),
    ]
}

fn pipeline(report: &Report, devices: &[String]) -> Vec<Block> {
    let mut table = Table::new(&[
        "Device",
        "Batches",
        "copy only",
        "compute only",
        "serial",
        "prefetch",
        "PrefetchLoader",
        "prefetch against serial",
        "overlap achieved (prefetch, loader)",
    ]);
    for d in devices {
        let row = |mode: &str| {
            report
                .section_rows(Section::Transfers)
                .find(|r| &r.device == d && r.case == format!("pipeline_{mode}"))
        };
        let (copy, compute, serial) = (row("copy_only"), row("compute_only"), row("serial"));
        let (prefetch, loader) = (row("prefetch"), row("loader"));
        let Some(any) = serial.or(prefetch).or(loader) else {
            continue;
        };
        let batches = match any.params {
            Case::Pipeline {
                batches, batch_bytes, ..
            } => format!("{batches} × {}", format_bytes(batch_bytes)),
            _ => String::new(),
        };
        let seconds = |r: Option<&Row>| r.map(|r| format_seconds(r.median).into()).unwrap_or_else(Cell::none);
        // Time saved over the most that overlap could hide: min(copy, compute). When that is a
        // sliver of the serial time, noise would dominate the ratio: say so instead.
        let overlap = |overlapped: Option<&Row>| match (copy, compute, serial, overlapped) {
            (Some(c), Some(k), Some(s), Some(o)) if c.median.min(k.median) > 0.05 * s.median => {
                percent(((s.median - o.median) / c.median.min(k.median)).clamp(0.0, 1.0))
            }
            (Some(c), Some(k), Some(s), Some(_)) => format!(
                "n/a ({} is {} of a serial pass)",
                if c.median < k.median { "the copy" } else { "the compute" },
                percent(c.median.min(k.median) / s.median)
            ),
            _ => "–".into(),
        };
        table.push(vec![
            format!("`{d}`").into(),
            batches.into(),
            seconds(copy),
            seconds(compute),
            seconds(serial),
            seconds(prefetch),
            seconds(loader),
            match (serial, prefetch) {
                (Some(s), Some(p)) => speed(p.median, s.median),
                _ => Cell::none(),
            },
            format!("{}, {}", overlap(prefetch), overlap(loader)).into(),
        ]);
    }
    if table.rows.is_empty() {
        return Vec::new();
    }
    vec![
        Block::heading(3, "Prefetching against a serial loop"),
        Block::Paragraph(
            "Each step fills a pinned buffer with the next batch, copies it to the device and runs a matmul \
             on it. Serial: copy, wait, compute, wait. Prefetch: the next batch's asynchronous copy runs \
             while this batch computes (two pinned buffers, two device buffers). `PrefetchLoader`: cartage's \
             loader (a worker thread staging batches through pinned double buffers) feeding the same compute. \
             Overlap achieved is the time saved over the most that could be hidden, min(copy, compute). A \
             backend whose copies are synchronous (the CPU) has little to overlap."
                .into(),
        ),
        Block::Table(table),
    ]
}
