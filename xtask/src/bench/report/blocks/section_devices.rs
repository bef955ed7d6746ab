//! Section 1: every backend (compiled in or not), every device found, the ceilings measured in
//! this run — copy bandwidth, host link, matmul rate (R1) — each beside its datasheet peak where
//! the device is a known one, and the devices' capabilities (collapsed).

use super::summary::key_name;
use super::{Block, Cell, Table, Tone};
use crate::bench::report::format::{
    clock, feature_list, format_bandwidth, format_bytes, format_flops, format_seconds, percent, times,
};
use crate::bench::report::peaks;
use crate::bench::report::{Report, Support};

const KEYS: [&str; 4] = ["f32", "f32-tf32", "f16", "bf16"];

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = Vec::new();
    let with_note = report.backends.iter().any(|b| b.problem.is_some());
    let mut headers = vec!["Backend", "Compiled in", "Asked for", "Devices measured"];
    if with_note {
        headers.push("Note");
    }
    let mut backends = Table::new(&headers);
    for b in &report.backends {
        let mut cells: Vec<Cell> = vec![
            format!("`{}`", b.backend).into(),
            yes_no(b.compiled).into(),
            yes_no(b.requested).into(),
            if b.devices.is_empty() {
                Cell::none()
            } else {
                b.devices
                    .iter()
                    .map(|d| format!("`{d}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    .into()
            },
        ];
        if with_note {
            cells.push(b.problem.clone().unwrap_or_default().into());
        }
        backends.push(cells);
    }
    blocks.push(Block::Table(backends));
    if report.devices.is_empty() {
        blocks.push(Block::Paragraph("No device could be measured.".into()));
        return blocks;
    }

    blocks.push(Block::Paragraph(
        "Ceilings measured here: device-memory bandwidth (the best of a large `copy` and the streaming \
         ops of section 8, bytes read plus written), host→device bandwidth from pinned memory at the \
         largest size, the best matmul rate per dtype, and the cheapest op (the fixed cost every op pays \
         at least: checks, allocation, launch). Under each measured device, its datasheet's peaks (dense \
         arithmetic, one direction of the host link) and the share of each the run reached; \"unknown\" \
         where the device is not in the report's table of known parts. The ridge point is the arithmetic \
         intensity (flop per byte) above which an f32 op can be compute-bound rather than bandwidth-bound."
            .into(),
    ));
    let mut ceilings = Table::new(&[
        "Device",
        "Timed with",
        "Memory",
        "Memory bandwidth",
        "Host→device",
        "Matmul f32",
        "TF32",
        "f16",
        "bf16",
        "Cheapest op",
        "Ridge point",
    ]);
    for d in &report.devices {
        let c = &d.ceilings;
        let ridge = match (c.matmul_gflops.get("f32"), c.copy_gbps) {
            (Some(f), Some(b)) if b > 0.0 => format!("{:.1} flop/B", f / b).into(),
            _ => Cell::none(),
        };
        let measured = |v: Option<f64>, show: fn(f64) -> String| v.map(|v| Cell::plain(show(v * 1e9)));
        let mut cells = vec![
            Cell::plain(format!(
                "`{}` {}{}",
                d.device,
                d.name,
                if d.software { " (software)" } else { "" }
            )),
            Cell::plain(clock(&d.backend, &d.timing)),
            d.total_memory
                .map(|m| Cell::plain(format_bytes(m as usize)))
                .unwrap_or_else(Cell::none),
            measured(c.copy_gbps, format_bandwidth).unwrap_or_else(Cell::none),
            measured(c.host_link_gbps, format_bandwidth).unwrap_or_else(Cell::none),
        ];
        for key in KEYS {
            cells.push(measured(c.matmul_gflops.get(key).copied(), format_flops).unwrap_or_else(Cell::none));
        }
        cells.push(
            c.op_floor_s
                .map(|s| format_seconds(s).into())
                .unwrap_or_else(Cell::none),
        );
        cells.push(ridge);
        ceilings.push(cells);
        ceilings.push(datasheet_row(d));
    }
    blocks.push(Block::Table(ceilings));

    let details: Vec<String> = report
        .devices
        .iter()
        .filter(|d| !d.details.is_empty())
        .map(|d| {
            let pairs: Vec<String> = d
                .details
                .iter()
                .map(|(k, v)| {
                    if k == "features" {
                        format!("{k}: {}", feature_list(v))
                    } else {
                        format!("{k}: {v}")
                    }
                })
                .collect();
            format!("`{}`: {}", d.device, pairs.join(" · "))
        })
        .collect();
    if !details.is_empty() {
        blocks.push(Block::Bullets(details));
    }
    blocks.extend(cpu_vs_gpus(report));
    blocks.extend(capabilities(report));
    blocks
}

/// The row under a device: its datasheet peaks with the share the run reached, or `unknown`.
fn datasheet_row(d: &crate::bench::report::DeviceEntry) -> Vec<Cell> {
    let c = &d.ceilings;
    let Some(p) = peaks::lookup(&d.name, d.software) else {
        let mut cells = vec![Cell::toned("↳ datasheet", Tone::Muted), Cell::none(), Cell::none()];
        cells.extend((0..6).map(|_| Cell::toned("unknown", Tone::Muted)));
        cells.extend([Cell::none(), Cell::none()]);
        return cells;
    };
    let peak = |measured: Option<f64>, peak: f64, show: fn(f64) -> String| {
        let cell = Cell::toned(show(peak), Tone::Muted);
        match measured {
            Some(m) => cell.with_note(format!("{} reached", percent(m * 1e9 / peak))),
            None => cell,
        }
    };
    let mut cells = vec![
        Cell::toned(format!("↳ datasheet: {}", p.part), Tone::Muted),
        Cell::none(),
        Cell::toned(p.memory, Tone::Muted),
        peak(c.copy_gbps, p.memory_bandwidth, format_bandwidth),
        peak(c.host_link_gbps, p.host_link, format_bandwidth).with_note(p.link),
    ];
    for key in KEYS {
        match p.matmul(key) {
            Some(v) => cells.push(peak(c.matmul_gflops.get(key).copied(), v, format_flops)),
            None => cells.push(Cell::toned("unknown", Tone::Muted)),
        }
    }
    cells.extend([Cell::none(), Cell::none()]);
    cells
}

/// How each GPU's ceilings compare with the CPU's.
fn cpu_vs_gpus(report: &Report) -> Option<Block> {
    let cpu = report.devices.iter().find(|d| d.backend == "cpu")?;
    let mut lines = Vec::new();
    for d in report.devices.iter().filter(|d| d.backend != "cpu") {
        let bw = match (d.ceilings.copy_gbps, cpu.ceilings.copy_gbps) {
            (Some(g), Some(c)) if c > 0.0 => Some(g / c),
            _ => None,
        };
        let best = |c: &crate::bench::report::Ceilings, key: &str| c.matmul_gflops.get(key).copied();
        let flops: Vec<String> = KEYS
            .iter()
            .filter_map(|k| {
                let (g, c) = (best(&d.ceilings, k)?, best(&cpu.ceilings, k)?);
                (c > 0.0).then(|| format!("{} the {} matmul rate", times(g / c), key_name(k)))
            })
            .collect();
        if bw.is_none() && flops.is_empty() {
            continue;
        }
        let mut parts = Vec::new();
        if let Some(bw) = bw {
            parts.push(format!("{} the memory bandwidth", times(bw)));
        }
        parts.extend(flops);
        let link = d
            .ceilings
            .host_link_gbps
            .zip(d.ceilings.copy_gbps)
            .map(|(link, copy)| {
                format!(
                    "; its host link moves data at {} of its own memory bandwidth",
                    percent(link / copy)
                )
            })
            .unwrap_or_default();
        lines.push(format!("`{}` against the CPU: {}{link}.", d.device, parts.join(", ")));
    }
    (!lines.is_empty()).then_some(Block::Bullets(lines))
}

/// Every device's capabilities per op family and dtype, collapsed.
fn capabilities(report: &Report) -> Option<Block> {
    let mut blocks = Vec::new();
    for d in &report.devices {
        if d.capabilities.is_empty() {
            continue;
        }
        blocks.push(Block::heading(4, format!("`{}` ({})", d.device, d.name)));
        let dtypes: Vec<String> = d.capabilities[0].support.iter().map(|(t, _)| t.clone()).collect();
        let mut headers = vec!["Ops".to_string()];
        headers.extend(dtypes);
        let mut table = Table {
            headers,
            rows: Vec::new(),
        };
        for row in &d.capabilities {
            let mut cells = vec![Cell::plain(row.family.clone())];
            cells.extend(row.support.iter().map(|(_, s)| match s {
                Support::All => Cell::plain("✓"),
                Support::Some => Cell::toned("some", Tone::Even),
                Support::None => Cell::none(),
            }));
            table.push(cells);
        }
        blocks.push(Block::Table(table));
    }
    (!blocks.is_empty()).then(|| Block::Details {
        summary: "Capabilities of each device, per op family and dtype".into(),
        blocks,
    })
}

fn yes_no(v: bool) -> String {
    if v { "yes" } else { "no" }.into()
}
