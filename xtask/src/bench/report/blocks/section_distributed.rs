//! Section 11: several GPUs. The all-reduce bus bandwidth over every local GPU from 1 KiB to
//! 1 GiB (nccl-tests' `busbw`), against PyTorch's `dist.all_reduce` in the same run, and the
//! GPT trained data-parallel on one GPU and on all of them (tokens/s and scaling).

use super::{Block, Cell, Table, reference_title};
use crate::bench::cases::{Case, DistOp, Section, busbw_gbps};
use crate::bench::report::format::{format_bytes, speed_from_ratio, times};
use crate::bench::report::{Report, Row};

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = vec![Block::Paragraph(
        "One process drives every local GPU, one thread per rank, over NCCL (loaded at run time). \
         `all_reduce_<N>gpu`: an in-place sum of f32 on N GPUs; its bus bandwidth is nccl-tests' \
         `busbw`, 2 (N − 1) / N × bytes / time, what each link carries. With `--vs-torch` PyTorch runs \
         `dist.all_reduce` with NCCL on the same GPUs, one process per GPU, in the same run. \
         `ddp_gpt_<N>gpu`: one training step of `cartage_nn::models::Gpt` under `DataParallel` \
         (gradient buckets all-reduced during backward, AdamW) with the same batch on each GPU; \
         tokens/s counts every rank's tokens, and scaling divides by the one-GPU rate. With fewer \
         than two GPUs the multi-GPU rows are skipped (listed below) and the one-GPU step still runs."
            .into(),
    )];
    let rows: Vec<&Row> = report.section_rows(Section::Distributed).collect();
    let op = |r: &Row| match &r.params {
        Case::Distributed(op) => Some(op.clone()),
        _ => None,
    };
    let sweep: Vec<(&Row, DistOp)> = rows
        .iter()
        .filter_map(|r| op(r).map(|o| (*r, o)))
        .filter(|(_, o)| matches!(o, DistOp::AllReduce { .. }))
        .collect();
    if !sweep.is_empty() {
        let reference = reference_title(sweep.iter().map(|(r, _)| *r));
        let theirs = format!("{reference} busbw");
        let mut table = Table::new(&[
            "GPUs",
            "Bytes per rank",
            "Time",
            "cartage busbw",
            &theirs,
            "cartage against it",
        ]);
        for (r, o) in &sweep {
            let DistOp::AllReduce { bytes, world } = *o else {
                continue;
            };
            let gbps = |s: f64| format!("{:.1} GB/s", busbw_gbps(bytes, world, s));
            table.push(vec![
                Cell::plain(world.to_string()),
                Cell::plain(format_bytes(bytes)),
                Cell::plain(crate::bench::report::format_seconds(r.median)),
                Cell::plain(gbps(r.median)),
                r.reference
                    .as_ref()
                    .map_or_else(Cell::none, |x| Cell::plain(gbps(x.median))),
                r.reference
                    .as_ref()
                    .map_or_else(Cell::none, |x| speed_from_ratio(x.ratio)),
            ]);
        }
        blocks.push(Block::Table(table));
    }
    let ddp: Vec<(&Row, DistOp)> = rows
        .iter()
        .filter_map(|r| op(r).map(|o| (*r, o)))
        .filter(|(_, o)| matches!(o, DistOp::DdpGpt { .. }))
        .collect();
    if !ddp.is_empty() {
        let tokens = |r: &Row| r.params.size() as f64 / r.median;
        let one = ddp.iter().find(|(_, o)| o.world() == 1).map(|(r, _)| tokens(r));
        let mut table = Table::new(&["GPUs", "Tokens per step", "Step", "Tokens/s", "Scaling", "Efficiency"]);
        for (r, o) in &ddp {
            let rate = tokens(r);
            let scaling = one.map(|base| rate / base);
            table.push(vec![
                Cell::plain(o.world().to_string()),
                Cell::plain(o.size().to_string()),
                Cell::plain(crate::bench::report::format_seconds(r.median)),
                Cell::plain(format!("{rate:.0}")),
                scaling.map_or_else(Cell::none, |s| Cell::plain(times(s))),
                scaling.map_or_else(Cell::none, |s| {
                    Cell::plain(crate::bench::report::format::percent(s / o.world() as f64))
                }),
            ]);
        }
        blocks.push(Block::Table(table));
    }
    blocks
}
