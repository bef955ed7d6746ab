//! `--vs-torch`: run the same tasks with PyTorch (or numpy for CPU rows) through
//! `xtask/python/reference.py`, embedded in this binary and written to a temporary file, and
//! attach each reference median to the matching row.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use indicatif::ProgressBar;
use serde::Deserialize;
use serde_json::json;

use super::cases::Task;
use super::plan::Plan;
use super::report::{MemoryPoint, ReferenceStatus};

/// The reference runner's source.
const SCRIPT: &str = include_str!("../../python/reference.py");

/// What the probe found.
#[derive(Debug, Deserialize)]
struct Probe {
    python: String,
    torch: Option<String>,
    torch_cuda: Option<String>,
    cuda_devices: usize,
    numpy: Option<String>,
}

/// One result line of the runner.
#[derive(Debug, Deserialize)]
struct Line {
    key: String,
    median: Option<f64>,
    p10: Option<f64>,
    p90: Option<f64>,
    library: Option<String>,
    skipped: Option<String>,
    #[serde(default)]
    counters: BTreeMap<String, f64>,
    #[serde(default)]
    memory_curve: Vec<MemoryPoint>,
    #[serde(rename = "impl")]
    implementation: Option<String>,
}

/// The runner's first line: the settings every case runs under.
#[derive(Debug, Deserialize)]
struct Settings {
    settings: Vec<(String, String)>,
}

/// A reference measurement.
#[derive(Clone, Debug)]
pub struct Measured {
    /// `torch 2.11.0` or `numpy 2.4.6`.
    pub library: String,
    /// Median seconds.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Case-specific counts the runner reported (its backward's peak memory…).
    pub counters: BTreeMap<String, f64>,
    /// Memory at the phases of a few training steps (CUDA training cases).
    pub memory_curve: Vec<MemoryPoint>,
    /// What ran, in a few words (the ATen ops and their kernel family).
    pub implementation: Option<String>,
}

/// The key that pairs a task with its reference line (ids repeat across sections).
pub fn key(task: &Task) -> String {
    format!("{}/{}/{}", task.section.number(), task.device, task.id)
}

/// A prepared reference run: the interpreter and the tasks it can take.
pub struct Reference {
    python: String,
    probe: Probe,
    dir: tempfile::TempDir,
}

impl Reference {
    /// Find `python` and what it has; `Err` is the report's "not found" reason.
    pub fn find(python: &str) -> Result<Reference, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory for the script: {e}"))?;
        std::fs::write(dir.path().join("reference.py"), SCRIPT)
            .map_err(|e| format!("could not write the script: {e}"))?;
        let output = Command::new(python)
            .arg(dir.path().join("reference.py"))
            .arg("probe")
            .output()
            .map_err(|e| format!("`{python}` could not be started ({e}); install Python 3 or pass --python"))?;
        if !output.status.success() {
            return Err(format!(
                "`{python}` failed to probe: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let probe: Probe = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("`{python}` answered the probe with something unexpected: {e}"))?;
        if probe.torch.is_none() && probe.numpy.is_none() {
            return Err(format!(
                "`{}` has neither torch nor numpy (`pip install torch` or `pip install numpy`)",
                probe.python
            ));
        }
        Ok(Reference {
            python: python.to_string(),
            probe,
            dir,
        })
    }

    /// Whether the reference has a counterpart for `device` (`cpu`, `cuda:N`; never wgpu).
    pub fn covers(&self, device: &str) -> bool {
        if device == "cpu" {
            return true;
        }
        match device.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => self.probe.torch.is_some() && n < self.probe.cuda_devices,
            None => false,
        }
    }

    /// Run `tasks`, advancing `progress` per task; returns the status and the measurements by
    /// [`key`].
    pub fn run(
        &self,
        tasks: &[&Task],
        plan: &Plan,
        progress: &ProgressBar,
    ) -> (ReferenceStatus, HashMap<String, Measured>) {
        let mut measured = HashMap::new();
        let mut skipped = Vec::new();
        let spec_path = self.dir.path().join("spec.json");
        let spec = json!({
            "bench": bench_config(plan),
            "tasks": tasks.iter().map(|t| {
                let mut v = serde_json::to_value(t).unwrap_or_default();
                v["key"] = json!(key(t));
                v
            }).collect::<Vec<_>>(),
        });
        if let Err(e) = std::fs::write(&spec_path, spec.to_string()) {
            return (
                ReferenceStatus::Failed {
                    reason: format!("could not write the task list: {e}"),
                },
                measured,
            );
        }
        let child = Command::new(&self.python)
            .arg(self.dir.path().join("reference.py"))
            .arg("run")
            .arg(&spec_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                return (
                    ReferenceStatus::Failed {
                        reason: format!("`{}` could not be started: {e}", self.python),
                    },
                    measured,
                );
            }
        };
        let stderr = child.stderr.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                text
            })
        });
        let names: HashMap<String, &Task> = tasks.iter().map(|t| (key(t), *t)).collect();
        let mut settings = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(s) = serde_json::from_str::<Settings>(&text) {
                    settings = s.settings;
                    continue;
                }
                let Ok(line) = serde_json::from_str::<Line>(&text) else {
                    continue;
                };
                if let Some(task) = names.get(&line.key) {
                    progress.set_message(format!("reference · {}", task.id));
                }
                progress.inc(1);
                match (line.median, line.skipped) {
                    (Some(median), _) => {
                        measured.insert(
                            line.key,
                            Measured {
                                library: line.library.unwrap_or_default(),
                                median,
                                p10: line.p10.unwrap_or(median),
                                p90: line.p90.unwrap_or(median),
                                counters: line.counters,
                                memory_curve: line.memory_curve,
                                implementation: line.implementation,
                            },
                        );
                    }
                    (None, Some(reason)) => skipped.push((line.key, reason)),
                    (None, None) => {}
                }
            }
        }
        let status = child.wait();
        let errors = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        let finished = measured.len() + skipped.len();
        let failed = match status {
            Ok(s) if s.success() && finished == tasks.len() => None,
            Ok(s) => Some(format!(
                "the runner stopped after {finished} of {} tasks ({s}): {}",
                tasks.len(),
                last_lines(&errors)
            )),
            Err(e) => Some(format!("the runner could not be waited for: {e}")),
        };
        let status = match failed {
            Some(reason) if measured.is_empty() => ReferenceStatus::Failed { reason },
            failed => {
                if let Some(reason) = failed {
                    skipped.push(("runner".into(), reason));
                }
                ReferenceStatus::Ran {
                    python: self.probe.python.clone(),
                    torch: self.probe.torch.clone(),
                    torch_cuda: self.probe.torch_cuda.clone(),
                    numpy: self.probe.numpy.clone(),
                    measured: measured.len(),
                    skipped,
                    settings,
                }
            }
        };
        (status, measured)
    }
}

/// The harness settings of `plan`, for the Python side.
fn bench_config(plan: &Plan) -> serde_json::Value {
    let b = &plan.budget;
    json!({
        "warmup_s": b.warmup.as_secs_f64(),
        "min_warmup": b.min_warmup,
        "budget_s": b.measure.as_secs_f64(),
        "min_samples": b.min_samples,
        "max_samples": b.max_samples,
        "min_sample_time_s": b.min_sample_time.as_secs_f64(),
        "max_call_s": plan.max_call.as_secs_f64(),
    })
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}
