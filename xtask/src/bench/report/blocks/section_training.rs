//! Section 10: one training step of an MLP (forward, backward, gradients freed) against the
//! same step in PyTorch, and what backward holds: the activations the graph saved against the
//! peak of memory during backward, for cartage and for PyTorch.

use super::section_ops::{REFERENCE_TIME, TIME, model_cells, model_headers};
use super::{Block, Cell, Table, library_name, reference_title, runs_note};
use crate::bench::cases::{Case, ModelOp, Section};
use crate::bench::report::Report;
use crate::bench::report::format::{format_bytes, format_seconds};

pub(super) fn build(report: &Report) -> Vec<Block> {
    let mut blocks = vec![Block::Paragraph(
        "`mlp_step`: one training step of a 4-layer MLP without biases (ReLU between layers, the \
         mean square of the output as the loss): forward, `loss.backward()`, gradients freed. The \
         wide case is bound by its matmuls; the narrow one by the cost of launching each op and \
         recording it, where a lower per-op cost must show. `mlp_train`: a whole step of a \
         classifier built with `cartage-nn` (Linear layers, cross-entropy, backward, AdamW, \
         gradients freed), in f32 and under bf16 autocast. With `--vs-torch` PyTorch eager runs the \
         same step (`loss.backward()`, `torch.optim.AdamW`, `torch.autocast`, `grad = None`) in the \
         same run. \"Activations\" are the bytes the recorded graph saved for backward when the \
         loss is computed. \"Peak memory\" is how far allocated memory rose above its level during \
         backward (`mlp_step`) or during the whole step (`mlp_train`), for cartage and, on CUDA, for \
         PyTorch (`torch.cuda.max_memory_allocated`). `gpt_train`: a whole step of a GPT \
         (`cartage_nn::models::Gpt`; PyTorch: the same modules from `torch.nn`) at two shapes, a \
         character-level one and, on a GPU, a longer-context one with an 8192-token vocabulary, in f32 \
         and under bf16 autocast; its rate counts 6 flop per parameter and token plus the causal \
         attention scores. cartage's blocks recompute their norms and the MLP's activation in \
         backward (`Recompute::NormsAndActivation`, the default) where PyTorch keeps them; \
         `CARTAGE_GPT_RECOMPUTE` (`nothing`, `norms`, `norms_and_activation`) picks another \
         choice, named in the row when set. The MLP and GPT steps run three times on each side, interleaved (cartage, \
         the reference, cartage, …): their time is the median of the three runs' medians, the range \
         under it spans the runs' medians, and the speed compares the two medians. Its graph rows replay forward and backward from memory the graph reserved in its \
         private pool when it was captured, so a replayed step raises allocated memory by nothing \
         and its peak reads \"in the graph's pool\". `adamw_step`: one AdamW update of all \
         parameters with their gradients given (cartage's multi-tensor `adam_step_many` against \
         `torch.optim.AdamW(fused=True)` on CUDA, the default implementation on the CPU, or numpy)."
            .into(),
    )];
    let all: Vec<_> = report.section_rows(Section::Training).collect();
    let pipeline = super::training_pipeline::blocks(&all);
    let memory = super::training_memory::blocks(report, &all);
    let rows: Vec<_> = all
        .into_iter()
        .filter(|r| !matches!(r.params, Case::Model(ModelOp::TrainPipeline { .. })))
        .collect();
    if rows.is_empty() {
        blocks.extend(memory);
        blocks.extend(pipeline);
        return blocks;
    }
    let reference = reference_title(rows.iter().copied());
    let reference_peak = format!("{reference} peak memory");
    let mut headers = model_headers(&reference);
    headers.extend(["Activations", "Peak memory", &reference_peak]);
    let mut table = Table::new(&headers);
    let bytes = |v: Option<&f64>| v.map_or_else(Cell::none, |b| Cell::plain(format_bytes(*b as usize)));
    for r in rows {
        let Case::Model(op) = &r.params else { continue };
        let mut cells = model_cells(r, op, &reference);
        // A step run several times: its range across runs under its median, on each side.
        if let Some(note) = runs_note(&r.runs) {
            cells[TIME] = Cell::plain(format_seconds(r.median)).with_note(note);
        }
        if let Some((x, note)) = r.reference.as_ref().and_then(|x| Some((x, runs_note(&x.runs)?))) {
            let time = Cell::plain(format_seconds(x.median));
            cells[REFERENCE_TIME] = if reference == "Reference" {
                time.with_note(format!("{}; {note}", library_name(&x.library)))
            } else {
                time.with_note(note)
            };
        }
        // The backward alone for the MLP step; the whole step for the AdamW training step.
        let peak = if matches!(op, ModelOp::MlpTrain { .. } | ModelOp::GptTrain { .. }) {
            "step_peak_bytes"
        } else {
            "backward_peak_bytes"
        };
        // A replayed graph's memory was reserved at capture: its step peak above the level
        // before the step is 0 and says nothing about what the step needs.
        let graph = matches!(op, ModelOp::GptTrain { graph: true, .. });
        cells.extend([
            bytes(r.counters.get("activation_bytes")),
            if graph {
                Cell::plain("in the graph's pool".to_string())
            } else {
                bytes(r.counters.get(peak))
            },
            bytes(r.reference.as_ref().and_then(|x| x.counters.get(peak))),
        ]);
        table.push(cells);
    }
    blocks.push(Block::Table(table));
    blocks.extend(memory);
    blocks.extend(pipeline);
    blocks
}
