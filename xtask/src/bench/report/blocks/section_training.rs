//! Section 10: one training step of an MLP (forward, backward, gradients freed) against the
//! same step in PyTorch, and what backward holds: the activations the graph saved against the
//! peak of memory during backward, for cartage and for PyTorch.

use super::section_ops::model_cells;
use super::{Block, Table};
use crate::bench::cases::{Case, Section};
use crate::bench::report::Report;

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = vec![Block::Paragraph(
        "One training step of a 4-layer MLP without biases (ReLU between layers, the mean square of \
         the output as the loss): forward, `loss.backward()`, gradients freed. The wide case is \
         bound by its matmuls; the narrow one by the cost of launching each op and recording it, \
         where a lower per-op cost must show. With `--vs-torch` PyTorch eager runs the same step \
         (`loss.backward()`, `grad = None`) in the same run. \"Activations\" are the bytes the \
         recorded graph saved for backward when the loss is computed; \"backward peak\" is how far \
         allocated memory rose above its level while backward ran (the gradients, and the \
         temporaries of the backward formulas)."
            .into(),
    )];
    let rows: Vec<_> = report.section_rows(Section::Training).collect();
    if rows.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&[
        "Device",
        "Op",
        "dtype",
        "Model",
        "Time",
        "Rate",
        "Reference",
        "Speed",
        "Target",
        "Activations",
        "Backward peak",
        "Reference backward peak",
    ]);
    let bytes = |v: Option<&f64>| v.map_or("–".to_string(), |b| cartage::format_bytes(*b as u64));
    for r in rows {
        let Case::Model(op) = &r.params else { continue };
        let mut cells = model_cells(r, op);
        cells.extend([
            bytes(r.counters.get("activation_bytes")),
            bytes(r.counters.get("backward_peak_bytes")),
            bytes(r.reference.as_ref().and_then(|x| x.counters.get("backward_peak_bytes"))),
        ]);
        table.push(cells);
    }
    blocks.push(Block::Table(table));
    blocks
}
