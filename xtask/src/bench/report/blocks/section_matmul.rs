//! Sections 2, 3 and 7: the matmul size sweep with its crossover (R30), tiny matmuls in a loop
//! against one batched matmul (R3), and matmul precision (R24, R32).

use std::collections::BTreeSet;

use super::findings::{self, Crossover};
use super::summary::key_name;
use super::{Block, Cell, Table, bound_cell, devices_in, family, library_name, rate_cell, time_cell};
use crate::bench::cases::Section;
use crate::bench::report::charts::{Axis, LineChart, Rule, Scale, Series, Unit, style};
use crate::bench::report::format::{format_flops, format_seconds, percent, speed};
use crate::bench::report::{Report, Row, matmul_key, peaks};

fn flops(row: &Row) -> f64 {
    row.work.flops / row.median
}

pub(super) fn sweep(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Sweep);
    if devices.is_empty() {
        return Vec::new();
    }
    let dtypes: BTreeSet<&str> = report.section_rows(Section::Sweep).map(|r| r.dtype.as_str()).collect();
    let mut blocks = vec![Block::Paragraph(
        "Square matmuls `[n, n] × [n, n]` on every device; time per product (median, with p10–p90 under \
         it) and rate, with the row's bound under the rate. Small products cost a launch and a dispatch \
         whatever their size; large ones are bound by the arithmetic rate. The charts show one dtype \
         each: time (with a dotted line where a device overtakes the CPU for good) and rate (with the \
         datasheet's dense peak where the device is a known one); the reference library's figures are \
         dotted lines with triangles."
            .into(),
    )];
    let cpu = findings::cpu(report);
    for dtype in ["f32", "f16", "bf16"].into_iter().filter(|d| dtypes.contains(d)) {
        let gpus: Vec<&String> = devices.iter().filter(|d| Some(d.as_str()) != cpu).collect();
        let crossovers: Vec<(&String, Crossover)> = gpus
            .iter()
            .filter_map(|g| Some((*g, findings::crossover(report, g, dtype)?)))
            .collect();
        blocks.push(Block::heading(3, dtype));
        let findings_text: Vec<String> = crossovers.iter().map(|(g, x)| crossover_text(g, x)).collect();
        if !findings_text.is_empty() {
            blocks.push(Block::Bullets(findings_text));
        }
        blocks.push(Block::Table(sweep_table(report, &devices, &crossovers, dtype)));
        blocks.extend(sweep_charts(report, &devices, &crossovers, dtype));
    }
    if cpu.is_none() {
        blocks.push(Block::Paragraph(
            "No CPU rows were measured, so there is no crossover to mark.".into(),
        ));
    }
    blocks
}

fn crossover_text(gpu: &str, x: &Crossover) -> String {
    let (n0, c0, g0) = x.first();
    let (n1, c1, g1) = x.last();
    let ends = format!(
        "{} than the CPU at n = {n0}, {} at n = {n1}",
        speed(g0, c0).text,
        speed(g1, c1).text
    );
    match x.from {
        Some(n) if n == n0 => format!("`{gpu}` is ahead of the CPU at every size measured ({ends})."),
        Some(n) => format!("`{gpu}` overtakes the CPU from n = {n} and stays ahead ({ends})."),
        None => format!("`{gpu}` does not overtake the CPU within the sizes measured ({ends})."),
    }
}

/// n | per device: time, rate (bound under it) | per GPU: its speed against the CPU.
fn sweep_table(report: &Report, devices: &[String], crossovers: &[(&String, Crossover)], dtype: &str) -> Table {
    let sizes: BTreeSet<usize> = report
        .section_rows(Section::Sweep)
        .filter(|r| r.dtype == dtype)
        .map(|r| r.size)
        .collect();
    let mut headers = vec!["n".to_string()];
    for d in devices {
        headers.push(format!("`{d}` time"));
        headers.push("rate, bound".into());
    }
    for (g, _) in crossovers {
        headers.push(format!("`{g}` against the CPU"));
    }
    let mut table = Table {
        headers,
        rows: Vec::new(),
    };
    for &n in &sizes {
        let mut cells = vec![Cell::plain(n.to_string())];
        for d in devices {
            match report
                .find(d, "matmul", dtype, n)
                .filter(|r| r.section == Section::Sweep)
            {
                Some(r) => {
                    cells.push(time_cell(r));
                    cells.push(rate_cell(r).with_note(bound_cell(r).text));
                }
                None => cells.extend([Cell::none(), Cell::none()]),
            }
        }
        for (_, x) in crossovers {
            cells.push(match x.pairs.iter().find(|p| p.0 == n) {
                Some(&(_, c, g)) => speed(g, c),
                None => Cell::none(),
            });
        }
        table.push(cells);
    }
    table
}

/// The time and rate charts of one dtype.
fn sweep_charts(report: &Report, devices: &[String], crossovers: &[(&String, Crossover)], dtype: &str) -> Vec<Block> {
    let mut time_series = Vec::new();
    let mut rate_series = Vec::new();
    let mut sizes = BTreeSet::new();
    for d in devices {
        let rows = findings::sweep_rows(report, d, dtype);
        if rows.is_empty() {
            continue;
        }
        sizes.extend(rows.iter().map(|r| r.size));
        let f = family(report, d);
        time_series.push(Series {
            name: d.clone(),
            points: rows.iter().map(|r| (r.size as f64, r.median)).collect(),
            style: style::style(f, 0),
        });
        rate_series.push(Series {
            name: d.clone(),
            points: rows.iter().map(|r| (r.size as f64, flops(r))).collect(),
            style: style::style(f, 0),
        });
        let with_reference: Vec<(&Row, f64)> = rows
            .iter()
            .filter_map(|r| Some((*r, r.reference.as_ref()?.median)))
            .collect();
        if let Some((first, _)) = with_reference.first() {
            let library = first
                .reference
                .as_ref()
                .map_or("reference", |x| library_name(&x.library));
            let name = format!("{d} {library}");
            time_series.push(Series {
                name: name.clone(),
                points: with_reference.iter().map(|(r, t)| (r.size as f64, *t)).collect(),
                style: style::style(f, 2),
            });
            rate_series.push(Series {
                name,
                points: with_reference
                    .iter()
                    .map(|(r, t)| (r.size as f64, r.work.flops / t))
                    .collect(),
                style: style::style(f, 2),
            });
        }
    }
    let ticks: Vec<f64> = sizes.iter().map(|&n| n as f64).collect();
    let marks: Vec<Rule> = crossovers
        .iter()
        .filter_map(|(g, x)| {
            let from = x.from.filter(|&n| n > x.first().0)?;
            Some(Rule {
                at: from as f64,
                label: format!("{g} ahead of the CPU\nfrom n = {from}"),
                color: style::style(family(report, g), 0).color,
            })
        })
        .collect();
    let mut levels: Vec<Rule> = Vec::new();
    for d in devices {
        let Some(entry) = report.devices.iter().find(|e| &e.device == d) else {
            continue;
        };
        let Some(p) = peaks::lookup(&entry.name, entry.software) else {
            continue;
        };
        let Some(peak) = p.matmul(dtype) else { continue };
        if levels.iter().any(|l| l.at == peak) {
            continue;
        }
        levels.push(Rule {
            at: peak,
            label: format!("{} datasheet:\n{} dense {dtype}", p.part, format_flops(peak)),
            color: style::REFERENCE,
        });
    }
    let x = Axis::new("n (matrix side)", Scale::Log, Unit::Count).ticks_at(ticks);
    let charts = [
        LineChart {
            title: format!("Matmul {dtype}: time per product"),
            x: x.clone(),
            y: Axis::new("time per product", Scale::Log, Unit::Seconds),
            series: time_series,
            levels: Vec::new(),
            marks,
        },
        LineChart {
            title: format!("Matmul {dtype}: rate"),
            x,
            y: Axis::new("rate", Scale::Log, Unit::Flops),
            series: rate_series,
            levels,
            marks: Vec::new(),
        },
    ];
    let has_marks = !charts[0].marks.is_empty();
    let has_reference = charts[0].series.iter().any(|s| s.style.dash == style::Dash::Dotted);
    let has_peaks = !charts[1].levels.is_empty();
    let captions = [
        format!(
            "{dtype} matmul: time per [n, n] × [n, n] product against n, both axes logarithmic.{}{}",
            if has_marks {
                " Dotted vertical lines: the size from which a device stays ahead of the CPU."
            } else {
                ""
            },
            if has_reference {
                " Dotted lines with triangles: the reference library."
            } else {
                ""
            }
        ),
        format!(
            "{dtype} matmul: rate (2n³ flop per product) against n.{}",
            if has_peaks {
                format!(" The grey dashed line is the datasheet's dense {dtype} peak.")
            } else {
                String::new()
            }
        ),
    ];
    charts
        .into_iter()
        .zip(["time", "rate"])
        .zip(captions)
        .filter_map(|((chart, kind), caption)| {
            Some(Block::Chart {
                name: format!("sweep-{kind}-{dtype}"),
                title: caption,
                svg: chart.to_svg()?,
            })
        })
        .collect()
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
        "bound",
        "one batched matmul",
        "bound",
        "batched against the loop",
        "the loop as a CUDA graph",
        "per product",
        "graph against the loop",
    ]);
    let mut loops = Vec::new();
    for d in &devices {
        let find = |case: &str| findings::first(report, Section::SmallTensors, d, case);
        let (separate, batched, graph) = (find("matmul_loop"), find("matmul_batched"), find("matmul_graph"));
        let count = separate.or(batched).map(|r| r.size).unwrap_or(1).max(1);
        table.push(vec![
            format!("`{d}`").into(),
            separate.map(time_cell).unwrap_or_else(Cell::none),
            separate
                .map(|r| format_seconds(r.median / count as f64).into())
                .unwrap_or_else(Cell::none),
            separate.map(bound_cell).unwrap_or_else(Cell::none),
            batched.map(time_cell).unwrap_or_else(Cell::none),
            batched.map(bound_cell).unwrap_or_else(Cell::none),
            match (separate, batched) {
                (Some(s), Some(b)) => speed(b.median, s.median),
                _ => Cell::none(),
            },
            graph.map(time_cell).unwrap_or_else(Cell::none),
            graph
                .map(|r| format_seconds(r.median / count as f64).into())
                .unwrap_or_else(Cell::none),
            match (separate, graph) {
                (Some(s), Some(g)) => speed(g.median, s.median),
                _ => Cell::none(),
            },
        ]);
        if let Some(s) = separate {
            loops.push((d.clone(), s.median));
        }
    }
    let mut blocks = vec![
        Block::Paragraph(
            "1000 products of `[8, 8] × [8, 8]`: one op each in a loop, against one `[1000, 8, 8]` batched op. \
             Each op pays a fixed cost (checks, allocation, a launch on a GPU) that an 8×8 product cannot hide. \
             On CUDA the same loop is also captured once in a CUDA graph (`cartage::cuda_graph`) and replayed: \
             the host then launches the 1000 kernels as one, and \"per product\" is what each node costs on replay."
                .into(),
        ),
        Block::Table(table),
    ];
    if let Some(&(_, cpu)) = loops.iter().find(|(d, _)| Some(d.as_str()) == findings::cpu(report)) {
        let lines: Vec<String> = loops
            .iter()
            .filter(|(d, _)| Some(d.as_str()) != findings::cpu(report))
            .map(|(d, t)| format!("The loop on `{d}` is {} than on the CPU.", speed(*t, cpu).text))
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
         with f32 accumulation). Rate, and under it how it compares with f32 and the share of the \
         datasheet's dense peak for that precision where the device is a known one."
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
        let entry = report.devices.iter().find(|e| &e.device == d);
        let peaks = entry.and_then(|e| peaks::lookup(&e.name, e.software));
        let f32_row = rows.iter().find(|r| r.case == "matmul" && r.dtype == "f32");
        let n = rows.first().map(|r| r.size).unwrap_or(0);
        let cell = |case: &str, dtype: &str| match rows.iter().find(|r| r.case == case && r.dtype == dtype) {
            Some(r) => {
                let mut notes = Vec::new();
                if let Some(f) = f32_row.filter(|f| f.id != r.id) {
                    notes.push(format!("{} than f32", speed(r.median, f.median).text));
                }
                let key = matmul_key(r).unwrap_or_default();
                match peaks.and_then(|p| p.matmul(&key)) {
                    Some(peak) => notes.push(format!("{} of {} peak", percent(flops(r) / peak), key_name(&key))),
                    None => notes.push("peak unknown".into()),
                }
                Cell::plain(format_flops(flops(r))).with_note(notes.join("; "))
            }
            None => Cell::none(),
        };
        table.push(vec![
            format!("`{d}`").into(),
            n.to_string().into(),
            cell("matmul", "f32"),
            cell("matmul_tf32", "f32"),
            cell("matmul", "f16"),
            cell("matmul", "bf16"),
        ]);
    }
    blocks.push(Block::Table(table));
    blocks.extend(super::precision_error::build(report));
    blocks
}
