//! Sections 5, 6 and 8: per-step host syncs against accumulating on the device (R5),
//! `empty_cache` every step (R21), and elementwise ops and reductions against the bandwidth
//! ceiling (R1).

use super::{Block, Cell, Table, bound_cell, devices_in, family};
use crate::bench::cases::Section;
use crate::bench::report::charts::{Axis, BarChart, Bars, Rule, Scale, Unit, style};
use crate::bench::report::format::{format_bandwidth, format_seconds, format_size, speed};
use crate::bench::report::{Report, Row};

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

fn per_step(row: Option<&Row>) -> Cell {
    row.map(|r| Cell::plain(format_seconds(r.median / r.size.max(1) as f64)))
        .unwrap_or_else(Cell::none)
}

fn counter(row: Option<&Row>, name: &str) -> Cell {
    row.and_then(|r| r.counters.get(name))
        .map(|v| Cell::plain(format!("{v:.0}")))
        .unwrap_or_else(Cell::none)
}

fn bound(row: Option<&Row>) -> Cell {
    row.map(bound_cell).unwrap_or_else(Cell::none)
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
        "bound",
        "accumulate on device: per step",
        "host syncs",
        "bound",
        "accumulating against item()",
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
            format!("`{d}`").into(),
            any.size.to_string().into(),
            per_step(every),
            counter(every, "host_syncs"),
            bound(every),
            per_step(once),
            counter(once, "host_syncs"),
            bound(once),
            match (every, once) {
                (Some(a), Some(b)) => speed(b.median, a.median),
                _ => Cell::none(),
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
        "bound",
        "empty_cache every step: per step",
        "segments allocated / step",
        "bound",
        "empty_cache against keeping the cache",
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
            format!("`{d}`").into(),
            any.size.to_string().into(),
            per_step(keep),
            counter(keep, "segment_allocs_per_step"),
            bound(keep),
            per_step(empty),
            counter(empty, "segment_allocs_per_step"),
            bound(empty),
            match (keep, empty) {
                (Some(k), Some(e)) => speed(e.median, k.median),
                _ => Cell::none(),
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
         shown as a share of it. An op far below it is limited by its arithmetic (`exp`, `gelu`), by \
         its implementation, or by its dtype's conversions: under 25% the bound reads `below ceilings`."
            .into(),
    )];
    if devices.is_empty() {
        return blocks;
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    for row in report.section_rows(Section::Elementwise) {
        let key = (row.case.clone(), row.dtype.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    // One row per op and dtype, one column per device: bandwidth, with time and bound under it.
    let mut headers = vec!["Op".to_string(), "dtype".to_string(), "Elements".to_string()];
    headers.extend(devices.iter().map(|d| format!("`{d}`")));
    let mut table = Table {
        headers,
        rows: Vec::new(),
    };
    for (case, dtype) in &keys {
        let rows: Vec<Option<&Row>> = devices
            .iter()
            .map(|d| {
                report
                    .section_rows(Section::Elementwise)
                    .filter(|r| &r.device == d && &r.case == case && &r.dtype == dtype)
                    .max_by_key(|r| r.size)
            })
            .collect();
        let size = rows
            .iter()
            .flatten()
            .next()
            .map(|r| format_size(r.size, &r.size_unit))
            .unwrap_or_default();
        let mut cells: Vec<Cell> = vec![case.clone().into(), dtype.clone().into(), size.into()];
        for r in rows {
            cells.push(match r {
                Some(r) => {
                    let bound = bound_cell(r);
                    Cell::toned(format_bandwidth(r.work.device_bytes / r.median), bound.tone).with_note(format!(
                        "{} · {}",
                        format_seconds(r.median),
                        bound.text
                    ))
                }
                None => Cell::none(),
            });
        }
        table.push(cells);
    }
    blocks.push(Block::Table(table));
    let f32_ops: Vec<&(String, String)> = keys.iter().filter(|(_, t)| t == "f32").collect();
    let others: Vec<&(String, String)> = keys.iter().filter(|(_, t)| t != "f32").collect();
    let charts = [
        (
            "elementwise-f32",
            "f32 ops as a share of the bandwidth ceiling",
            "op (f32)",
            f32_ops,
        ),
        (
            "elementwise-half",
            "f16 and bf16 ops as a share of the bandwidth ceiling",
            "op and dtype",
            others,
        ),
    ];
    for (name, title, x_label, keys) in charts {
        if let Some(svg) = share_chart(report, &devices, title, x_label, &keys).to_svg() {
            blocks.push(Block::Chart {
                name: name.into(),
                title: format!(
                    "{title}: each op's bandwidth (bytes read plus written per second) over the best \
                     streaming op of its device, one bar per device. Under the grey line at 25%, no \
                     ceiling explains the time."
                ),
                svg,
            });
        }
    }
    blocks
}

/// Bars per op (one per device): the op's bandwidth as a share of its device's ceiling.
fn share_chart(
    report: &Report,
    devices: &[String],
    title: &str,
    x_label: &str,
    keys: &[&(String, String)],
) -> BarChart {
    let one_dtype = keys.iter().all(|(_, t)| t == "f32");
    let groups = devices
        .iter()
        .filter_map(|d| {
            let ceiling = report
                .devices
                .iter()
                .find(|e| &e.device == d)
                .and_then(|e| e.ceilings.copy_gbps)?;
            let values = keys
                .iter()
                .map(|(case, dtype)| {
                    report
                        .section_rows(Section::Elementwise)
                        .filter(|r| &r.device == d && &r.case == case && &r.dtype == dtype)
                        .max_by_key(|r| r.size)
                        .map(|r| r.work.device_bytes / r.median / 1e9 / ceiling * 100.0)
                })
                .collect();
            Some(Bars {
                name: format!("{d}: 100% = {}", format_bandwidth(ceiling * 1e9)),
                values,
                color: style::style(family(report, d), 0).color,
            })
        })
        .collect();
    BarChart {
        title: title.into(),
        x_label: x_label.into(),
        categories: keys
            .iter()
            .map(|(case, dtype)| {
                if one_dtype {
                    case.clone()
                } else {
                    format!("{case} {dtype}")
                }
            })
            .collect(),
        y: Axis::new("share of the bandwidth ceiling", Scale::Linear, Unit::Percent),
        groups,
        levels: vec![Rule {
            at: 25.0,
            label: "25%: below it, no ceiling\nexplains the time".into(),
            color: style::REFERENCE,
        }],
    }
}
