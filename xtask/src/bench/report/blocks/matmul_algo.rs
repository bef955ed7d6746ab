//! The matmul-library A/B table of the precision section: per device and shape, GemmEx,
//! cuBLASLt with its heuristic and cuBLASLt with the search, each against PyTorch, and the
//! search's speed against GemmEx.

use super::super::format::{format_seconds, speed};
use super::super::{Report, Row};
use super::{Block, Cell, Table, devices_in};
use crate::bench::cases::{Case, MatmulAlgo, Section};

/// The A/B table, or nothing when no row of it ran.
pub(super) fn build(report: &Report) -> Vec<Block> {
    let rows: Vec<&Row> = report
        .section_rows(Section::Precision)
        .filter(|r| matches!(r.params, Case::MatmulShape(_)))
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let mut blocks = vec![Block::Paragraph(
        "Matmul libraries (R32's algorithm search): `[M, K] × [K, N]` in bf16 with M = K = 4096 (a weight) and \
         N tokens, run by `cublasGemmEx`, by cuBLASLt with its heuristic's algorithm, and by cuBLASLt with \
         `set_matmul_algo_search(&device, true)` (the best few candidates and GemmEx timed once per shape, the \
         fastest kept). Each time is compared with PyTorch's `torch.matmul` of the same shape in the same run."
            .into(),
    )];
    let mut table = Table::new(&[
        "Device",
        "M×K×N",
        "GemmEx",
        "Lt heuristic",
        "Lt search",
        "search vs GemmEx",
    ]);
    for d in devices_in(report, Section::Precision) {
        let mine: Vec<&&Row> = rows.iter().filter(|r| r.device == d).collect();
        let mut shapes: Vec<(usize, usize, usize)> = mine
            .iter()
            .filter_map(|r| match r.params {
                Case::MatmulShape(s) => Some((s.m, s.k, s.n)),
                _ => None,
            })
            .collect();
        shapes.sort_unstable();
        shapes.dedup();
        for (m, k, n) in shapes {
            let find = |algo: MatmulAlgo| {
                mine.iter()
                    .find(|r| matches!(r.params, Case::MatmulShape(s) if (s.m, s.k, s.n, s.algo) == (m, k, n, algo)))
            };
            let cell = |algo: MatmulAlgo| match find(algo) {
                Some(r) => {
                    let note = match &r.reference {
                        Some(reference) => format!("{} against the reference", speed(r.median, reference.median).text),
                        None => "no reference".into(),
                    };
                    Cell::plain(format_seconds(r.median)).with_note(note)
                }
                None => Cell::none(),
            };
            let versus = match (find(MatmulAlgo::LtSearch), find(MatmulAlgo::GemmEx)) {
                (Some(s), Some(g)) => speed(s.median, g.median),
                _ => Cell::none(),
            };
            table.push(vec![
                format!("`{d}`").into(),
                format!("{m}×{k}×{n}").into(),
                cell(MatmulAlgo::GemmEx),
                cell(MatmulAlgo::LtHeuristic),
                cell(MatmulAlgo::LtSearch),
                versus,
            ]);
        }
    }
    blocks.push(Block::Table(table));
    blocks
}
