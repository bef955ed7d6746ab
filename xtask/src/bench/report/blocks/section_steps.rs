//! Sections 5, 6 and 8: per-step host syncs against accumulating on the device (R5),
//! `empty_cache` every step (R21), and elementwise ops and reductions against the bandwidth
//! ceiling (R1).

use super::{Block, Table, device_label, devices_in, percent, rate, ratio, time_cell};
use crate::bench::cases::Section;
use crate::bench::report::charts::{LineChart, Scale, Series};
use crate::bench::report::{Report, Row, format_seconds, format_size};

fn pair<'a>(
    report: &'a Report,
    section: Section,
    device: &str,
    a: &str,
    b: &str,
) -> (Option<&'a Row>, Option<&'a Row>) {
    let find = |case: &str| {
        report
            .section_rows(section)
            .find(|r| r.device == device && r.case == case)
    };
    (find(a), find(b))
}

fn per_step(row: Option<&Row>) -> String {
    row.map(|r| format_seconds(r.median / r.size.max(1) as f64))
        .unwrap_or_else(|| "–".into())
}

fn counter(row: Option<&Row>, name: &str) -> String {
    row.and_then(|r| r.counters.get(name))
        .map(|v| format!("{v:.0}"))
        .unwrap_or_else(|| "–".into())
}

pub(super) fn syncs(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Syncs);
    let mut blocks = vec![Block::Paragraph(
        "A training-like loop (`loss = sum(x × w)` per step). One version reads the loss back every step \
         with `item()`, a host sync that makes the host wait for the device and leaves the device idle \
         while the host catches up; the other adds the losses on the device and reads once at the end. \
         Host syncs are counted by `cartage::stats()` in one pass of each loop."
            .into(),
    )];
    if devices.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&[
        "Device",
        "Steps",
        "item() every step: per step",
        "host syncs",
        "accumulate on device: per step",
        "host syncs",
        "every step ÷ accumulate",
    ]);
    for d in &devices {
        let (every, once) = pair(
            report,
            Section::Syncs,
            d,
            "loss_item_every_step",
            "loss_accumulate_on_device",
        );
        let Some(any) = every.or(once) else { continue };
        table.push(vec![
            format!("`{d}`"),
            any.size.to_string(),
            per_step(every),
            counter(every, "host_syncs"),
            per_step(once),
            counter(once, "host_syncs"),
            match (every, once) {
                (Some(a), Some(b)) => ratio(a.median / b.median),
                _ => "–".into(),
            },
        ]);
    }
    blocks.push(Block::Table(table));
    blocks
}

pub(super) fn memory(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Memory);
    let mut blocks = vec![Block::Paragraph(
        "A loop that allocates temporaries of mixed sizes each step. With the cache kept, steady-state \
         allocations are served from cached blocks; `empty_cache()` every step hands the segments back to \
         the device, so the next step must ask the device (or the host allocator) for them again. \
         Segment allocations per step come from `memory_stats()`."
            .into(),
    )];
    if devices.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&[
        "Device",
        "Steps",
        "keep cache: per step",
        "segments allocated / step",
        "empty_cache every step: per step",
        "segments allocated / step",
        "slowdown",
    ]);
    for d in &devices {
        let (keep, empty) = pair(
            report,
            Section::Memory,
            d,
            "alloc_keep_cache",
            "alloc_empty_cache_every_step",
        );
        let Some(any) = keep.or(empty) else { continue };
        table.push(vec![
            format!("`{d}`"),
            any.size.to_string(),
            per_step(keep),
            counter(keep, "segment_allocs_per_step"),
            per_step(empty),
            counter(empty, "segment_allocs_per_step"),
            match (keep, empty) {
                (Some(k), Some(e)) => format!("{:+.0}%", (e.median / k.median - 1.0) * 100.0),
                _ => "–".into(),
            },
        ]);
    }
    blocks.push(Block::Table(table));
    blocks
}

pub(super) fn elementwise(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Elementwise);
    let mut blocks = vec![Block::Paragraph(
        "Elementwise ops and reductions read and write each element once: their ceiling is memory \
         bandwidth, not arithmetic. The ceiling is the best bandwidth (bytes read plus written per second) \
         of these ops on the device — usually `copy`, sometimes a reduction, which only reads; each op is \
         shown as a fraction of it. An op far below it is limited by its arithmetic (`exp`, `gelu`), by \
         its implementation, or by its dtype's conversions."
            .into(),
    )];
    if devices.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&[
        "Device",
        "Op",
        "dtype",
        "Elements",
        "Time",
        "Bandwidth",
        "of bandwidth ceiling",
        "Bound",
    ]);
    let mut ops: Vec<String> = Vec::new();
    for row in report.section_rows(Section::Elementwise) {
        if !ops.contains(&row.case) {
            ops.push(row.case.clone());
        }
    }
    let mut series = Vec::new();
    for d in &devices {
        let rows: Vec<&Row> = report
            .section_rows(Section::Elementwise)
            .filter(|r| &r.device == d)
            .collect();
        let copy = report
            .devices
            .iter()
            .find(|e| &e.device == d)
            .and_then(|e| e.ceilings.copy_gbps);
        for r in &rows {
            let gbps = r.work.device_bytes / r.median / 1e9;
            table.push(vec![
                format!("`{d}`"),
                r.case.clone(),
                r.dtype.clone(),
                format_size(r.size, &r.size_unit),
                time_cell(r),
                rate(gbps, "GB/s"),
                copy.map(|c| percent(gbps / c)).unwrap_or_else(|| "–".into()),
                r.bound.map(|b| b.name().to_string()).unwrap_or_else(|| "–".into()),
            ]);
        }
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.dtype == "f32")
            .filter_map(|r| {
                let x = ops.iter().position(|o| o == &r.case)? as f64;
                Some((x, r.work.device_bytes / r.median / 1e9 / copy? * 100.0))
            })
            .collect();
        if !points.is_empty() {
            series.push(Series {
                name: device_label(report, d),
                points,
                dashed: false,
            });
        }
    }
    blocks.push(Block::Table(table));
    let chart = LineChart {
        title: "f32 ops as % of the device's bandwidth ceiling".into(),
        x_label: "op".into(),
        y_label: "% of bandwidth ceiling".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_categories: ops,
        series,
    };
    if let Some(svg) = chart.to_svg() {
        blocks.push(Block::Chart {
            name: "elementwise".into(),
            title: "f32 elementwise ops and reductions as a fraction of the bandwidth ceiling".into(),
            svg,
        });
    }
    blocks
}
