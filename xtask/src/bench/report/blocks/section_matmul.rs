//! Sections 2, 3 and 7: the matmul size sweep with its crossover (R30), tiny matmuls in a loop
//! against one batched matmul (R3), and matmul precision (R24, R32).

use std::collections::BTreeSet;

use super::{Block, Table, device_label, devices_in, rate, ratio, time_cell};
use crate::bench::cases::Section;
use crate::bench::report::charts::{LineChart, Scale, Series};
use crate::bench::report::{Report, Row, format_seconds};

fn matmul_rows<'a>(report: &'a Report, section: Section, device: &str, dtype: &str) -> Vec<&'a Row> {
    let mut rows: Vec<&Row> = report
        .section_rows(section)
        .filter(|r| r.device == device && r.dtype == dtype && r.case == "matmul")
        .collect();
    rows.sort_by_key(|r| r.size);
    rows
}

fn gflops(row: &Row) -> f64 {
    row.work.flops / row.median / 1e9
}

pub(super) fn sweep(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Sweep);
    if devices.is_empty() {
        return Vec::new();
    }
    let dtypes: BTreeSet<&str> = report.section_rows(Section::Sweep).map(|r| r.dtype.as_str()).collect();
    let mut blocks = vec![Block::Paragraph(
        "Square matmuls `[n, n] × [n, n]` on every device; time per product (median, p10–p90) and rate. \
         Small products cost a launch and a dispatch whatever their size; large ones are bound by the \
         arithmetic rate."
            .into(),
    )];
    let mut time_series = Vec::new();
    let mut rate_series = Vec::new();
    for dtype in ["f32", "f16", "bf16"].into_iter().filter(|d| dtypes.contains(d)) {
        let sizes: BTreeSet<usize> = report
            .section_rows(Section::Sweep)
            .filter(|r| r.dtype == dtype)
            .map(|r| r.size)
            .collect();
        let mut headers = vec!["n".to_string()];
        for d in &devices {
            headers.push(format!("`{d}` {dtype}"));
            headers.push("GFLOP/s".into());
        }
        let mut table = Table {
            headers,
            rows: Vec::new(),
        };
        for &n in &sizes {
            let mut cells = vec![n.to_string()];
            for d in &devices {
                match report
                    .find(d, "matmul", dtype, n)
                    .filter(|r| r.section == Section::Sweep)
                {
                    Some(r) => {
                        cells.push(time_cell(r));
                        cells.push(format!("{:.1}", gflops(r)));
                    }
                    None => cells.extend(["–".to_string(), "–".to_string()]),
                }
            }
            table.push(cells);
        }
        blocks.push(Block::Heading(3, dtype.to_string()));
        blocks.push(Block::Table(table));
        for d in &devices {
            let rows = matmul_rows(report, Section::Sweep, d, dtype);
            if rows.is_empty() {
                continue;
            }
            let name = format!("{} {dtype}", device_label(report, d));
            let dashed = dtype != "f32";
            time_series.push(Series {
                name: name.clone(),
                points: rows.iter().map(|r| (r.size as f64, r.median)).collect(),
                dashed,
            });
            rate_series.push(Series {
                name,
                points: rows.iter().map(|r| (r.size as f64, gflops(r))).collect(),
                dashed,
            });
        }
    }
    let charts = [
        ("sweep-time", "Matmul time per product", "seconds", time_series),
        ("sweep-rate", "Matmul rate", "GFLOP/s", rate_series),
    ];
    for (name, title, y_label, series) in charts {
        let chart = LineChart {
            title: title.into(),
            x_label: "n (matrix side)".into(),
            y_label: y_label.into(),
            x_scale: Scale::Log,
            y_scale: Scale::Log,
            x_categories: Vec::new(),
            series,
        };
        if let Some(svg) = chart.to_svg() {
            blocks.push(Block::Chart {
                name: name.into(),
                title: title.into(),
                svg,
            });
        }
    }
    blocks.extend(crossover(report, &devices));
    blocks
}

/// The article's table: per GPU, CPU time, GPU time and speedup at each size, and the size from
/// which the GPU stays ahead.
fn crossover(report: &Report, devices: &[String]) -> Vec<Block> {
    let Some(cpu) = devices.iter().find(|d| d.as_str() == "cpu") else {
        return vec![Block::Paragraph(
            "No CPU rows were measured, so there is no crossover to mark.".into(),
        )];
    };
    let mut blocks = Vec::new();
    let mut findings = Vec::new();
    for gpu in devices.iter().filter(|d| d.as_str() != "cpu") {
        let cpu_rows = matmul_rows(report, Section::Sweep, cpu, "f32");
        let pairs: Vec<(usize, f64, f64)> = cpu_rows
            .iter()
            .filter_map(|c| {
                report
                    .find(gpu, "matmul", "f32", c.size)
                    .map(|g| (c.size, c.median, g.median))
            })
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let mut table = Table::new(&["n", "CPU", gpu.as_str(), "speedup (CPU ÷ device)"]);
        for &(n, c, g) in &pairs {
            table.push(vec![n.to_string(), format_seconds(c), format_seconds(g), ratio(c / g)]);
        }
        blocks.push(Block::Heading(3, format!("Crossover: `{gpu}` against the CPU (f32)")));
        blocks.push(Block::Table(table));
        let first_ahead = pairs
            .iter()
            .enumerate()
            .find(|(i, _)| pairs[*i..].iter().all(|&(_, c, g)| g < c))
            .map(|(_, p)| p.0);
        let (n0, c0, g0) = pairs[0];
        let (n1, c1, g1) = pairs[pairs.len() - 1];
        let ends = format!(
            "at n = {n0} the device takes {} the CPU's time; at n = {n1}, {}",
            ratio(g0 / c0),
            ratio(g1 / c1)
        );
        findings.push(match first_ahead {
            Some(n) if n == n0 => format!("`{gpu}` is ahead of the CPU at every size measured ({ends})."),
            Some(n) => format!("`{gpu}` overtakes the CPU from n = {n} and stays ahead ({ends})."),
            None => format!("`{gpu}` does not overtake the CPU within the sizes measured ({ends})."),
        });
    }
    if !findings.is_empty() {
        blocks.insert(0, Block::Bullets(findings));
    }
    blocks
}

pub(super) fn small_tensors(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::SmallTensors);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut table = Table::new(&[
        "Device",
        "1000 separate matmuls",
        "per product",
        "one batched matmul",
        "separate ÷ batched",
    ]);
    let mut loops = Vec::new();
    for d in &devices {
        let find = |case: &str| {
            report
                .section_rows(Section::SmallTensors)
                .find(|r| &r.device == d && r.case == case)
        };
        let (separate, batched) = (find("matmul_loop"), find("matmul_batched"));
        let count = separate.or(batched).map(|r| r.size).unwrap_or(1).max(1);
        table.push(vec![
            format!("`{d}`"),
            separate.map(time_cell).unwrap_or_else(|| "–".into()),
            separate
                .map(|r| format_seconds(r.median / count as f64))
                .unwrap_or_else(|| "–".into()),
            batched.map(time_cell).unwrap_or_else(|| "–".into()),
            match (separate, batched) {
                (Some(s), Some(b)) => ratio(s.median / b.median),
                _ => "–".into(),
            },
        ]);
        if let Some(s) = separate {
            loops.push((d.clone(), s.median));
        }
    }
    let mut blocks = vec![
        Block::Paragraph(
            "1000 products of `[8, 8] × [8, 8]`: one op each in a loop, against one `[1000, 8, 8]` batched op. \
             Each op pays a fixed cost (checks, allocation, a launch on a GPU) that an 8×8 product cannot hide."
                .into(),
        ),
        Block::Table(table),
    ];
    if let Some(&(_, cpu)) = loops.iter().find(|(d, _)| d == "cpu") {
        let lines: Vec<String> = loops
            .iter()
            .filter(|(d, _)| d != "cpu")
            .map(|(d, t)| {
                let r = t / cpu;
                if r >= 1.0 {
                    format!("The loop on `{d}` is {} slower than on the CPU.", ratio(r))
                } else {
                    format!("The loop on `{d}` is {} faster than on the CPU.", ratio(1.0 / r))
                }
            })
            .collect();
        if !lines.is_empty() {
            blocks.push(Block::Bullets(lines));
        }
    }
    blocks
}

pub(super) fn precision(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Precision);
    let mut blocks = vec![Block::Paragraph(
        "One large matmul per precision: f32 (the default, full precision), f32 with TF32 tensor cores \
         (`set_matmul_precision(High)`, 10-bit mantissa products), f16 and bf16 (half the bytes, computed \
         with f32 accumulation). Rate in GFLOP/s and speedup over f32."
            .into(),
    )];
    if devices.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&["Device", "n", "f32", "f32 TF32", "f16", "bf16"]);
    for d in &devices {
        let rows: Vec<&Row> = report
            .section_rows(Section::Precision)
            .filter(|r| &r.device == d)
            .collect();
        let f32_row = rows.iter().find(|r| r.case == "matmul" && r.dtype == "f32");
        let n = rows.first().map(|r| r.size).unwrap_or(0);
        let cell = |case: &str, dtype: &str| match rows.iter().find(|r| r.case == case && r.dtype == dtype) {
            Some(r) => {
                let speedup = f32_row
                    .map(|f| format!(" ({})", ratio(f.median / r.median)))
                    .unwrap_or_default();
                format!("{}{speedup}", rate(gflops(r), "GFLOP/s"))
            }
            None => "–".into(),
        };
        table.push(vec![
            format!("`{d}`"),
            n.to_string(),
            cell("matmul", "f32"),
            cell("matmul_tf32", "f32"),
            cell("matmul", "f16"),
            cell("matmul", "bf16"),
        ]);
    }
    blocks.push(Block::Table(table));
    blocks
}
