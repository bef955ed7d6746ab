//! Section 9: the ops a model needs, each against the same op in PyTorch (numpy on the CPU),
//! with the speed the issue asks for.

use super::{Block, Table, rate, ratio, time_cell};
use crate::bench::cases::{Case, ModelOp, Section};
use crate::bench::report::{Report, Row};

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = vec![Block::Paragraph(
        "The fused primitives (`layer_norm`, `rms_norm`, `softmax`, `log_softmax`, `cross_entropy`), \
         `cat`, `sort`, `cumsum`, a ResNet-like 3×3 `conv2d` and causal `scaled_dot_product_attention`, \
         each measured with the call a model makes. With `--vs-torch` the same shapes run in PyTorch \
         (`torch.nn.functional` and `torch.cat`/`sort`/`cumsum`) in the same run; on the CPU the \
         reference is numpy composed from its primitives (`np.exp`, a max-subtracted softmax, a \
         mean/variance layer norm). \"Speed\" is the reference's time ÷ cartage's: above 1, cartage is \
         faster."
            .into(),
    )];
    let rows: Vec<_> = report.section_rows(Section::Ops).collect();
    if rows.is_empty() {
        return blocks;
    }
    let mut table = Table::new(&[
        "Device",
        "Op",
        "dtype",
        "Shape",
        "Time",
        "Rate",
        "Reference",
        "Speed",
        "Target",
    ]);
    for r in rows {
        let Case::Model(op) = &r.params else { continue };
        table.push(model_cells(r, op));
    }
    blocks.push(Block::Table(table));
    blocks
}

/// The cells every model-op row shows: device, op, dtype, shape, time, rate, reference, speed and
/// the target with its verdict.
pub(super) fn model_cells(r: &Row, op: &ModelOp) -> Vec<String> {
    let speed = r.reference.as_ref().map(|x| x.median / r.median);
    let verdict = match (speed, op.target_on(&r.device)) {
        (Some(s), Some(t)) if s >= t => format!("≥ {t:.1}× ✓"),
        (Some(_), Some(t)) => format!("≥ {t:.1}× ✗"),
        (None, Some(t)) => format!("≥ {t:.1}×"),
        (_, None) => "–".into(),
    };
    vec![
        format!("`{}`", r.device),
        r.case.clone(),
        r.dtype.clone(),
        op.shape(),
        time_cell(r),
        match (r.rate, &r.rate_unit) {
            (Some(v), Some(unit)) => rate(v, unit),
            _ => "–".into(),
        },
        r.reference
            .as_ref()
            .map(|x| x.library.clone())
            .unwrap_or_else(|| "–".into()),
        speed.map(ratio).unwrap_or_else(|| "–".into()),
        verdict,
    ]
}
