//! Section 9's side-by-side view: each op's forward row beside its forward + backward row, per
//! device, with the speed of each against the reference and what ran on each side, so that a
//! slow backward shows next to a fast forward instead of hiding in a longer table.

use super::{Block, Cell, Table, library_name, reference_title, time_cell};
use crate::bench::cases::{ModelOp, Section};
use crate::bench::report::format::{format_seconds, speed};
use crate::bench::report::{Report, Row};

/// One op at one shape, dtype and device: its forward row and its forward + backward row.
#[derive(Debug)]
pub(crate) struct Pair<'a> {
    /// The op and its shape.
    pub op: &'a ModelOp,
    /// The forward row, if measured.
    pub forward: Option<&'a Row>,
    /// The forward + backward row, if measured.
    pub backward: Option<&'a Row>,
}

impl Pair<'_> {
    /// A row of the pair (the forward one where both are there).
    fn any(&self) -> Option<&Row> {
        self.forward.or(self.backward)
    }
}

/// The ops rows paired by device, dtype, op and shape, in the order of their first row.
pub(crate) fn pairs<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Vec<Pair<'a>> {
    let mut out: Vec<Pair<'a>> = Vec::new();
    for row in rows {
        let Some((op, backward)) = row.params.model_op() else {
            continue;
        };
        let same = |p: &Pair<'a>| p.op == op && p.any().is_some_and(|r| r.device == row.device && r.dtype == row.dtype);
        let index = match out.iter().position(same) {
            Some(i) => i,
            None => {
                out.push(Pair {
                    op,
                    forward: None,
                    backward: None,
                });
                out.len() - 1
            }
        };
        let slot = if backward {
            &mut out[index].backward
        } else {
            &mut out[index].forward
        };
        slot.get_or_insert(row);
    }
    out
}

/// Per device with forward + backward rows, a table of its pairs: against the reference where it
/// ran (the speed of each pass, the times under it, what ran on each side), else cartage's times.
pub(super) fn blocks(report: &Report) -> Vec<Block> {
    let all = pairs(report.section_rows(Section::Ops));
    let mut blocks = Vec::new();
    for device in &report.devices {
        let mine: Vec<&Pair> = all
            .iter()
            .filter(|p| p.backward.is_some() && p.any().is_some_and(|r| r.device == device.device))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let rows = mine.iter().flat_map(|p| [p.forward, p.backward]).flatten();
        let with_reference = rows.clone().any(|r| r.reference.is_some());
        let reference = reference_title(rows);
        let theirs = format!("{reference} impl");
        let mut table = if with_reference {
            Table::new(&["Case", "Forward", "Forward + backward", "cartage impl", &theirs])
        } else {
            Table::new(&["Case", "Forward", "Forward + backward", "cartage impl"])
        };
        for pair in mine {
            let Some(first) = pair.any() else { continue };
            let implementation = pair
                .backward
                .or(pair.forward)
                .and_then(|r| r.implementation.clone())
                .unwrap_or_else(|| "unknown".into());
            let mut cells = vec![Cell::plain(format!(
                "`{}` {} {}",
                pair.op.name(),
                first.dtype,
                pair.op.shape()
            ))];
            if with_reference {
                cells.push(against(pair.forward));
                cells.push(against(pair.backward));
                cells.push(Cell::plain(implementation));
                let reference_impl = pair
                    .backward
                    .or(pair.forward)
                    .and_then(|r| r.reference.as_ref())
                    .map(|x| {
                        let words = x.implementation.clone().unwrap_or_else(|| "unknown".into());
                        if reference == "Reference" {
                            format!("{}: {words}", library_name(&x.library))
                        } else {
                            words
                        }
                    });
                cells.push(reference_impl.map_or_else(Cell::none, Cell::plain));
            } else {
                cells.push(pair.forward.map_or_else(Cell::none, time_cell));
                cells.push(pair.backward.map_or_else(Cell::none, time_cell));
                cells.push(Cell::plain(implementation));
            }
            table.push(cells);
        }
        blocks.push(Block::heading(
            3,
            format!(
                "Forward against forward + backward: `{}` {}",
                device.device, device.name
            ),
        ));
        blocks.push(Block::Table(table));
    }
    if !blocks.is_empty() {
        blocks.insert(
            0,
            Block::Paragraph(
                "Each op with a gradient, forward alone and with its backward, side by side: the speed \
                 of each against the reference (cartage's time against the reference's under it), and \
                 what ran on each side. cartage's words come from the device's capabilities (which \
                 fused kernels it lists; the frontend composes the rest) and, for attention, from what \
                 one call showed; the reference's from the ATen ops one profiled call ran. `unknown` \
                 where neither tells. A device without a reference shows cartage's times."
                    .into(),
            ),
        );
    }
    blocks
}

/// A row's speed against its reference, with both times under it.
fn against(row: Option<&Row>) -> Cell {
    match row.and_then(|r| r.reference.as_ref().map(|x| (r, x))) {
        Some((r, x)) => speed(r.median, x.median).with_note(format!(
            "{} against {}",
            format_seconds(r.median),
            format_seconds(x.median)
        )),
        None => Cell::none(),
    }
}
