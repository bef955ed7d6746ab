//! Section 4: pageable against pinned bandwidth over sizes (R9), per-field moves against one packed
//! move (R4), and a prefetching pipeline against a serial one (R10).

use std::collections::BTreeSet;

use super::{Block, Table, device_label, devices_in, percent, rate, ratio, time_cell};
use crate::bench::cases::{Case, Section};
use crate::bench::report::charts::{LineChart, Scale, Series};
use crate::bench::report::{Report, Row, format_bytes, format_seconds};

fn find<'a>(report: &'a Report, device: &str, case: &str, size: usize) -> Option<&'a Row> {
    report
        .section_rows(Section::Transfers)
        .find(|r| r.device == device && r.case == case && r.size == size)
}

fn gbps(row: &Row) -> f64 {
    row.work.link_bytes / row.median / 1e9
}

pub(super) fn build(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Transfers);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut blocks = vec![Block::Paragraph(
        "Host→device (`Tensor::from_slice` from ordinary memory, against `copy_from_pinned_async` from a \
         `PinnedBuffer`) and device→host (`to_vec`, against `copy_to_pinned_async`), in GB/s. A driver copies \
         pageable memory through its own pinned staging buffer, so pinned memory saves a copy and can run \
         asynchronously. On the CPU both are memory copies."
            .into(),
    )];
    let mut table = Table::new(&[
        "Device",
        "Size",
        "H2D pageable",
        "H2D pinned",
        "pinned ÷ pageable",
        "D2H pageable",
        "D2H pinned",
    ]);
    let mut series = Vec::new();
    for d in &devices {
        let sizes: BTreeSet<usize> = report
            .section_rows(Section::Transfers)
            .filter(|r| &r.device == d && r.case.starts_with("h2d"))
            .map(|r| r.size)
            .collect();
        for &size in &sizes {
            let bw = |case: &str| find(report, d, case, size).map(gbps);
            let cell = |v: Option<f64>| v.map(|v| rate(v, "GB/s")).unwrap_or_else(|| "–".into());
            let (pageable, pinned) = (bw("h2d_pageable"), bw("h2d_pinned"));
            table.push(vec![
                format!("`{d}`"),
                format_bytes(size),
                cell(pageable),
                cell(pinned),
                match (pageable, pinned) {
                    (Some(a), Some(b)) => ratio(b / a),
                    _ => "–".into(),
                },
                cell(bw("d2h_pageable")),
                cell(bw("d2h_pinned")),
            ]);
        }
        for (case, dashed) in [("h2d_pageable", true), ("h2d_pinned", false)] {
            let points: Vec<(f64, f64)> = sizes
                .iter()
                .filter_map(|&s| find(report, d, case, s).map(|r| (s as f64, gbps(r))))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: format!("{} {}", device_label(report, d), &case[4..]),
                    points,
                    dashed,
                });
            }
        }
    }
    blocks.push(Block::Table(table));
    let chart = LineChart {
        title: "Host→device bandwidth".into(),
        x_label: "bytes".into(),
        y_label: "GB/s".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Log,
        x_categories: Vec::new(),
        series,
    };
    if let Some(svg) = chart.to_svg() {
        blocks.push(Block::Chart {
            name: "transfers".into(),
            title: "Host→device bandwidth, pageable (dashed) and pinned".into(),
            svg,
        });
    }
    blocks.extend(move_batch(report, &devices));
    blocks.extend(pipeline(report, &devices));
    blocks
}

fn move_batch(report: &Report, devices: &[String]) -> Vec<Block> {
    let mut table = Table::new(&[
        "Device",
        "Batch",
        "one move per field",
        "one packed move",
        "per-field ÷ packed",
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
            format!("`{d}`"),
            batch,
            per_field.map(time_cell).unwrap_or_else(|| "–".into()),
            packed.map(time_cell).unwrap_or_else(|| "–".into()),
            match (per_field, packed) {
                (Some(a), Some(b)) => ratio(a.median / b.median),
                _ => "–".into(),
            },
        ]);
    }
    if table.rows.is_empty() {
        return Vec::new();
    }
    vec![
        Block::Heading(3, "Per-field moves against one packed move".into()),
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
        "serial ÷ prefetch",
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
        let seconds = |r: Option<&Row>| r.map(|r| format_seconds(r.median)).unwrap_or_else(|| "–".into());
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
            format!("`{d}`"),
            batches,
            seconds(copy),
            seconds(compute),
            seconds(serial),
            seconds(prefetch),
            seconds(loader),
            match (serial, prefetch) {
                (Some(s), Some(p)) => ratio(s.median / p.median),
                _ => "–".into(),
            },
            format!("{}, {}", overlap(prefetch), overlap(loader)),
        ]);
    }
    if table.rows.is_empty() {
        return Vec::new();
    }
    vec![
        Block::Heading(3, "Prefetching against a serial loop".into()),
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
