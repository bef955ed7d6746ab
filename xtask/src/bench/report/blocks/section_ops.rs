//! Section 9: the ops a model needs, forward and forward + backward, each against the same op
//! in PyTorch (numpy on the CPU), with the speed the issue asks for; the two passes of each op
//! side by side first (`ops_pairs.rs`).

use super::{Block, Cell, Table, Tone, bound_cell, library_name, rate_cell, reference_title, time_cell};
use crate::bench::cases::{ModelOp, Section};
use crate::bench::report::format::speed;
use crate::bench::report::{Report, Row};

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = vec![Block::Paragraph(
        "The fused primitives (`layer_norm`, `rms_norm`, `softmax`, `log_softmax`, `cross_entropy`, \
         also over a 32000-class vocabulary), `cat`, `sort`, `cumsum`, a ResNet-like 3×3 `conv2d` and \
         `max_pool2d`, causal `scaled_dot_product_attention` (bf16 and f32) and a GPT-2-sized \
         `embedding`, each measured with the call a model makes: forward alone, and forward + backward \
         (`_fwd_bwd`: the inputs PyTorch computes gradients for are variables, backward runs from a \
         fixed output gradient, or from the loss for `cross_entropy`, and the gradients are freed). \
         With `--vs-torch` the same shapes run in PyTorch (`torch.nn.functional` and \
         `torch.cat`/`sort`/`cumsum`, `out.backward(grad)`) in the same run; on the CPU the reference \
         is numpy composed from its primitives (`np.exp`, a max-subtracted softmax, a mean/variance \
         layer norm, their gradients written out). \"Speed\" is how cartage's time compares with the \
         reference's, and \"Target\" the speed asked of it (as the reference's time ÷ cartage's: above \
         1, cartage is faster)."
            .into(),
    )];
    blocks.extend(super::ops_pairs::blocks(report));
    let rows: Vec<_> = report.section_rows(Section::Ops).collect();
    if rows.is_empty() {
        return blocks;
    }
    let reference = reference_title(rows.iter().copied());
    let mut table = Table::new(&model_headers(&reference));
    for r in rows {
        let Some((op, _)) = r.params.model_op() else { continue };
        table.push(model_cells(r, op, &reference));
    }
    blocks.push(Block::heading(3, "Every op"));
    blocks.push(Block::Table(table));
    blocks
}

/// The column of [`model_cells`] that holds cartage's time.
pub(super) const TIME: usize = 4;
/// The column of [`model_cells`] that holds the reference's time.
pub(super) const REFERENCE_TIME: usize = 7;

/// The headers of [`model_cells`].
pub(super) fn model_headers(reference: &str) -> Vec<&str> {
    vec![
        "Device", "Op", "dtype", "Shape", "Time", "Rate", "Bound", reference, "Speed", "Target",
    ]
}

/// The cells every model-op row shows: device, op, dtype, shape, time, rate, bound, the
/// reference's time, the speed against it and the target with its verdict. `reference` is the
/// table's reference column title: the library is named under the time when the table mixes
/// libraries.
pub(super) fn model_cells(r: &Row, op: &ModelOp, reference: &str) -> Vec<Cell> {
    let ratio = r.reference.as_ref().map(|x| x.median / r.median);
    let verdict = match (ratio, op.target_on(&r.device)) {
        (Some(s), Some(t)) if s >= t => Cell::toned(format!("≥ {t:.1}× ✓"), Tone::Good),
        (Some(_), Some(t)) => Cell::toned(format!("≥ {t:.1}× ✗"), Tone::Bad),
        (None, Some(t)) => Cell::plain(format!("≥ {t:.1}×")),
        (_, None) => Cell::none(),
    };
    let reference_time = match &r.reference {
        Some(x) if reference == "Reference" => time_cell_of(x.median).with_note(library_name(&x.library)),
        Some(x) => time_cell_of(x.median),
        None => Cell::none(),
    };
    vec![
        format!("`{}`", r.device).into(),
        r.case.clone().into(),
        r.dtype.clone().into(),
        op.shape().into(),
        time_cell(r),
        rate_cell(r),
        bound_cell(r),
        reference_time,
        r.reference
            .as_ref()
            .map(|x| speed(r.median, x.median))
            .unwrap_or_else(Cell::none),
        verdict,
    ]
}

fn time_cell_of(seconds: f64) -> Cell {
    Cell::plain(crate::bench::report::format::format_seconds(seconds))
}
