//! The ops section's forward against forward + backward view (rows paired, the table with each
//! pass's speed and what ran on each side), the range of a training step run several times, and
//! the JSON fields that carry them (read back from reports that lack them).

use super::{device, row};
use crate::bench::cases::{Case, ModelOp, Section};
use crate::bench::report::blocks::ops_pairs::pairs;
use crate::bench::report::blocks::{Block, build};
use crate::bench::report::{ReferenceStatus, ReferenceValue, Report, Row, markdown};

fn norm() -> ModelOp {
    ModelOp::LayerNorm { rows: 8192, cols: 4096 }
}

fn attention() -> ModelOp {
    ModelOp::Sdpa {
        batch: 8,
        heads: 16,
        seq: 1024,
        head_dim: 64,
        causal: true,
        padded: false,
    }
}

/// A row with a PyTorch reference of `theirs` seconds and the words for both sides.
fn against(case: Case, dtype: &str, ours: f64, theirs: f64, words: (&str, &str)) -> Row {
    let mut r = row(Section::Ops, "cuda:0", dtype, case, ours);
    r.implementation = Some(words.0.into());
    r.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: theirs,
        p10: theirs,
        p90: theirs,
        ratio: ours / theirs,
        counters: Default::default(),
        memory_curve: Vec::new(),
        implementation: Some(words.1.into()),
        runs: Vec::new(),
    });
    r
}

/// Forward and forward + backward rows of layer_norm in f32 and bf16 and of attention, with a
/// wgpu device measured without a reference.
fn ops_report() -> Report {
    let mut report = Report {
        devices: vec![device("cuda:0", "cuda"), device("wgpu:0", "wgpu")],
        ..Report::default()
    };
    let fused = (
        "fused `layer_norm`; backward: fused `layer_norm_backward`",
        "native_layer_norm; backward: native_layer_norm_backward",
    );
    report.rows = vec![
        against(
            Case::Model(norm()),
            "f32",
            90e-6,
            100e-6,
            ("fused `layer_norm`", "native_layer_norm"),
        ),
        against(Case::ForwardBackward(norm()), "f32", 500e-6, 200e-6, fused),
        against(
            Case::Model(norm()),
            "bf16",
            60e-6,
            60e-6,
            ("fused `layer_norm`", "native_layer_norm"),
        ),
        against(
            Case::Model(attention()),
            "bf16",
            100e-6,
            65e-6,
            ("fused flash `attention`", "flash attention"),
        ),
        against(
            Case::ForwardBackward(attention()),
            "bf16",
            2e-3,
            200e-6,
            (
                "fused flash `attention`; backward: composed: 4 matmuls + softmax backward on the recomputed scores",
                "flash attention; backward: flash attention backward",
            ),
        ),
        // Listed after its pair's forward row on another device: pairs never cross devices.
        row(Section::Ops, "wgpu:0", "f32", Case::Model(norm()), 1e-3),
        row(Section::Ops, "wgpu:0", "f32", Case::ForwardBackward(norm()), 3e-3),
    ];
    report.rows[6].implementation = Some("fused `layer_norm`; backward: composed".into());
    report
}

#[test]
fn rows_pair_by_device_dtype_and_shape() {
    let report = ops_report();
    let all = pairs(report.rows.iter());
    let shown: Vec<(String, &str, bool, bool)> = all
        .iter()
        .map(|p| {
            let any = p.forward.or(p.backward).unwrap();
            (
                any.device.clone(),
                p.op.name(),
                p.forward.is_some(),
                p.backward.is_some(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("cuda:0".to_string(), "layer_norm", true, true),
            ("cuda:0".to_string(), "layer_norm", true, false),
            ("cuda:0".to_string(), "sdpa_causal", true, true),
            ("wgpu:0".to_string(), "layer_norm", true, true),
        ]
    );
    assert_eq!(all[1].forward.unwrap().dtype, "bf16", "bf16 is a pair of its own");
    assert!(
        pairs(report.rows.iter().skip(5))
            .iter()
            .all(|p| p.forward.unwrap().device == "wgpu:0")
    );
}

#[test]
fn the_ops_section_sets_each_backward_beside_its_forward() {
    let report = ops_report();
    let md = markdown::render(&build(&report));
    let section = md
        .split("<a id=\"ops\">")
        .nth(1)
        .unwrap()
        .split("<a id=\"training\">")
        .next()
        .unwrap();
    assert!(
        section.contains("| Case | Forward | Forward + backward | cartage impl | PyTorch impl |"),
        "{section}"
    );
    // A forward faster than PyTorch does not hide a backward 2.5× slower.
    assert!(
        section.contains(
            "| `layer_norm` f32 [8192, 4096] | 1.1× faster (90.0 µs against 100 µs) | 2.5× slower (500 µs against 200 µs) \
             | fused `layer_norm`; backward: fused `layer_norm_backward` | native_layer_norm; backward: \
             native_layer_norm_backward |"
        ),
        "{section}"
    );
    assert!(
        section.contains(
            "| `sdpa_causal` bf16 [8, 16, 1024, 64], causal | 1.5× slower (100 µs against 65.0 µs) | 10× slower"
        ),
        "{section}"
    );
    assert!(
        section.contains("flash attention; backward: flash attention backward"),
        "{section}"
    );
    // bf16 layer_norm has no backward row: not in the side-by-side view.
    assert!(!section.contains("| `layer_norm` bf16"), "{section}");
    // The device without a reference shows cartage's times and words.
    let wgpu = section.split("`wgpu:0`").nth(1).unwrap();
    assert!(
        wgpu.contains("| Case | Forward | Forward + backward | cartage impl |\n"),
        "{wgpu}"
    );
    assert!(
        wgpu.contains("| `layer_norm` f32 [8192, 4096] | 1.00 ms (900 µs–1.20 ms) | 3.00 ms (2.70–3.60 ms) | fused `layer_norm`; backward: composed |"),
        "{wgpu}"
    );
    // The full table still lists every row, the backward ones by their own name.
    assert!(section.contains("| `cuda:0` | layer_norm_fwd_bwd | f32 |"), "{section}");
}

#[test]
fn a_step_run_several_times_shows_its_range_on_each_side() {
    let op = ModelOp::GptTrain {
        layers: 4,
        dim: 512,
        heads: 8,
        context: 512,
        batch: 16,
        vocab: 8192,
        autocast: false,
        graph: false,
    };
    let mut r = row(Section::Training, "cuda:0", "f32", Case::Model(op), 0.102);
    r.runs = vec![0.101, 0.102, 0.105];
    r.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 0.087,
        p10: 0.086,
        p90: 0.088,
        ratio: 0.102 / 0.087,
        counters: Default::default(),
        memory_curve: Vec::new(),
        implementation: None,
        runs: vec![0.087, 0.086, 0.090],
    });
    let once = row(
        Section::Training,
        "cuda:0",
        "f32",
        Case::Model(ModelOp::AdamW {
            params: 1 << 20,
            tensors: 4,
        }),
        1e-3,
    );
    let report = Report {
        devices: vec![device("cuda:0", "cuda")],
        rows: vec![r, once],
        ..Report::default()
    };
    let md = markdown::render(&build(&report));
    let table = md.split("<a id=\"training\">").nth(1).unwrap();
    assert!(table.contains("| 102 ms (3 runs: 101–105 ms) |"), "{table}");
    assert!(table.contains("| 87.0 ms (3 runs: 86.0–90.0 ms) |"), "{table}");
    assert!(table.contains("1.2× slower"), "the speed compares the medians: {table}");
    // A row run once keeps its p10–p90 spread.
    assert!(table.contains("| 1.00 ms (900 µs–1.20 ms) |"), "{table}");
}

#[test]
fn the_new_fields_round_trip_and_old_reports_read_without_them() {
    let mut report = ops_report();
    report.rows[0].runs = vec![1.0, 2.0, 3.0];
    report.reference = ReferenceStatus::Ran {
        python: "python3".into(),
        torch: Some("2.11.0".into()),
        torch_cuda: None,
        numpy: None,
        measured: 4,
        skipped: Vec::new(),
        settings: vec![("torch.backends.cudnn.benchmark".into(), "False".into())],
    };
    let json = serde_json::to_value(&report).unwrap();
    let first = &json["rows"][0];
    assert_eq!(first["impl"], "fused `layer_norm`");
    assert_eq!(first["reference"]["impl"], "native_layer_norm");
    assert_eq!(first["runs"], serde_json::json!([1.0, 2.0, 3.0]));
    assert_eq!(first["params"]["kind"], "model");
    assert_eq!(json["rows"][1]["params"]["kind"], "forward_backward");
    assert_eq!(json["rows"][1]["case"], "layer_norm_fwd_bwd");
    assert_eq!(json["reference"]["settings"][0][1], "False");
    assert!(json["rows"][5].get("impl").is_none(), "no words, no key");
    let back: Report = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back.rows[1].params, report.rows[1].params);

    // A report written before these fields existed.
    let mut old = json;
    for r in old["rows"].as_array_mut().unwrap() {
        let r = r.as_object_mut().unwrap();
        r.remove("impl");
        r.remove("runs");
        if let Some(x) = r.get_mut("reference").and_then(|x| x.as_object_mut()) {
            x.remove("impl");
            x.remove("runs");
        }
    }
    old["reference"].as_object_mut().unwrap().remove("settings");
    let read: Report = serde_json::from_value(old).unwrap();
    assert!(
        read.rows
            .iter()
            .all(|r| r.implementation.is_none() && r.runs.is_empty())
    );
    let header = markdown::render(&build(&read));
    assert!(!header.contains("run with"), "no settings, none listed");
    let with = markdown::render(&build(&report));
    assert!(
        with.contains("run with `torch.backends.cudnn.benchmark` = `False`"),
        "{with}"
    );
    assert!(matches!(build(&read)[0], Block::Heading { .. }));
}
