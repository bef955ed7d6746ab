//! Tests of the report model: ceilings from rows, the roofline verdict per row, the rendered
//! sections (summary, crossover, skips, reference ratios), the JSON schema, the formatting rules
//! (units scaled to the value, ratios in words, bounds named only near their ceiling), the
//! charts' styles, and the committed reports rendered as a reader sees them.

use super::blocks::{Block, Tone, build};
use super::format::{
    bound_cell, clock, feature_list, format_bandwidth, format_bytes, format_flops, format_seconds, speed,
    speed_from_ratio, verdict,
};
use super::*;
use crate::bench::cases::{Case, PipelineMode, Section, Task, VectorOp};

mod backward;

/// The text of every `<text>` element of an SVG, trimmed.
pub(super) fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>').and_then(|(_, rest)| rest.split_once("</text>")))
        .map(|(text, _)| text.trim().to_string())
        .collect()
}

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
        memory_curve: Vec::new(),
        implementation: None,
        runs: Vec::new(),
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
    for name in ["sweep-time-f32", "sweep-rate-f32"] {
        assert!(
            blocks
                .iter()
                .any(|b| matches!(b, Block::Chart { name: n, .. } if n == name)),
            "{name} is charted"
        );
    }
}

#[test]
fn every_section_is_present_and_says_what_was_not_measured() {
    let report = sample_report();
    let blocks = build(&report);
    let headings: Vec<&String> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Heading { level: 2, text, .. } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(headings.len(), Section::ALL.len() + 1, "{headings:?}");
    assert_eq!(headings[0], "Summary", "the summary comes first");
    for (i, section) in Section::ALL.iter().enumerate() {
        assert!(headings[i + 1].starts_with(&format!("{}. {}", i + 1, section.title())));
    }
    let contents = blocks.iter().find_map(|b| match b {
        Block::Contents(entries) => Some(entries),
        _ => None,
    });
    assert_eq!(
        contents.map(|c| c.len()),
        Some(Section::ALL.len() + 1),
        "a table of contents links every part"
    );
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
        memory_curve: Vec::new(),
        implementation: None,
        runs: Vec::new(),
    });
    report.reference = ReferenceStatus::Ran {
        python: "python3".into(),
        torch: None,
        torch_cuda: None,
        numpy: Some("2.4.6".into()),
        measured: 1,
        skipped: Vec::new(),
        settings: Vec::new(),
    };
    let text = format!("{:?}", build(&report));
    assert!(
        text.contains("numpy 2.4.6 for `cpu`"),
        "the version once, in the header: {text}"
    );
    assert_eq!(text.matches("2.4.6").count(), 1, "and nowhere else");
    assert!(text.contains("2.0× faster"), "{text}");
    report.reference = ReferenceStatus::NotFound {
        reason: "`python3` has neither torch nor numpy".into(),
    };
    let text = format!("{:?}", build(&report));
    assert!(text.contains("not found: `python3` has neither torch nor numpy"));
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
        padded: false,
    });
    let mut fast = row(Section::Ops, "cuda:0", "f32", norm, 1e-3);
    fast.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 2e-3,
        p10: 2e-3,
        p90: 2e-3,
        ratio: 0.5,
        counters: Default::default(),
        memory_curve: Vec::new(),
        implementation: None,
        runs: Vec::new(),
    });
    let mut slow = row(Section::Ops, "cuda:0", "bf16", sdpa, 4e-3);
    slow.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 1e-3,
        p10: 1e-3,
        p90: 1e-3,
        ratio: 4.0,
        counters: Default::default(),
        memory_curve: Vec::new(),
        implementation: None,
        runs: Vec::new(),
    });
    report.rows.extend([fast, slow]);
    report.finalize();
    let text = format!("{:?}", build(&report));
    assert!(
        text.contains("[8192, 4096]") && text.contains("2.0× faster") && text.contains("≥ 1.0× ✓"),
        "{text}"
    );
    assert!(
        text.contains("[8, 16, 1024, 64], causal") && text.contains("4.0× slower") && text.contains("≥ 0.8× ✗"),
        "{text}"
    );
    let sdpa_row = report.rows.iter().find(|r| r.case == "sdpa_causal").unwrap();
    assert_eq!(
        sdpa_row.rate_unit.as_deref(),
        Some("GFLOP/s"),
        "attention is rated by its arithmetic"
    );
}

#[test]
fn units_are_scaled_to_the_value() {
    assert_eq!(format_flops(692_262.1e9), "692 TFLOP/s");
    assert_eq!(format_flops(51_115.7e9), "51.1 TFLOP/s");
    assert_eq!(format_flops(919.3e9), "919 GFLOP/s");
    assert_eq!(format_flops(3.7e9), "3.70 GFLOP/s");
    assert_eq!(format_flops(999.8e9), "1.00 TFLOP/s", "no `1000 GFLOP/s`");
    assert_eq!(format_bandwidth(4009.45e9), "4.01 TB/s");
    assert_eq!(format_bandwidth(55.1e9), "55.1 GB/s");
    assert_eq!(format_bandwidth(0.65e9), "650 MB/s");
    assert_eq!(format_seconds(2.56e-6), "2.56 µs");
    assert_eq!(format_seconds(953e-9), "953 ns");
    assert_eq!(format_seconds(999.7e-6), "1.00 ms", "no `1000 µs`");
    assert_eq!(format_seconds(0.151), "151 ms");
    assert_eq!(format_bytes(64 << 10), "64 KiB");
    assert_eq!(format_bytes(3 << 19), "1.5 MiB");
    assert_eq!(format_bytes(256 << 20), "256 MiB");
    assert_eq!(format_bytes(135_149_060_096), "126 GiB");
    assert_eq!(rate_of("GFLOP/s", 692_262.1), "692 TFLOP/s");
    assert_eq!(rate_of("GB/s", 4009.45), "4.01 TB/s");
}

fn rate_of(unit: &str, value: f64) -> String {
    format::format_rate(value, unit)
}

#[test]
fn ratios_read_as_faster_or_slower_in_words() {
    let cell = speed_from_ratio(1.8e-2);
    assert_eq!((cell.text.as_str(), cell.tone), ("56× faster", Tone::Good));
    let cell = speed_from_ratio(1.8);
    assert_eq!((cell.text.as_str(), cell.tone), ("1.8× slower", Tone::Bad));
    let cell = speed(1.0, 1.03);
    assert_eq!((cell.text.as_str(), cell.tone), ("on par", Tone::Even));
    assert_eq!(speed(2e-3, 1e-3).text, "2.0× slower");
    assert_eq!(speed(1e-3, 733e-3).text, "733× faster");
    assert_eq!(speed(0.0, 1.0).text, "–", "no ratio without two times");
    for r in [1e-4, 3e-3, 0.05, 0.5, 0.97, 1.0, 1.2, 40.0, 9000.0] {
        let text = speed_from_ratio(r).text;
        assert!(!text.contains("e-") && !text.contains("e+"), "no exponent: {text}");
    }
}

#[test]
fn a_bound_is_named_only_near_its_ceiling() {
    let near = verdict(Bound::Bandwidth, 0.82);
    assert_eq!((near.text.as_str(), near.tone), ("bandwidth 82%", Tone::Plain));
    let far = verdict(Bound::Bandwidth, 0.032);
    assert_eq!(far.text, "below ceilings (3.2% of bandwidth)");
    assert_eq!(far.tone, Tone::Muted);
    assert!(verdict(Bound::Compute, 0.25).text.starts_with("compute"));
    assert!(verdict(Bound::Latency, 0.249).text.starts_with("below ceilings"));
    // The CPU's gelu of the committed H200 report: 8 flops and 8 bytes per element, 16 ms.
    let mut gelu = row(
        Section::Elementwise,
        "cpu",
        "f32",
        Case::Vector {
            op: VectorOp::Gelu,
            numel: 1 << 24,
        },
        16.1e-3,
    );
    classify(
        &mut gelu,
        &Ceilings {
            copy_gbps: Some(257.0),
            op_floor_s: Some(953e-9),
            matmul_gflops: [("f32".to_string(), 919.0)].into(),
            ..Ceilings::default()
        },
    );
    let cell = bound_cell(&gelu);
    assert!(cell.text.starts_with("below ceilings"), "{cell:?}");
}

#[test]
fn every_series_style_is_distinct_and_colours_are_far_apart() {
    use super::charts::style::{FAMILIES, distance, style};
    let mut seen = std::collections::HashSet::new();
    for family in 0..FAMILIES.len() * 2 {
        for variant in 0..4 {
            assert!(
                seen.insert(style(family, variant)),
                "family {family} variant {variant} repeats a style"
            );
        }
    }
    let colours: Vec<_> = FAMILIES.iter().flatten().copied().collect();
    for (i, a) in colours.iter().enumerate() {
        for b in &colours[i + 1..] {
            assert!(distance(*a, *b) >= 40.0, "{a:?} and {b:?} are too alike");
        }
    }
    for family in 0..FAMILIES.len() {
        let (main, second, reference) = (style(family, 0), style(family, 1), style(family, 2));
        assert!(main.color != second.color && main.dash != second.dash && main.mark != second.mark);
        assert!(main.color != reference.color && main.dash != reference.dash);
    }
}

#[test]
fn the_sweep_chart_draws_each_series_in_its_own_colour_with_the_legend_beside_it() {
    use super::charts::style::hex;
    let mut report = sample_report();
    for r in report.rows.iter_mut().filter(|r| r.case == "matmul") {
        r.reference = Some(ReferenceValue {
            library: "torch 2.11.0".into(),
            median: r.median * 1.1,
            p10: r.median,
            p90: r.median * 1.2,
            ratio: 1.0 / 1.1,
            counters: Default::default(),
            memory_curve: Vec::new(),
            implementation: None,
            runs: Vec::new(),
        });
    }
    let blocks = build(&report);
    let svg = blocks
        .iter()
        .find_map(|b| match b {
            Block::Chart { name, svg, .. } if name == "sweep-time-f32" => Some(svg.clone()),
            _ => None,
        })
        .unwrap();
    let colours: Vec<String> = [(0, 0), (0, 2), (1, 0), (1, 2)]
        .iter()
        .map(|&(f, v)| hex(charts::style::style(f, v).color))
        .collect();
    for c in &colours {
        assert!(svg.contains(c.as_str()), "series colour {c} drawn");
    }
    for name in ["cpu PyTorch", "cuda:0 PyTorch", "cuda:0 ahead of the CPU"] {
        assert!(svg.contains(name), "legend names {name}");
    }
    let texts = svg_texts(&svg);
    assert!(
        texts.iter().any(|t| t.ends_with(" µs")) && texts.iter().any(|t| t.ends_with(" ms")),
        "time ticks in µs and ms: {texts:?}"
    );
    assert!(!texts.iter().any(|t| t.contains("e-")), "no raw exponent on an axis");
    // The legend's text sits right of the plot area.
    let legend_x = svg
        .split("cuda:0 PyTorch")
        .next()
        .and_then(|before| before.rsplit("x=\"").next())
        .and_then(|rest| rest.split('"').next())
        .and_then(|x| x.parse::<u32>().ok())
        .unwrap();
    assert!(legend_x > charts::WIDTH / 2, "legend at x = {legend_x}");
}

#[test]
fn the_summary_gives_the_crossover_and_the_distance_to_the_datasheet() {
    let mut report = sample_report();
    report.devices[1].name = "NVIDIA H200".into();
    report.finalize();
    let blocks = build(&report);
    let summary: Vec<&Block> = blocks
        .iter()
        .skip_while(|b| !matches!(b, Block::Heading { text, .. } if text == "Summary"))
        .take_while(|b| !matches!(b, Block::Heading { level: 2, text, .. } if text.starts_with("1.")))
        .collect();
    let text = format!("{summary:?}");
    assert!(text.contains("f32 matmul from n = 128"), "{text}");
    assert!(text.contains("NVIDIA H200 SXM datasheet"), "{text}");
    assert!(text.contains("of 4.80 TB/s"), "measured against the datasheet: {text}");
    assert!(
        text.contains("datasheet unknown"),
        "the CPU has no datasheet figures: {text}"
    );
}

#[test]
fn devices_read_as_a_person_would_write_them() {
    assert_eq!(clock("cpu", "device-events"), "host clock (`Instant`)");
    assert_eq!(clock("cuda", "device-events"), "CUDA events");
    assert_eq!(clock("wgpu", "host-synchronized"), "host clock around a device sync");
    let dump = "Features { features_wgpu: FeaturesWGPU(TIMESTAMP_QUERY_INSIDE_ENCODERS | SHADER_F64 | \
                SUBGROUP), features_webgpu: FeaturesWebGPU(TIMESTAMP_QUERY | SHADER_F16) }";
    assert_eq!(
        feature_list(dump),
        "shader-f16, shader-f64, subgroup, timestamp-query, timestamp-query-inside-encoders"
    );
    assert_eq!(feature_list("2.00 GiB"), "2.00 GiB", "other details are left alone");
    let h200 = peaks::lookup("NVIDIA H200", false).unwrap();
    assert_eq!(h200.part, "NVIDIA H200 SXM");
    assert_eq!(h200.memory_bandwidth, 4.8e12);
    assert_eq!(peaks::lookup("NVIDIA H200 NVL", false).unwrap().part, "NVIDIA H200 NVL");
    assert!(
        peaks::lookup("NVIDIA H200", true).is_none(),
        "a software device has no datasheet"
    );
    assert!(peaks::lookup("llvmpipe (LLVM 15.0.6, 256 bits)", false).is_none());
}

/// The committed reports, rendered by this code: what a reader sees obeys the rules above.
#[test]
fn the_committed_reports_render_by_the_rules() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
    for dir in ["h200", "cpu-lavapipe"] {
        let path = root.join(dir).join("report.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            panic!("{} is committed", path.display());
        };
        let mut report: Report = serde_json::from_str(&text).unwrap();
        report.finalize();
        let blocks = build(&report);
        let html = html::render("cartage benchmark report", &blocks);
        let md = markdown::render(&blocks);
        for page in [&html, &md] {
            assert!(
                !page.contains("e-2×") && !page.contains("e-3×"),
                "{dir}: a ratio as an exponent"
            );
            assert!(!page.contains("Features {"), "{dir}: a Debug dump");
            assert!(page.contains("host clock (`Instant`)") || page.contains("host clock (<code>Instant</code>)"));
            let big_gflops = page
                .split(" GFLOP/s")
                .filter_map(|before| before.rsplit(|c: char| !(c.is_ascii_digit() || c == '.')).next())
                .filter_map(|n| n.parse::<f64>().ok())
                .find(|v| *v >= 1000.0);
            assert_eq!(big_gflops, None, "{dir}: GFLOP/s past 1000 should read TFLOP/s");
        }
        assert!(!html.contains("<th></th>"), "{dir}: an empty header cell");
        if let ReferenceStatus::Ran {
            torch: Some(version), ..
        } = &report.reference
        {
            assert_eq!(
                html.matches(version.as_str()).count(),
                1,
                "{dir}: the PyTorch version once"
            );
        }
        for row in &report.rows {
            let cell = bound_cell(row);
            if row.fraction_of_ceiling.is_some_and(|f| f < format::BOUND_FLOOR) {
                assert!(cell.text.starts_with("below ceilings"), "{dir} {}: {cell:?}", row.id);
            }
        }
        let charts = blocks.iter().filter(|b| matches!(b, Block::Chart { .. })).count();
        assert!(charts >= 8, "{dir}: {charts} charts");
    }
}

#[test]
fn the_training_section_draws_the_memory_curve_beside_the_reference() {
    let mut report = sample_report();
    let gpt = small_gpt(false, false);
    let curve = |scale: f64| -> Vec<MemoryPoint> {
        let phases = ["forward", "backward", "optimizer", "zero_grad"];
        let mut points = vec![MemoryPoint {
            step: 0,
            phase: "start".into(),
            allocated: 10e6 * scale,
            reserved: 20e6,
            peak: 10e6 * scale,
        }];
        for step in 0..2 {
            for (i, phase) in phases.iter().enumerate() {
                let allocated = [60e6, 30e6, 30e6, 20e6][i] * scale;
                points.push(MemoryPoint {
                    step,
                    phase: (*phase).into(),
                    allocated,
                    reserved: 80e6,
                    peak: allocated + 5e6,
                });
            }
        }
        points
    };
    let mut r = row(Section::Training, "cuda:0", "f32", gpt, 1e-2);
    r.memory_curve = curve(1.0);
    r.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: 1e-2,
        p10: 1e-2,
        p90: 1e-2,
        ratio: 1.0,
        counters: Default::default(),
        memory_curve: curve(0.5),
        implementation: None,
        runs: Vec::new(),
    });
    report.rows.push(r);
    report.finalize();
    let blocks = build(&report);
    let text = format!("{blocks:?}");
    let chart = blocks
        .iter()
        .find_map(|b| match b {
            Block::Chart { name, svg, .. } if name == "training-memory-cuda0" => Some(svg.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no memory chart in {text}"));
    let labels = svg_texts(&chart);
    assert!(labels.iter().any(|t| t == "cartage f32"), "{labels:?}");
    assert!(labels.iter().any(|t| t == "torch f32"), "{labels:?}");
    // The table lists the second step's phases: 60 MB after cartage's forward, 30 MB for torch's.
    assert!(text.contains("57.2 MiB") && text.contains("28.6 MiB"), "{text}");
}

#[test]
fn the_precision_section_shows_each_error_beside_the_reference() {
    let mut report = sample_report();
    let precision = |dtype: &str, tf32: bool, error: f64, theirs: Option<f64>| {
        let mut r = row(
            Section::Precision,
            "cuda:0",
            dtype,
            Case::Matmul { n: 2048, tf32 },
            1e-3,
        );
        r.counters.insert("max_rel_error".into(), error);
        r.reference = theirs.map(|e| ReferenceValue {
            library: "torch 2.11.0".into(),
            median: 1e-3,
            p10: 1e-3,
            p90: 1e-3,
            ratio: 1.0,
            counters: [("max_rel_error".to_string(), e), ("out_preallocated".to_string(), 1.0)].into(),
            memory_curve: Vec::new(),
            implementation: None,
            runs: Vec::new(),
        });
        r
    };
    let before = format!("{:?}", build(&report));
    assert!(!before.contains("10⁻"), "no error without the measurement");
    report.rows.extend([
        precision("f32", false, 2.5e-7, Some(2.4e-7)),
        precision("f32", true, 4.1e-4, Some(4.0e-4)),
        precision("bf16", false, 9.0e-3, Some(1.0e-3)),
    ]);
    let text = format!("{:?}", build(&report));
    assert!(
        text.contains("2.5 × 10⁻⁷") && text.contains("PyTorch 2.4 × 10⁻⁷"),
        "{text}"
    );
    assert!(text.contains("4.1 × 10⁻⁴"), "{text}");
    assert!(
        text.contains("text: \"9.0 × 10⁻³\", note: Some(\"PyTorch 1.0 × 10⁻³\"), tone: Bad"),
        "nine times the reference's error reads bad: {text}"
    );
    assert!(
        text.contains("wrote into an output allocated once before timing (`out=`) wherever it has that form: `matmul`, `matmul_tf32`. The rest"),
        "the reference's output memory is stated: {text}"
    );
}

#[test]
fn a_report_without_preallocated_references_says_they_allocated() {
    let mut report = sample_report();
    let first = &mut report.rows[0];
    first.reference = Some(ReferenceValue {
        library: "torch 2.11.0".into(),
        median: first.median,
        p10: first.median,
        p90: first.median,
        ratio: 1.0,
        counters: Default::default(),
        memory_curve: Vec::new(),
        implementation: None,
        runs: Vec::new(),
    });
    let text = format!("{:?}", build(&report));
    assert!(text.contains("predate preallocated outputs"), "{text}");
}

#[test]
fn a_training_step_under_autocast_is_held_to_the_bf16_matmul_ceiling() {
    let gpt = |autocast| small_gpt(autocast, false);
    let mut ceilings = Ceilings::default();
    ceilings.matmul_gflops.insert("f32".into(), 100.0);
    ceilings.matmul_gflops.insert("bf16".into(), 1000.0);
    let fraction = |autocast| {
        let case = gpt(autocast);
        let median = case.work(4).flops / 200e9;
        let mut r = row(Section::Training, "cuda:0", "f32", case, median);
        classify(&mut r, &ceilings);
        (r.bound, r.fraction_of_ceiling.unwrap())
    };
    // The same 200 GFLOP/s is twice the f32 ceiling but a fifth of the bf16 one.
    let (bound, f32_fraction) = fraction(false);
    assert_eq!(bound, Some(Bound::Compute));
    assert!((f32_fraction - 2.0).abs() < 1e-9, "{f32_fraction}");
    let (_, bf16_fraction) = fraction(true);
    assert!((bf16_fraction - 0.2).abs() < 1e-9, "{bf16_fraction}");
}

#[test]
fn a_replayed_graph_step_shows_no_peak_of_zero() {
    let mut report = sample_report();
    let gpt = |graph| small_gpt(false, graph);
    for (graph, peak) in [(false, 3.0 * 1024.0 * 1024.0), (true, 0.0)] {
        let mut r = row(Section::Training, "cuda:0", "f32", gpt(graph), 1e-2);
        r.counters.insert("step_peak_bytes".into(), peak);
        report.rows.push(r);
    }
    report.finalize();
    let table = build(&report)
        .into_iter()
        .find_map(|b| match b {
            Block::Table(t) if t.headers.iter().any(|h| h == "Peak memory") => Some(t),
            _ => None,
        })
        .expect("the training table");
    let column = table.headers.iter().position(|h| h == "Peak memory").unwrap();
    let peaks: Vec<&str> = table.rows.iter().map(|r| r[column].text.as_str()).collect();
    assert!(peaks.contains(&"3 MiB"), "{peaks:?}");
    assert!(peaks.contains(&"in the graph's pool"), "{peaks:?}");
    assert!(!peaks.contains(&"0 B"), "{peaks:?}");
}

/// A 2-layer GPT training case, under bf16 autocast when `autocast`, replayed as a graph when
/// `graph`.
fn small_gpt(autocast: bool, graph: bool) -> Case {
    Case::Model(crate::bench::cases::ModelOp::GptTrain {
        layers: 2,
        dim: 64,
        heads: 4,
        context: 32,
        batch: 4,
        vocab: 128,
        autocast,
        graph,
    })
}
