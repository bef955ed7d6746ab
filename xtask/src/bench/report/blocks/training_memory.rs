//! The training section's memory curve: device memory at each phase of a few GPT training
//! steps (before the first, then after the forward pass, backward, the optimizer and freeing the
//! gradients), for cartage and, where it ran, PyTorch — one chart per device, one line per
//! precision and library, and a table of the first step's phases.

use super::{Block, Cell, Table, family};
use crate::bench::cases::{Case, ModelOp};
use crate::bench::report::charts::{Axis, LineChart, Scale, Series, Unit, style};
use crate::bench::report::format::format_bytes;
use crate::bench::report::{MemoryPoint, Row};

/// The chart and table blocks for the GPT rows among `rows` that carry a curve.
pub(super) fn blocks(report: &crate::bench::report::Report, rows: &[&Row]) -> Vec<Block> {
    let gpt: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| matches!(r.params, Case::Model(ModelOp::GptTrain { .. })) && !r.memory_curve.is_empty())
        .collect();
    if gpt.is_empty() {
        return Vec::new();
    }
    let mut devices: Vec<&str> = gpt.iter().map(|r| r.device.as_str()).collect();
    devices.dedup();
    let mut blocks = Vec::new();
    for device in devices {
        let here: Vec<&Row> = gpt.iter().copied().filter(|r| r.device == device).collect();
        let f = family(report, device);
        let mut series = Vec::new();
        for (i, r) in here.iter().enumerate() {
            let precision = precision(r);
            series.push(Series {
                name: format!("cartage {precision}"),
                points: curve_points(&r.memory_curve),
                style: style::style(f, if i == 0 { 0 } else { 1 }),
            });
            if let Some(reference) = r.reference.as_ref().filter(|x| !x.memory_curve.is_empty()) {
                series.push(Series {
                    name: format!("{} {precision}", library(&reference.library)),
                    points: curve_points(&reference.memory_curve),
                    style: style::style(f, if i == 0 { 2 } else { 3 }),
                });
            }
        }
        let points = here[0].memory_curve.len();
        let chart = LineChart {
            title: format!("GPT training memory on {device}"),
            x: Axis::new(
                "phase (start, then forward, backward, optimizer, zero_grad per step)",
                Scale::Linear,
                Unit::Count,
            )
            .ticks_at((0..points).map(|i| i as f64)),
            y: Axis::new("allocated", Scale::Linear, Unit::Bytes),
            series,
            levels: Vec::new(),
            marks: Vec::new(),
        };
        if let Some(svg) = chart.to_svg() {
            blocks.push(Block::Chart {
                name: format!("training-memory-{}", device.replace(':', "")),
                title: format!(
                    "Allocated device memory of the GPT training step on {device}, sampled before the first of \
                     {} steps and after each phase of each: activations pile up through the forward pass, \
                     backward frees them as it goes while gradients appear, the optimizer's moments exist \
                     from the first step on, and freeing the gradients returns to the level of parameters \
                     and optimizer state.",
                    here[0].memory_curve.iter().map(|p| p.step).max().map_or(0, |s| s + 1)
                ),
                svg,
            });
        }
        blocks.push(Block::Table(phase_table(&here)));
    }
    blocks
}

/// `(index, allocated)` per point.
fn curve_points(curve: &[MemoryPoint]) -> Vec<(f64, f64)> {
    curve.iter().enumerate().map(|(i, p)| (i as f64, p.allocated)).collect()
}

/// `f32` or `bf16 autocast`.
fn precision(r: &Row) -> &'static str {
    match r.params {
        Case::Model(ModelOp::GptTrain { autocast: true, .. }) => "bf16 autocast",
        _ => "f32",
    }
}

/// `torch` from `torch 2.11.0+cu130`.
fn library(name: &str) -> &str {
    name.split_whitespace().next().unwrap_or(name)
}

/// The second step's phases (the first step creates the optimizer's state): allocated after
/// each phase and the highest level during it, for cartage and the reference.
fn phase_table(rows: &[&Row]) -> Table {
    let mut table = Table::new(&[
        "Device",
        "Precision",
        "Library",
        "Phase",
        "Allocated after",
        "Peak during",
    ]);
    let second = |curve: &[MemoryPoint]| -> Vec<MemoryPoint> {
        let step = if curve.iter().any(|p| p.step == 1) { 1 } else { 0 };
        curve
            .iter()
            .filter(|p| p.step == step && p.phase != "start")
            .cloned()
            .collect()
    };
    for r in rows {
        let mut lines = vec![("cartage".to_string(), second(&r.memory_curve))];
        if let Some(reference) = r.reference.as_ref().filter(|x| !x.memory_curve.is_empty()) {
            lines.push((library(&reference.library).to_string(), second(&reference.memory_curve)));
        }
        for (lib, points) in lines {
            for p in points {
                table.push(vec![
                    Cell::plain(r.device.clone()),
                    Cell::plain(precision(r)),
                    Cell::plain(lib.clone()),
                    Cell::plain(p.phase.clone()),
                    Cell::plain(format_bytes(p.allocated as usize)),
                    Cell::plain(format_bytes(p.peak as usize)),
                ]);
            }
        }
    }
    table
}
