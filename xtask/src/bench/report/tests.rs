//! Tests of the report model: ceilings from rows, the roofline verdict per row, the rendered
//! sections (crossover, skips, reference ratios) and the JSON schema.

use super::blocks::{Block, build};
use super::*;
use crate::bench::cases::{Case, PipelineMode, Section, Task, VectorOp};

fn row(section: Section, device: &str, dtype: &str, case: Case, median: f64) -> Row {
    let name = if device == "cpu" { "test cpu" } else { "test gpu" };
    let task = Task::new(section, device, name, dtype, case.clone());
    let element = cartage::DType::from_name(dtype).unwrap().size_in_bytes();
    Row {
        id: task.id,
        section,
        backend: device.split(':').next().unwrap().into(),
        device: device.into(),
        device_name: name.into(),
        case: case.name(),
        dtype: dtype.into(),
        size: case.size(),
        size_unit: case.size_unit().into(),
        median,
        p10: median * 0.9,
        p90: median * 1.2,
        unit: "s".into(),
        samples: 5,
        iters_per_sample: 1,
        timing: "device-events".into(),
        work: case.work(element),
        rate: None,
        rate_unit: None,
        bound: None,
        fraction_of_ceiling: None,
        counters: Default::default(),
        reference: None,
        params: case,
    }
}

fn device(device: &str, backend: &str) -> DeviceEntry {
    DeviceEntry {
        device: device.into(),
        backend: backend.into(),
        name: if backend == "cpu" { "test cpu" } else { "test gpu" }.into(),
        total_memory: Some(1 << 30),
        details: vec![("driver".into(), "1.0".into())],
        software: false,
        timing: "device-events".into(),
        capabilities: Vec::new(),
        ceilings: Ceilings::default(),
    }
}

fn matmul(n: usize) -> Case {
    Case::Matmul { n, tf32: false }
}

/// A CPU at 100 GFLOP/s and 20 GB/s, a GPU at 10 TFLOP/s and 1 TB/s with 20 µs per op.
fn sample_report() -> Report {
    let mut report = Report {
        devices: vec![device("cpu", "cpu"), device("cuda:0", "cuda")],
        ..Report::default()
    };
    for n in [32usize, 128, 512, 2048] {
        let flops = 2.0 * (n as f64).powi(3);
        report
            .rows
            .push(row(Section::Sweep, "cpu", "f32", matmul(n), 1e-6 + flops / 100e9));
        report
            .rows
            .push(row(Section::Sweep, "cuda:0", "f32", matmul(n), 20e-6 + flops / 10e12));
    }
    let numel = 1 << 24;
    for (dev, bw) in [("cpu", 20e9), ("cuda:0", 1e12)] {
        let copy = Case::Vector {
            op: VectorOp::Copy,
            numel,
        };
        let add = Case::Vector {
            op: VectorOp::Add,
            numel,
        };
        report
            .rows
            .push(row(Section::Elementwise, dev, "f32", copy, 8.0 * numel as f64 / bw));
        report.rows.push(row(
            Section::Elementwise,
            dev,
            "f32",
            add,
            2.0 * 12.0 * numel as f64 / bw,
        ));
        let h2d = Case::HostToDevice {
            bytes: 1 << 24,
            pinned: true,
        };
        report
            .rows
            .push(row(Section::Transfers, dev, "f32", h2d, (1 << 24) as f64 / 10e9));
    }
    report.skips.push(Skip {
        id: "cuda/test-gpu/matmul_bf16_32".into(),
        section: Section::Sweep,
        device: "cuda:0".into(),
        case: "matmul".into(),
        dtype: "bf16".into(),
        size: 32,
        reason: "the device has no `matmul` kernel for bf16".into(),
    });
    report.backends.push(BackendEntry {
        backend: "wgpu".into(),
        compiled: false,
        requested: true,
        devices: Vec::new(),
        problem: Some("wgpu:0 was asked for, but this build of cartage was compiled without its backend".into()),
    });
    report.finalize();
    report
}

#[test]
fn ceilings_come_from_the_copy_the_pinned_transfer_and_the_best_matmul() {
    let report = sample_report();
    let cpu = &report.devices[0].ceilings;
    assert!(
        (cpu.copy_gbps.unwrap() - 20.0).abs() < 1e-6,
        "the copy is the best streaming op: {cpu:?}"
    );
    assert!((cpu.host_link_gbps.unwrap() - 10.0).abs() < 1e-6, "{cpu:?}");
    let best = cpu.matmul_gflops["f32"];
    assert!(
        best > 99.0 && best < 100.0,
        "the largest matmul is nearly at the rate: {best}"
    );
}

#[test]
fn the_roofline_says_compute_bandwidth_or_latency() {
    let report = sample_report();
    let find = |device: &str, case: &str, size: usize| report.find(device, case, "f32", size).unwrap();
    let big = find("cpu", "matmul", 2048);
    assert_eq!(big.bound, Some(Bound::Compute));
    assert!((big.fraction_of_ceiling.unwrap() - 1.0).abs() < 1e-9);
    assert_eq!(big.rate_unit.as_deref(), Some("GFLOP/s"));
    let add = find("cuda:0", "add", 1 << 24);
    assert_eq!(add.bound, Some(Bound::Bandwidth));
    assert!((add.fraction_of_ceiling.unwrap() - 0.5).abs() < 1e-9, "{add:?}");
    let tiny = find("cuda:0", "matmul", 32);
    assert_eq!(
        tiny.bound,
        Some(Bound::Latency),
        "20 µs for 65 kflop is launch cost: {tiny:?}"
    );
    let h2d = find("cpu", "h2d_pinned", 1 << 24);
    assert_eq!(
        (h2d.bound, h2d.rate_unit.as_deref()),
        (Some(Bound::Bandwidth), Some("GB/s"))
    );
}

#[test]
fn a_loop_of_cheap_ops_is_latency_bound() {
    let mut r = row(
        Section::Memory,
        "cpu",
        "f32",
        Case::AllocLoop {
            steps: 10,
            numel: 100,
            empty_cache: true,
        },
        1e-3,
    );
    let ceilings = Ceilings {
        copy_gbps: Some(10.0),
        op_floor_s: Some(1e-5),
        ..Ceilings::default()
    };
    classify(&mut r, &ceilings);
    assert_eq!(r.bound, Some(Bound::Latency), "{r:?}");
    assert!(
        (r.fraction_of_ceiling.unwrap() - 0.4).abs() < 1e-9,
        "40 ops × 10 µs of 1 ms: {r:?}"
    );
}

#[test]
fn the_cheapest_op_sets_the_floor() {
    let report = sample_report();
    let gpu = &report.devices[1].ceilings;
    let floor = gpu.op_floor_s.unwrap();
    assert!((floor - (20e-6 + 65536.0 / 10e12)).abs() < 1e-12, "{gpu:?}");
}

#[test]
fn the_sweep_marks_where_the_gpu_overtakes_the_cpu() {
    let blocks = build(&sample_report());
    let text = format!("{blocks:?}");
    // CPU 32: 1.66 µs vs GPU 20 µs; 128: 43 µs vs 20.4 µs → the GPU leads from 128 on.
    assert!(
        text.contains("`cuda:0` overtakes the CPU from n = 128 and stays ahead"),
        "{text}"
    );
    assert!(
        blocks
            .iter()
            .any(|b| matches!(b, Block::Chart { name, .. } if name == "sweep-time"))
    );
}

#[test]
fn every_section_is_present_and_says_what_was_not_measured() {
    let report = sample_report();
    let blocks = build(&report);
    let headings: Vec<&String> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Heading(2, text) => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(headings.len(), Section::ALL.len(), "{headings:?}");
    for (i, section) in Section::ALL.iter().enumerate() {
        assert!(headings[i].starts_with(&format!("{}. {}", i + 1, section.title())));
    }
    let text = format!("{blocks:?}");
    assert!(text.contains("no `matmul` kernel for bf16"), "skips are listed");
    assert!(
        text.contains("compiled without its backend"),
        "a missing backend is named"
    );
    assert!(
        text.contains("Nothing was measured in this section."),
        "empty sections say so"
    );
}

#[test]
fn reference_ratios_and_a_missing_reference_are_shown() {
    let mut report = sample_report();
    let first = &mut report.rows[0];
    first.reference = Some(ReferenceValue {
        library: "numpy 2.4.6".into(),
        median: first.median * 2.0,
        p10: first.median,
        p90: first.median * 3.0,
        ratio: 0.5,
        counters: Default::default(),
    });
    let text = format!("{:?}", build(&report));
    assert!(text.contains("numpy 2.4.6") && text.contains("0.50×"), "{text}");
    report.reference = ReferenceStatus::NotFound {
        reason: "`python3` has neither torch nor numpy".into(),
    };
    let text = format!("{:?}", build(&report));
    assert!(text.contains("not found: `python3` has neither torch nor numpy"));
    assert!(text.contains("PyTorch/numpy comparison: not available"));
}

#[test]
fn json_rows_carry_the_fields_the_issue_names() {
    let mut report = sample_report();
    report.rows.push(row(
        Section::Transfers,
        "cpu",
        "f32",
        Case::Pipeline {
            batches: 2,
            batch_bytes: 1 << 20,
            cols: 256,
            mode: PipelineMode::Prefetch,
        },
        1e-3,
    ));
    let text = json::render(&report).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let first = &value["rows"][0];
    for field in [
        "backend",
        "device_name",
        "case",
        "dtype",
        "size",
        "median",
        "p10",
        "p90",
        "unit",
        "bound",
        "fraction_of_ceiling",
    ] {
        assert!(!first[field].is_null(), "row lacks `{field}`: {first}");
    }
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(back.rows.len(), report.rows.len());
}

#[test]
fn the_ops_section_shows_the_speed_against_the_target() {
    use crate::bench::cases::ModelOp;
    let mut report = sample_report();
    let norm = Case::Model(ModelOp::LayerNorm { rows: 8192, cols: 4096 });
    let sdpa = Case::Model(ModelOp::Sdpa {
        batch: 8,
        heads: 16,
        seq: 1024,
        head_dim: 64,
        causal: true,
    });
    let mut fast = row(Section::Ops, "cuda:0", "f32", norm, 1e-3);
    fast.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 2e-3,
        p10: 2e-3,
        p90: 2e-3,
        ratio: 0.5,
        counters: Default::default(),
    });
    let mut slow = row(Section::Ops, "cuda:0", "bf16", sdpa, 4e-3);
    slow.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 1e-3,
        p10: 1e-3,
        p90: 1e-3,
        ratio: 4.0,
        counters: Default::default(),
    });
    report.rows.extend([fast, slow]);
    report.finalize();
    let text = format!("{:?}", build(&report));
    assert!(
        text.contains("[8192, 4096]") && text.contains("2.0×") && text.contains("≥ 1.0× ✓"),
        "{text}"
    );
    assert!(
        text.contains("[8, 16, 1024, 64], causal") && text.contains("≥ 0.8× ✗"),
        "{text}"
    );
    let sdpa_row = report.rows.iter().find(|r| r.case == "sdpa_causal").unwrap();
    assert_eq!(
        sdpa_row.rate_unit.as_deref(),
        Some("GFLOP/s"),
        "attention is rated by its arithmetic"
    );
}
