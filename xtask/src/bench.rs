//! `cargo xtask bench`: the cross-backend benchmark report, cartage's main job.
//!
//! In-process (no cargo at run time, so the staged binary runs on a GPU machine): find the
//! devices of the backends asked for, plan the tasks of the report's nine sections for each
//! (`bench/plan.rs`), measure them with `cartage::bench` (`bench/exec.rs`, `bench/exec/`) behind
//! a progress bar, optionally run the same tasks with PyTorch or numpy (`bench/torch.rs`), place
//! every row against its device's measured ceilings, and write `report.json`, `report.md` (with
//! the charts as SVG files beside it) and a self-contained `report.html` (`bench/report/`).
//!
//! A backend that is not compiled in, finds no device or fails a task is reported as such; the
//! run goes on and never panics.

pub mod cases;
mod devices;
mod env;
mod exec;
pub mod implementation;
mod plan;
mod precision_error;
pub mod report;
mod runs;
mod select;
mod torch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use cartage::{DType, DeviceKind};
use indicatif::{ProgressBar, ProgressStyle};

use cases::{Case, Section, Task};
use plan::Plan;
use report::{ReferenceStatus, Report, Row};
use runs::{Figures, STEP_RUNS, attach_reference, is_step};

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Backends to measure, comma-separated: cpu, cuda, wgpu.
    #[arg(long, value_delimiter = ',', default_value = "cpu,cuda,wgpu")]
    backends: Vec<String>,
    /// Small sizes and short budgets: a smoke test of the whole report.
    #[arg(long)]
    quick: bool,
    /// Where to write report.json, report.md, report.html and the charts.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Run the same cases with PyTorch (numpy for CPU rows without PyTorch) and show the ratios.
    #[arg(long)]
    vs_torch: bool,
    /// The Python interpreter for --vs-torch.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Only these sections, comma-separated: devices, sweep, small-tensors, transfers, syncs,
    /// memory, precision, elementwise, ops, training, distributed (all when omitted).
    #[arg(long, value_delimiter = ',')]
    sections: Vec<String>,
    /// Only the cases whose id (`<backend>/<device>/<case>_<dtype>_<size>`) contains one of
    /// these comma-separated words (all when omitted), `_` and `-` alike, case-insensitively:
    /// for measuring a few rows again. A word that picks no task is an error.
    #[arg(long, value_delimiter = ',')]
    cases: Vec<String>,
}

/// Run the report.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let kinds = parse_backends(&args.backends)?;
    let sections = parse_sections(&args.sections)?;
    let plan = Plan::new(args.quick);
    let mut report = Report {
        meta: env::meta(args.quick, SystemTime::now()),
        ..Report::default()
    };

    let discovery = devices::discover(&kinds);
    report.backends = discovery.backends;
    let mut tasks: Vec<(cartage::Device, Task)> = Vec::new();
    // Every planned task of the chosen sections, before `--cases`: what its words must pick from.
    let mut planned_ids: Vec<String> = Vec::new();
    for found in &discovery.devices {
        let (planned, skipped) = plan.tasks(&found.entry.device, &found.entry.name, &found.capabilities);
        let chosen = |section: &Section| sections.is_empty() || sections.contains(section);
        let planned: Vec<Task> = planned.into_iter().filter(|t| chosen(&t.section)).collect();
        planned_ids.extend(planned.iter().map(|t| t.id.clone()));
        tasks.extend(
            planned
                .into_iter()
                .filter(|t| args.cases.is_empty() || args.cases.iter().any(|c| select::matches(&t.id, c)))
                .map(|t| (found.device, t)),
        );
        report.skips.extend(skipped.into_iter().filter(|s| chosen(&s.section)));
        report.devices.push(found.entry.clone());
    }
    // Only where some device was found: without one there is nothing to pick from, and the
    // report says why.
    if !discovery.devices.is_empty() {
        select::check(&args.cases, planned_ids.iter().map(String::as_str))?;
    }
    for b in &report.backends {
        if let Some(problem) = &b.problem {
            eprintln!("bench: {}: {problem}", b.backend);
        }
    }

    let reference = args.vs_torch.then(|| torch::Reference::find(&args.python));
    let covered = |r: &torch::Reference| tasks.iter().filter(|(_, t)| r.covers(&t.device)).count();
    let reference_count = match &reference {
        Some(Ok(r)) => covered(r),
        _ => 0,
    };
    // The model steps run STEP_RUNS times on each side, interleaved: every task, then the
    // reference's; then the steps alone on each side, again and again.
    let steps: Vec<usize> = (0..tasks.len()).filter(|&i| is_step(&tasks[i].1)).collect();
    let steps_referenced = match &reference {
        Some(Ok(r)) => steps.iter().filter(|&&i| r.covers(&tasks[i].1.device)).count(),
        _ => 0,
    };
    let again = (STEP_RUNS - 1) * (steps.len() + steps_referenced);
    let progress = progress_bar((tasks.len() + reference_count + again) as u64);
    let names: HashMap<String, String> = report
        .devices
        .iter()
        .map(|d| (d.device.clone(), d.name.clone()))
        .collect();
    let bench = plan.budget.bench();
    let mut limits = CallLimit::new(plan.max_call);
    // Per task index: the row it made and each run's figures.
    let mut step_runs: HashMap<usize, (usize, Vec<Figures>)> = HashMap::new();
    for (index, (device, task)) in tasks.iter_mut().enumerate() {
        size_pipeline(task, &report);
        size_precision(task, &report, names.get(&task.device).map_or("", |n| n.as_str()));
        let task = &*task;
        progress.set_message(task.id.clone());
        let outcome = match limits.check(task, &report.rows) {
            Some(reason) => Err(reason),
            None => exec::run(task, device, &bench).map_err(|f| f.reason()),
        };
        match outcome {
            Ok(outcome) => {
                let name = names.get(&task.device).cloned().unwrap_or_default();
                let mut row = row(task, &name, outcome);
                precision_error::attach(&mut row, task, device);
                if is_step(task) {
                    step_runs.insert(index, (report.rows.len(), vec![Figures::of_row(&row)]));
                }
                report.rows.push(row);
            }
            Err(reason) => report.skips.push(plan::skip(task, reason)),
        }
        progress.inc(1);
        if progress.is_hidden() {
            log_line(&report, task, progress.position(), progress.length().unwrap_or(0));
        }
    }

    let mut measured: HashMap<String, Vec<torch::Measured>> = HashMap::new();
    report.reference = match &reference {
        None => ReferenceStatus::NotRequested,
        Some(Err(reason)) => {
            eprintln!("bench: no reference library: {reason}");
            ReferenceStatus::NotFound { reason: reason.clone() }
        }
        Some(Ok(r)) => {
            let reference_tasks: Vec<&Task> = tasks.iter().map(|(_, t)| t).filter(|t| r.covers(&t.device)).collect();
            let (status, first) = r.run(&reference_tasks, &plan, &progress);
            first
                .into_iter()
                .for_each(|(k, m)| measured.entry(k).or_default().push(m));
            status
        }
    };
    for _ in 1..STEP_RUNS {
        for &index in &steps {
            let (device, task) = &tasks[index];
            progress.set_message(task.id.clone());
            if let Some((_, runs)) = step_runs.get_mut(&index)
                && let Ok(outcome) = exec::run(task, device, &bench)
            {
                runs.push(Figures::of(&outcome.measurement));
            }
            progress.inc(1);
        }
        if let Some(Ok(r)) = &reference {
            let again: Vec<&Task> = steps
                .iter()
                .map(|&i| &tasks[i].1)
                .filter(|t| r.covers(&t.device))
                .collect();
            if !again.is_empty() {
                let (_, more) = r.run(&again, &plan, &progress);
                more.into_iter()
                    .for_each(|(k, m)| measured.entry(k).or_default().push(m));
            }
        }
    }
    for (row_index, runs) in step_runs.values() {
        Figures::merge(&mut report.rows[*row_index], runs);
    }
    attach_reference(&mut report, &tasks, &measured);
    progress.finish_and_clear();
    report.meta.duration_s = started.elapsed().as_secs_f64();
    report.finalize();
    write(&args.out, &report)?;
    eprintln!(
        "bench: {} measurements, {} skipped, in {:.0} s; report at {}",
        report.rows.len(),
        report.skips.len(),
        report.meta.duration_s,
        args.out.join("report.html").display()
    );
    Ok(())
}

/// Give a pipeline task its width from the device's measured matmul rate and host link (both
/// measured earlier in the run), so that compute and copy take about as long.
fn size_pipeline(task: &mut Task, report: &Report) {
    let Case::Pipeline { cols, .. } = &mut task.case else {
        return;
    };
    if *cols != 0 {
        return;
    }
    let rows = || report.rows.iter().filter(|r| r.device == task.device);
    let gflops = rows()
        .filter(|r| r.case == "matmul" && r.dtype == "f32")
        .map(|r| r.work.flops / r.median / 1e9)
        .fold(0.0, f64::max);
    let link = rows()
        .filter(|r| r.case == "h2d_pinned")
        .max_by_key(|r| r.size)
        .map(|r| r.work.link_bytes / r.median / 1e9);
    *cols = match link {
        Some(link) if gflops > 0.0 => cases::pipeline_cols(gflops, link),
        _ => 256,
    };
}

/// Run the precision comparison at the largest size the sweep reached on the device in every
/// dtype it measured, when that is below the planned size (a slow device skipped the largest
/// sizes): every precision of a device is then compared at one size within the time limit.
fn size_precision(task: &mut Task, report: &Report, device_name: &str) {
    if task.section != cases::Section::Precision {
        return;
    }
    let Case::Matmul { n, tf32 } = task.case else { return };
    let largest_in = |dtype: &str| {
        report
            .rows
            .iter()
            .filter(|r| r.section == cases::Section::Sweep && r.device == task.device)
            .filter(|r| r.case == "matmul" && r.dtype == dtype)
            .map(|r| r.size)
            .max()
    };
    let reached = ["f32", "f16", "bf16"].into_iter().filter_map(largest_in).min();
    if let Some(reached) = reached.filter(|&l| l < n) {
        let case = Case::Matmul { n: reached, tf32 };
        *task = Task::new(task.section, &task.device, device_name, &task.dtype, case);
    }
}

fn parse_backends(names: &[String]) -> anyhow::Result<Vec<DeviceKind>> {
    names
        .iter()
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .map(|n| match n.as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda),
            "wgpu" => Ok(DeviceKind::Wgpu),
            other => anyhow::bail!("unknown backend `{other}` in --backends; expected cpu, cuda or wgpu"),
        })
        .collect()
}

fn parse_sections(names: &[String]) -> anyhow::Result<Vec<Section>> {
    names
        .iter()
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .map(|n| {
            serde_json::from_value::<Section>(serde_json::Value::String(n.clone())).map_err(|_| {
                anyhow::anyhow!(
                    "unknown section `{n}` in --sections; expected devices, sweep, small-tensors, transfers, \
                     syncs, memory, precision, elementwise, ops, training or distributed"
                )
            })
        })
        .collect()
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:32}] {pos}/{len} {wide_msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

/// One line per task where no progress bar is drawn (CI logs).
fn log_line(report: &Report, task: &Task, done: u64, total: u64) {
    let result = match report
        .rows
        .last()
        .filter(|r| r.id == task.id && r.section == task.section)
    {
        Some(r) => report::format_seconds(r.median),
        None => report
            .skips
            .last()
            .map(|s| format!("skipped: {}", s.reason))
            .unwrap_or_default(),
    };
    eprintln!("[{done}/{total}] {} {result}", task.id);
}

/// A row from a task and its outcome (bound and fraction are set by `Report::finalize`).
fn row(task: &Task, device_name: &str, outcome: exec::Outcome) -> Row {
    let m = &outcome.measurement;
    let element = DType::from_name(&task.dtype).map_or(4, |d| d.size_in_bytes());
    Row {
        id: task.id.clone(),
        section: task.section,
        backend: task.device.split(':').next().unwrap_or_default().to_string(),
        device: task.device.clone(),
        device_name: device_name.to_string(),
        case: task.case.name(),
        dtype: task.dtype.clone(),
        size: task.case.size(),
        size_unit: task.case.size_unit().to_string(),
        median: m.median().as_secs_f64(),
        p10: m.p10().as_secs_f64(),
        p90: m.p90().as_secs_f64(),
        unit: "s".into(),
        samples: m.samples().len(),
        iters_per_sample: m.iters_per_sample(),
        timing: m.timing().name().to_string(),
        work: task.case.work(element),
        rate: None,
        rate_unit: None,
        bound: None,
        fraction_of_ceiling: None,
        counters: outcome.counters,
        memory_curve: outcome.memory_curve,
        implementation: outcome.implementation,
        runs: Vec::new(),
        reference: None,
        params: task.case.clone(),
    }
}

/// Skips tasks predicted to take longer than the run's limit per call: a matmul from the last
/// smaller one of the same device and dtype scaled by n³, any other task with arithmetic from
/// its flops at the device's best f32 matmul rate so far. Once a matmul size is over the limit,
/// larger ones are too.
struct CallLimit {
    max: Duration,
    over: HashMap<(String, String, bool), usize>,
}

impl CallLimit {
    fn new(max: Duration) -> Self {
        CallLimit {
            max,
            over: HashMap::new(),
        }
    }

    fn key(task: &Task) -> Option<((String, String, bool), usize)> {
        match task.case {
            Case::Matmul { n, tf32 } => Some(((task.device.clone(), task.dtype.clone(), tf32), n)),
            _ => None,
        }
    }

    /// Why `task` should not run, if it would pass the limit.
    fn check(&mut self, task: &Task, rows: &[Row]) -> Option<String> {
        let limit = self.max.as_secs_f64();
        let on_device = || rows.iter().filter(|r| r.device == task.device && r.median > 0.0);
        let prediction = match Self::key(task) {
            Some((key, n)) => {
                if let Some(&smaller) = self.over.get(&key).filter(|&&m| m <= n) {
                    return Some(format!("n = {smaller} was already over this run's time limit per call"));
                }
                on_device()
                    .filter(|r| r.case == "matmul" && r.dtype == task.dtype && r.size < n)
                    .max_by_key(|r| r.size)
                    .map(|r| (r.median * (n as f64 / r.size as f64).powi(3), format!("n = {}", r.size)))
            }
            None => {
                let flops = task.case.work(4).flops;
                let rate = on_device()
                    .filter(|r| r.case == "matmul" && r.dtype == "f32")
                    .map(|r| r.work.flops / r.median)
                    .fold(0.0, f64::max);
                (flops > 0.0 && rate > 0.0).then(|| (flops / rate, "the device's matmul rate".to_string()))
            }
        };
        let (predicted, from) = prediction.filter(|(p, _)| *p > limit)?;
        if let Some((key, n)) = Self::key(task) {
            let entry = self.over.entry(key).or_insert(n);
            *entry = (*entry).min(n);
        }
        Some(format!(
            "predicted {} per call from {from}, over this run's limit of {}",
            report::format_seconds(predicted),
            report::format_seconds(limit)
        ))
    }
}

/// Arguments of `cargo xtask report`.
#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    /// A `report.json` written by `cargo xtask bench`.
    #[arg(long)]
    from: PathBuf,
    /// Where to write the report (Markdown, HTML, SVG charts and the JSON again).
    #[arg(long)]
    out: PathBuf,
}

/// `cargo xtask report`: render a report again from its `report.json`, without measuring. The
/// measurements stay those of the run (and of the commit) the JSON records; what is derived from
/// them (the ceilings, each row's rate and bound) is computed again with this build's rules.
pub fn render(args: RenderArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.from).with_context(|| format!("reading {}", args.from.display()))?;
    let mut report: Report =
        serde_json::from_str(&text).with_context(|| format!("{} is not a cartage report.json", args.from.display()))?;
    report.finalize();
    write(&args.out, &report)?;
    eprintln!(
        "report rendered from {} into {}",
        args.from.display(),
        args.out.display()
    );
    Ok(())
}

/// Write the report files into `dir`.
fn write(dir: &Path, report: &Report) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let blocks = report::blocks::build(report);
    let files = [
        ("report.json", report::json::render(report)?),
        ("report.md", report::markdown::render(&blocks)),
        ("report.html", report::html::render("cartage benchmark report", &blocks)),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    for block in &blocks {
        if let report::blocks::Block::Chart { name, svg, .. } = block {
            let path = dir.join(format!("{name}.svg"));
            std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_chosen_by_their_report_names() {
        let names = ["ops".to_string(), " Small-Tensors ".to_string()];
        assert_eq!(parse_sections(&names).unwrap(), [Section::Ops, Section::SmallTensors]);
        let err = parse_sections(&["kernels".to_string()]).unwrap_err().to_string();
        assert!(
            err.contains("unknown section `kernels`") && err.contains("ops"),
            "{err}"
        );
        assert!(parse_sections(&[]).unwrap().is_empty(), "no filter: every section");
    }
}
