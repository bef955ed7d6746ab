//! Section 10's R31 table: where one real training step's time goes (`train_pipeline` rows), as
//! measured shares of the step — building the batch on the host, copying it, launching and
//! bookkeeping, the kernels, and the host sync that reads the loss.

use super::{Block, Cell, Table, Tone};
use crate::bench::cases::{Case, ModelOp};
use crate::bench::report::Row;
use crate::bench::report::format::format_seconds;

/// The phases in the order of a step, with their counter and heading.
const PHASES: [(&str, &str); 5] = [
    ("load_s", "Host batch"),
    ("copy_s", "Host→device"),
    ("launch_s", "Launch + bookkeeping"),
    ("kernels_s", "Kernels"),
    ("sync_s", "Loss read (sync)"),
];

/// The explanation and the table, or nothing when no row measured the pipeline.
pub(super) fn blocks(rows: &[&Row]) -> Vec<Block> {
    let rows: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| matches!(r.params, Case::Model(ModelOp::TrainPipeline { .. })))
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let mut headers = vec!["Device", "Model", "Step"];
    headers.extend(PHASES.iter().map(|(_, h)| *h));
    let mut table = Table::new(&headers);
    for r in rows {
        let Case::Model(op) = &r.params else { continue };
        let times: Vec<f64> = PHASES
            .iter()
            .map(|(k, _)| r.counters.get(*k).copied().unwrap_or(0.0).max(0.0))
            .collect();
        let total: f64 = times.iter().sum();
        let mut cells = vec![
            Cell::plain(format!("`{}`", r.device)),
            Cell::plain(op.shape()),
            Cell::plain(format_seconds(total)).with_note(format!("harness: {}", format_seconds(r.median))),
        ];
        let largest = times.iter().copied().fold(0.0, f64::max);
        for t in &times {
            let share = if total > 0.0 { 100.0 * t / total } else { 0.0 };
            let tone = if *t == largest && total > 0.0 {
                Tone::Bad
            } else {
                Tone::Plain
            };
            cells.push(Cell::toned(format!("{share:.0}%"), tone).with_note(format_seconds(*t)));
        }
        table.push(cells);
    }
    vec![
        Block::Paragraph(
            "**Where a training step's time goes (R31).** The `mlp_train` model fed from host \
             batches, one phase at a time, each the median over 20 steps: building the batch on \
             the host (generating and standardising it, as a data loader would), copying it to \
             the device and waiting for it, the step's compute split into launch and bookkeeping \
             (the same step on 8-wide tensors, where kernels take next to nothing) and kernels \
             (the rest), and reading the loss once the device is idle. The phases run one after \
             another here, so the shares show what overlap (a prefetching loader, reading the \
             loss rarely) and fewer, larger kernels could hide; a kernel made twice as fast \
             shortens only its own share. The largest share is marked."
                .into(),
        ),
        Block::Table(table),
    ]
}
