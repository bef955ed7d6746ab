//! The model steps' runs: each MLP and GPT step of the training section runs [`STEP_RUNS`]
//! times on each side, interleaved with the reference's runs, and its row keeps every run's
//! median, their median, and the percentiles of the median run; the reference's figures are
//! attached to the rows the same way ([`attach_reference`]).

use std::collections::HashMap;

use super::cases::{Case, Section, Task};
use super::report::spread::Spread;
use super::report::{ReferenceValue, Report, Row};
use super::torch;

/// How many times each model step runs on each side (interleaved), for the spread across runs.
pub const STEP_RUNS: usize = 3;

/// Whether `task` is a model step, run [`STEP_RUNS`] times.
pub fn is_step(task: &Task) -> bool {
    task.section == Section::Training && matches!(&task.case, Case::Model(op) if op.is_model_step())
}

/// One run's figures of a repeated task.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    median: f64,
    p10: f64,
    p90: f64,
    samples: usize,
    iters_per_sample: u64,
}

impl Figures {
    /// The figures of one measurement.
    pub fn of(m: &cartage::bench::Measurement) -> Figures {
        Figures {
            median: m.median().as_secs_f64(),
            p10: m.p10().as_secs_f64(),
            p90: m.p90().as_secs_f64(),
            samples: m.samples().len(),
            iters_per_sample: m.iters_per_sample(),
        }
    }

    /// The figures a row holds (its first run).
    pub fn of_row(row: &Row) -> Figures {
        Figures {
            median: row.median,
            p10: row.p10,
            p90: row.p90,
            samples: row.samples,
            iters_per_sample: row.iters_per_sample,
        }
    }

    /// Give `row` the runs' medians, their median, and the percentiles of the median run.
    pub fn merge(row: &mut Row, runs: &[Figures]) {
        let medians: Vec<f64> = runs.iter().map(|f| f.median).collect();
        let Some(spread) = Spread::of(&medians) else { return };
        let middle = runs[spread.middle];
        row.median = spread.median;
        row.p10 = middle.p10.min(spread.median);
        row.p90 = middle.p90.max(spread.median);
        row.samples = middle.samples;
        row.iters_per_sample = middle.iters_per_sample;
        row.runs = medians;
    }
}

/// Give each row the reference's figure for its task: with several runs (the model steps),
/// the median of their medians, the percentiles of the median run and every run's median; the
/// counters and memory curve of the first run.
pub fn attach_reference(
    report: &mut Report,
    tasks: &[(cartage::Device, Task)],
    measured: &HashMap<String, Vec<torch::Measured>>,
) {
    for row in &mut report.rows {
        let same = |t: &Task| t.id == row.id && t.section == row.section && t.device == row.device;
        let Some((_, task)) = tasks.iter().find(|(_, t)| same(t)) else {
            continue;
        };
        let Some(all) = measured.get(&torch::key(task)).filter(|all| !all.is_empty()) else {
            continue;
        };
        let first = &all[0];
        let medians: Vec<f64> = all.iter().map(|m| m.median).collect();
        let (median, p10, p90, runs) = match Spread::of(&medians) {
            Some(spread) if all.len() > 1 => {
                let middle = &all[spread.middle];
                (
                    spread.median,
                    middle.p10.min(spread.median),
                    middle.p90.max(spread.median),
                    medians,
                )
            }
            _ => (first.median, first.p10, first.p90, Vec::new()),
        };
        row.reference = Some(ReferenceValue {
            library: first.library.clone(),
            median,
            p10,
            p90,
            ratio: row.median / median,
            counters: first.counters.clone(),
            memory_curve: first.memory_curve.clone(),
            implementation: first.implementation.clone(),
            runs,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::cases::ModelOp;
    use crate::bench::exec::Outcome;

    fn measurement() -> cartage::bench::Measurement {
        let samples = vec![Duration::from_millis(5)];
        cartage::bench::Measurement::from_samples(samples, 1, 1, cartage::bench::Timing::HostSynchronized).unwrap()
    }

    fn figures(median: f64) -> Figures {
        Figures {
            median,
            p10: median * 0.9,
            p90: median * 1.1,
            samples: (median * 100.0) as usize,
            iters_per_sample: 1,
        }
    }

    #[test]
    fn a_step_run_three_times_keeps_the_median_run_and_every_median() {
        let task = Task::new(
            Section::Training,
            "cpu",
            "cpu",
            "f32",
            Case::Model(ModelOp::MlpStep {
                layers: 2,
                width: 8,
                batch: 4,
            }),
        );
        assert!(is_step(&task));
        let outcome = Outcome::from(measurement());
        let mut r = crate::bench::row(&task, "cpu", outcome);
        Figures::merge(&mut r, &[figures(3.0), figures(1.0), figures(2.0)]);
        assert_eq!(r.median, 2.0);
        assert_eq!(r.runs, [3.0, 1.0, 2.0], "each run's median, in run order");
        assert_eq!((r.p10, r.p90, r.samples), (1.8, 2.2, 200), "the median run's figures");
        let adamw = Task::new(
            Section::Training,
            "cpu",
            "cpu",
            "f32",
            Case::Model(ModelOp::AdamW { params: 8, tensors: 2 }),
        );
        assert!(!is_step(&adamw), "the optimizer alone is not a model step");
    }

    #[test]
    fn the_reference_gets_the_median_of_its_runs_and_the_ratio_uses_both_medians() {
        let task = Task::new(
            Section::Training,
            "cpu",
            "cpu",
            "f32",
            Case::Model(ModelOp::MlpStep {
                layers: 2,
                width: 8,
                batch: 4,
            }),
        );
        let outcome = Outcome::from(measurement());
        let mut report = crate::bench::report::Report::default();
        let mut r = crate::bench::row(&task, "cpu", outcome);
        Figures::merge(&mut r, &[figures(1.0), figures(1.2), figures(0.8)]);
        report.rows.push(r);
        let run = |median: f64, implementation: Option<&str>| crate::bench::torch::Measured {
            library: "torch 2.11.0".into(),
            median,
            p10: median * 0.95,
            p90: median * 1.05,
            counters: Default::default(),
            memory_curve: Vec::new(),
            implementation: implementation.map(str::to_string),
        };
        let measured = std::collections::HashMap::from([(
            crate::bench::torch::key(&task),
            vec![run(4.0, Some("first")), run(2.0, None), run(3.0, None)],
        )]);
        let device: cartage::Device = "cpu".parse().unwrap();
        attach_reference(&mut report, &[(device, task)], &measured);
        let reference = report.rows[0].reference.as_ref().unwrap();
        assert_eq!(reference.median, 3.0);
        assert_eq!(reference.runs, [4.0, 2.0, 3.0]);
        assert_eq!(reference.implementation.as_deref(), Some("first"));
        assert!((reference.ratio - 1.0 / 3.0).abs() < 1e-12, "{}", reference.ratio);
    }
}
