//! Section 1: every backend (compiled in or not), every device found, its capabilities, and the
//! ceilings measured in this run — copy bandwidth, host link, matmul rate (R1).

use super::{Block, Table, percent, rate};
use crate::bench::report::{Report, Support, format_bytes, format_seconds};

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut backends = Table::new(&["Backend", "Compiled in", "Asked for", "Devices measured", "Note"]);
    for b in &report.backends {
        backends.push(vec![
            format!("`{}`", b.backend),
            yes_no(b.compiled),
            yes_no(b.requested),
            if b.devices.is_empty() {
                "none".into()
            } else {
                b.devices
                    .iter()
                    .map(|d| format!("`{d}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            b.problem.clone().unwrap_or_default(),
        ]);
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
         at least: checks, allocation, launch). The ridge point is the arithmetic intensity (flop per \
         byte) above which an op can be compute-bound rather than bandwidth-bound."
            .into(),
    ));
    let mut ceilings = Table::new(&[
        "Device",
        "Memory",
        "Timing",
        "Memory bandwidth",
        "Host→device (pinned)",
        "Matmul f32",
        "f32 TF32",
        "f16",
        "bf16",
        "Cheapest op",
        "Ridge point",
    ]);
    for d in &report.devices {
        let c = &d.ceilings;
        let gflops = |k: &str| {
            c.matmul_gflops
                .get(k)
                .map(|v| rate(*v, "GFLOP/s"))
                .unwrap_or_else(|| "–".into())
        };
        let ridge = match (c.matmul_gflops.get("f32"), c.copy_gbps) {
            (Some(f), Some(b)) if b > 0.0 => format!("{:.1} flop/B", f / b),
            _ => "–".into(),
        };
        ceilings.push(vec![
            format!(
                "`{}` {}{}",
                d.device,
                d.name,
                if d.software { " (software)" } else { "" }
            ),
            d.total_memory
                .map(|m| format_bytes(m as usize))
                .unwrap_or_else(|| "–".into()),
            d.timing.clone(),
            c.copy_gbps.map(|v| rate(v, "GB/s")).unwrap_or_else(|| "–".into()),
            c.host_link_gbps.map(|v| rate(v, "GB/s")).unwrap_or_else(|| "–".into()),
            gflops("f32"),
            gflops("f32-tf32"),
            gflops("f16"),
            gflops("bf16"),
            c.op_floor_s.map(format_seconds).unwrap_or_else(|| "–".into()),
            ridge,
        ]);
    }
    blocks.push(Block::Table(ceilings));

    let details: Vec<String> = report
        .devices
        .iter()
        .filter(|d| !d.details.is_empty())
        .map(|d| {
            let pairs: Vec<String> = d.details.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("`{}`: {}", d.device, pairs.join("; "))
        })
        .collect();
    if !details.is_empty() {
        blocks.push(Block::Bullets(details));
    }
    blocks.extend(cpu_vs_gpus(report));

    for d in &report.devices {
        if d.capabilities.is_empty() {
            continue;
        }
        blocks.push(Block::Heading(
            3,
            format!("Capabilities of `{}` ({})", d.device, d.name),
        ));
        let dtypes: Vec<String> = d.capabilities[0].support.iter().map(|(t, _)| t.clone()).collect();
        let mut headers = vec!["Ops".to_string()];
        headers.extend(dtypes);
        let mut table = Table {
            headers,
            rows: Vec::new(),
        };
        for row in &d.capabilities {
            let mut cells = vec![row.family.clone()];
            cells.extend(row.support.iter().map(|(_, s)| {
                match s {
                    Support::All => "✓",
                    Support::Some => "some",
                    Support::None => "–",
                }
                .to_string()
            }));
            table.push(cells);
        }
        blocks.push(Block::Table(table));
    }
    blocks
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
        let flops = match (
            d.ceilings.matmul_gflops.get("f32"),
            cpu.ceilings.matmul_gflops.get("f32"),
        ) {
            (Some(g), Some(c)) if *c > 0.0 => Some(g / c),
            _ => None,
        };
        if bw.is_none() && flops.is_none() {
            continue;
        }
        let as_times = |v: Option<f64>| v.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "–".into());
        lines.push(format!(
            "`{}` against the CPU: {} the memory bandwidth, {} the f32 matmul rate{}.",
            d.device,
            as_times(bw),
            as_times(flops),
            d.ceilings
                .host_link_gbps
                .zip(d.ceilings.copy_gbps)
                .map(|(link, copy)| format!(
                    "; its host link moves data at {} of its own memory bandwidth",
                    percent(link / copy)
                ))
                .unwrap_or_default()
        ));
    }
    (!lines.is_empty()).then_some(Block::Bullets(lines))
}

fn yes_no(v: bool) -> String {
    if v { "yes" } else { "no" }.into()
}
