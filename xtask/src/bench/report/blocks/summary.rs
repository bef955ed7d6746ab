//! The summary the report opens with: a table of every device at a glance, then per device the
//! verdicts a reader can act on — where the GPU pays and from which size, what to avoid, how
//! close it comes to the reference library and to its datasheet.

use super::findings::{self, Crossover};
use super::{Block, Cell, Table, Tone, reference_title};
use crate::bench::cases::Section;
use crate::bench::report::format::{
    format_bandwidth, format_bytes, format_flops, format_seconds, percent, speed, speed_from_ratio,
};
use crate::bench::report::peaks;
use crate::bench::report::{Ceilings, DeviceEntry, Report, Row};

const DTYPES: [&str; 3] = ["f32", "f16", "bf16"];

/// The name of a matmul ceiling key: `f32`, `TF32`, `f16`, `bf16`.
pub fn key_name(key: &str) -> &str {
    if key == "f32-tf32" { "TF32" } else { key }
}

pub(super) fn build(report: &Report) -> Vec<Block> {
    if report.devices.is_empty() {
        return vec![Block::Paragraph("No device was measured.".into())];
    }
    let mut blocks = vec![Block::Table(glance(report))];
    for d in &report.devices {
        blocks.push(Block::heading(
            3,
            format!(
                "`{}` — {}{}",
                d.device,
                d.name,
                if d.software { " (software)" } else { "" }
            ),
        ));
        let mut bullets = Vec::new();
        if d.backend != "cpu" {
            bullets.extend(pays(report, d));
        }
        bullets.extend(avoid(report, d));
        bullets.extend(against_reference(report, d));
        bullets.push(against_hardware(d));
        blocks.push(Block::Bullets(bullets));
    }
    blocks
}

/// One row per device: its ceilings beside the datasheet, where it overtakes the CPU, and its
/// standing against the reference library.
fn glance(report: &Report) -> Table {
    let reference = reference_title(report.rows.iter());
    let against = format!("Against {reference}");
    let mut table = Table::new(&[
        "Device",
        "Memory bandwidth",
        "Best matmul",
        "Host→device",
        "Cheapest op",
        "Ahead of the CPU",
        &against,
    ]);
    for d in &report.devices {
        let c = &d.ceilings;
        let peaks = peaks::lookup(&d.name, d.software);
        let of_peak = |measured: f64, peak: Option<f64>, show: fn(f64) -> String| match peak {
            Some(p) => Cell::plain(show(measured)).with_note(format!("{} of {}", percent(measured / p), show(p))),
            None => Cell::plain(show(measured)).with_note("datasheet unknown"),
        };
        let bandwidth = c
            .copy_gbps
            .map(|g| of_peak(g * 1e9, peaks.map(|p| p.memory_bandwidth), format_bandwidth))
            .unwrap_or_else(Cell::none);
        let best = c.matmul_gflops.iter().max_by(|a, b| a.1.total_cmp(b.1));
        let matmul = best
            .map(|(key, g)| {
                let cell = of_peak(g * 1e9, peaks.and_then(|p| p.matmul(key)), format_flops);
                let note = cell.note.clone().unwrap_or_default();
                cell.with_note(format!("{}; {note}", key_name(key)))
            })
            .unwrap_or_else(Cell::none);
        let link = c
            .host_link_gbps
            .map(|g| of_peak(g * 1e9, peaks.map(|p| p.host_link), format_bandwidth))
            .unwrap_or_else(Cell::none);
        let ahead = if d.backend == "cpu" {
            Cell::toned("(the CPU)", Tone::Muted)
        } else {
            match findings::crossover(report, &d.device, "f32") {
                Some(x) => ahead_cell(&x),
                None => Cell::none(),
            }
        };
        let versus = match findings::versus(report, &d.device) {
            Some(v) => speed_from_ratio(v.geomean).with_note(format!("geometric mean of {} cases", v.rows.len())),
            None => Cell::none(),
        };
        table.push(vec![
            Cell::plain(format!("`{}` {}", d.device, d.name)),
            bandwidth,
            matmul,
            link,
            c.op_floor_s
                .map(|s| Cell::plain(format_seconds(s)))
                .unwrap_or_else(Cell::none),
            ahead,
            versus,
        ]);
    }
    table
}

/// `from n = 128` with the speed at the largest size.
fn ahead_cell(x: &Crossover) -> Cell {
    let (n, c, g) = x.last();
    let at_last = speed(g, c);
    match x.from {
        Some(from) if from == x.first().0 => Cell::toned("at every n measured", Tone::Good),
        Some(from) => Cell::toned(format!("f32 matmul from n = {from}"), Tone::Good),
        None => Cell::toned(format!("not up to n = {n}"), Tone::Bad),
    }
    .with_note(format!("{} at n = {n}", at_last.text))
}

/// The measured matmul rates in GFLOP/s, f32 first, then TF32, f16 and bf16.
fn matmul_rates(c: &Ceilings) -> Vec<(&'static str, f64)> {
    ["f32", "f32-tf32", "f16", "bf16"]
        .into_iter()
        .filter_map(|k| Some((k, *c.matmul_gflops.get(k)?)))
        .collect()
}

/// Where the device pays against the CPU — the matmul sizes from which it stays ahead, streaming
/// ops — and where it never catches up.
fn pays(report: &Report, d: &DeviceEntry) -> Vec<String> {
    let (mut ahead, mut behind) = (Vec::new(), Vec::new());
    for dtype in DTYPES {
        let Some(x) = findings::crossover(report, &d.device, dtype) else {
            continue;
        };
        let (n, c, g) = x.last();
        let at_last = speed(g, c).text;
        match x.from {
            Some(from) if from == x.first().0 => {
                ahead.push(format!("{dtype} matmul at every n measured ({at_last} at n = {n})"))
            }
            Some(from) => ahead.push(format!("{dtype} matmul from n = {from} ({at_last} at n = {n})")),
            None => behind.push(format!("{dtype} matmul up to n = {n} ({at_last} there)")),
        }
    }
    if let (Some(cpu), Some(add)) = (
        findings::cpu(report),
        findings::largest(report, Section::Elementwise, &d.device, "add", "f32"),
    ) && let Some(cpu_add) = report.find(cpu, "add", "f32", add.size)
    {
        let text = format!(
            "f32 `add` over {} elements ({})",
            super::format_size(add.size, "elements"),
            speed(add.median, cpu_add.median).text
        );
        if add.median < cpu_add.median {
            ahead.push(text)
        } else {
            behind.push(text)
        }
    }
    let mut lines = Vec::new();
    if !ahead.is_empty() {
        lines.push(format!("**Where it pays** (against the CPU): {}.", ahead.join("; ")));
    }
    if !behind.is_empty() {
        lines.push(format!("**Where the CPU stays ahead:** {}.", behind.join("; ")));
    }
    lines
}

/// What costs time on this device and how to avoid it.
fn avoid(report: &Report, d: &DeviceEntry) -> Vec<String> {
    let dev = d.device.as_str();
    let mut parts = Vec::new();
    if d.backend != "cpu" {
        if let Some(x) = findings::crossover(report, dev, "f32")
            && let Some(from) = x.from
            && from > x.first().0
        {
            parts.push(format!("f32 matmuls below n = {from}, where the CPU is faster"));
        }
        if let (Some(cpu), Some(gpu_loop)) = (
            findings::cpu(report),
            findings::first(report, Section::SmallTensors, dev, "matmul_loop"),
        ) && let Some(cpu_loop) = findings::first(report, Section::SmallTensors, cpu, "matmul_loop")
            && gpu_loop.median > cpu_loop.median
        {
            let batched = findings::first(report, Section::SmallTensors, dev, "matmul_batched")
                .map(|b| format!(" (one batched matmul is {})", speed(b.median, gpu_loop.median).text))
                .unwrap_or_default();
            parts.push(format!(
                "{} separate tiny matmuls, {} than on the CPU{}",
                gpu_loop.size,
                speed(gpu_loop.median, cpu_loop.median).text,
                batched
            ));
        }
    }
    if let (Some(every), Some(once)) = (
        findings::first(report, Section::Syncs, dev, "loss_item_every_step"),
        findings::first(report, Section::Syncs, dev, "loss_accumulate_on_device"),
    ) && every.median > once.median * 1.2
    {
        parts.push(format!(
            "reading the loss every step, {} than accumulating it on the device",
            speed(every.median, once.median).text
        ));
    }
    if let (Some(empty), Some(keep)) = (
        findings::first(report, Section::Memory, dev, "alloc_empty_cache_every_step"),
        findings::first(report, Section::Memory, dev, "alloc_keep_cache"),
    ) && empty.median > keep.median * 1.2
    {
        parts.push(format!(
            "`empty_cache()` every step, {} than keeping the cache",
            speed(empty.median, keep.median).text
        ));
    }
    if d.backend != "cpu"
        && let Some(pinned) = findings::largest(report, Section::Transfers, dev, "h2d_pinned", "f32")
        && let Some(pageable) = report.find(dev, "h2d_pageable", "f32", pinned.size)
        && pageable.median > pinned.median * 1.3
    {
        parts.push(format!(
            "host→device copies from pageable memory, {} than from pinned memory at {}",
            speed(pageable.median, pinned.median).text,
            format_bytes(pinned.size)
        ));
    }
    if parts.is_empty() {
        return Vec::new();
    }
    vec![format!("**What to avoid:** {}.", parts.join("; "))]
}

/// `matmul_loop` f32 1000 products.
fn case_name(r: &Row) -> String {
    let size = match r.size_unit.as_str() {
        "n" => format!("n = {}", r.size),
        unit => super::format_size(r.size, unit),
    };
    format!("`{}` {} {size}", r.case, r.dtype)
}

/// How the device's rows compare with the reference library.
fn against_reference(report: &Report, d: &DeviceEntry) -> Vec<String> {
    let Some(v) = findings::versus(report, &d.device) else {
        return Vec::new();
    };
    let overall = speed_from_ratio(v.geomean).text;
    let ratio = |r: &Row| r.reference.as_ref().map_or(1.0, |x| x.ratio);
    let behind: Vec<String> = v
        .rows
        .iter()
        .rev()
        .take(3)
        .filter(|r| ratio(r) >= 1.05)
        .map(|r| format!("{} ({})", case_name(r), speed_from_ratio(ratio(r)).text))
        .collect();
    let ahead: Vec<String> = v
        .rows
        .iter()
        .take(3)
        .filter(|r| ratio(r) <= 1.0 / 1.05)
        .map(|r| format!("{} ({})", case_name(r), speed_from_ratio(ratio(r)).text))
        .collect();
    let mut text = format!(
        "**Against {}:** {overall} overall (geometric mean of {} cases): faster in {}, on par in {}, slower in {}.",
        v.library,
        v.rows.len(),
        v.faster,
        v.par,
        v.slower
    );
    if !behind.is_empty() {
        text.push_str(&format!(" Furthest behind: {}.", behind.join(", ")));
    }
    if !ahead.is_empty() {
        text.push_str(&format!(" Furthest ahead: {}.", ahead.join(", ")));
    }
    vec![text]
}

/// The measured ceilings as shares of the datasheet's peaks, or the ceilings alone.
fn against_hardware(d: &DeviceEntry) -> String {
    let c = &d.ceilings;
    let Some(p) = peaks::lookup(&d.name, d.software) else {
        let mut parts = Vec::new();
        if let Some(g) = c.copy_gbps {
            parts.push(format!("memory {}", format_bandwidth(g * 1e9)));
        }
        for (key, g) in matmul_rates(c) {
            parts.push(format!("{} matmul {}", key_name(key), format_flops(g * 1e9)));
        }
        if let Some(g) = c.host_link_gbps {
            parts.push(format!("host→device {}", format_bandwidth(g * 1e9)));
        }
        return format!(
            "**Against the hardware:** datasheet unknown for this device; measured {}.",
            if parts.is_empty() {
                "nothing".into()
            } else {
                parts.join(", ")
            }
        );
    };
    let share = |measured: f64, peak: f64, show: fn(f64) -> String| {
        format!("{}, {} of {}", show(measured), percent(measured / peak), show(peak))
    };
    let mut parts = Vec::new();
    if let Some(g) = c.copy_gbps {
        parts.push(format!(
            "memory {} ({})",
            share(g * 1e9, p.memory_bandwidth, format_bandwidth),
            p.memory
        ));
    }
    for (key, g) in matmul_rates(c) {
        if let Some(peak) = p.matmul(key) {
            parts.push(format!(
                "{} matmul {}",
                key_name(key),
                share(g * 1e9, peak, format_flops)
            ));
        }
    }
    if let Some(g) = c.host_link_gbps {
        parts.push(format!(
            "host→device {} ({})",
            share(g * 1e9, p.host_link, format_bandwidth),
            p.link
        ));
    }
    format!(
        "**Against the hardware** ({} datasheet, dense): {}.",
        p.part,
        parts.join("; ")
    )
}
