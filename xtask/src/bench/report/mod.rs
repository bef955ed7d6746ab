//! The benchmark report as data: what was measured ([`Row`]), what was skipped and why ([`Skip`]),
//! the devices with their measured ceilings ([`DeviceEntry`], [`Ceilings`]), and the reference
//! library's figures. [`Report::finalize`] places every row against its device's ceilings
//! (the roofline of LESSONS R1): the bound that applies and the fraction of the ceiling reached.
//!
//! Writers: [`json`] (`report.json`), [`markdown`] (`report.md`), [`html`] (`report.html`), all
//! rendering the same [`blocks`]; [`charts`] draws the SVG charts, [`mod@format`] writes numbers
//! and verdicts, and [`peaks`] holds the datasheet figures of known devices.

pub mod blocks;
pub mod charts;
pub mod format;
pub mod html;
pub mod json;
pub mod markdown;
pub mod peaks;
pub mod spread;

pub use format::format_seconds;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bench::cases::{Case, Section, Work};

/// Which ceiling limits an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Memory bandwidth (device memory, or the host link for transfers).
    Bandwidth,
    /// Arithmetic rate.
    Compute,
    /// Fixed costs per op (checks, allocation, launch, dispatch, synchronisation): the op count
    /// times the device's cheapest op predicts more time than its arithmetic or its bytes.
    Latency,
}

impl Bound {
    /// `bandwidth`, `compute` or `latency`.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Bandwidth => "bandwidth",
            Bound::Compute => "compute",
            Bound::Latency => "latency",
        }
    }
}

/// Facts about the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    /// When the run started (RFC 3339, UTC).
    pub date: String,
    /// The commit measured (`git describe`), or `unknown`.
    pub commit: String,
    /// The host's name.
    pub host: String,
    /// The host's processor.
    pub cpu: String,
    /// Logical cores.
    pub cores: usize,
    /// `--quick` runs fewer sizes and shorter budgets.
    pub quick: bool,
    /// The command line.
    pub command: String,
    /// Seconds the whole run took.
    pub duration_s: f64,
}

/// One backend family: compiled in or not, asked for or not, what it found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendEntry {
    /// `cpu`, `cuda` or `wgpu`.
    pub backend: String,
    /// Compiled into this binary.
    pub compiled: bool,
    /// Named by `--backends`.
    pub requested: bool,
    /// The devices it found and the report measured.
    pub devices: Vec<String>,
    /// Why it measured nothing, or what went wrong (`None` when all is well).
    pub problem: Option<String>,
}

/// Support of one op family for one dtype on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    /// Every op of the family.
    All,
    /// Some ops of the family.
    Some,
    /// None (or the family is not defined for the dtype).
    None,
}

/// One line of a device's capability table: an op family and its support per dtype.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CapabilityRow {
    /// The op family (`unary`, `matmul`, …).
    pub family: String,
    /// (dtype, support) in the order of `DType::ALL`.
    pub support: Vec<(String, Support)>,
}

/// A device's ceilings, measured in this run (R1).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ceilings {
    /// Device-memory bandwidth (bytes read + written per second), in GB/s: the best of `copy`
    /// and the other streaming ops of section 8 (a read-mostly reduction can beat a copy).
    pub copy_gbps: Option<f64>,
    /// Host→device bandwidth from pinned memory at the largest size measured, in GB/s.
    pub host_link_gbps: Option<f64>,
    /// The cheapest op measured (seconds per op): the fixed cost every op pays at least.
    pub op_floor_s: Option<f64>,
    /// Best matmul rate per dtype (`f32`, `f32-tf32`, `f16`, `bf16`), in GFLOP/s.
    pub matmul_gflops: BTreeMap<String, f64>,
}

/// A device the report measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceEntry {
    /// `cpu`, `cuda:0`, `wgpu:0`.
    pub device: String,
    /// The backend family.
    pub backend: String,
    /// The device's name.
    pub name: String,
    /// Total memory in bytes, where known.
    pub total_memory: Option<u64>,
    /// Backend details (driver, compute capability, adapter type…).
    pub details: Vec<(String, String)>,
    /// A software rasteriser (lavapipe), not a GPU.
    pub software: bool,
    /// How the harness timed it (`device-events` or `host-synchronized`).
    pub timing: String,
    /// Capabilities per op family and dtype.
    pub capabilities: Vec<CapabilityRow>,
    /// Measured ceilings (filled by [`Report::finalize`]).
    pub ceilings: Ceilings,
}

/// The reference library's measurement of the same task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReferenceValue {
    /// `torch 2.11.0` or `numpy 2.4.6`.
    pub library: String,
    /// Median seconds per iteration.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// cartage's median over the reference's (below 1: cartage is faster).
    pub ratio: f64,
    /// The reference's case-specific counts (its backward's peak memory…).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, f64>,
    /// The reference's memory at the phases of a few training steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_curve: Vec<MemoryPoint>,
    /// What ran on the reference's side, in a few words (the ATen ops and the kernel family,
    /// `flash attention`, `cuDNN convolution`), or `unknown`.
    #[serde(rename = "impl", default, skip_serializing_if = "Option::is_none")]
    pub implementation: Option<String>,
    /// The median of each run, in run order, where the case ran several times interleaved with
    /// cartage's runs (the training steps); `median` is then their median.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
}

/// Device memory at one phase of a training step (see `exec/training.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// The step, from 0.
    pub step: u32,
    /// The phase that just ended: `start`, `forward`, `backward`, `optimizer` or `zero_grad`.
    pub phase: String,
    /// Bytes held by live tensors.
    pub allocated: f64,
    /// Bytes held in the allocator's segments (allocated + cached).
    pub reserved: f64,
    /// The highest allocated level since the previous point.
    pub peak: f64,
}

/// One measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `<backend>/<device-name>/<case>_<dtype>_<size>`.
    pub id: String,
    /// The section.
    pub section: Section,
    /// `cpu`, `cuda` or `wgpu`.
    pub backend: String,
    /// `cpu`, `cuda:0`, `wgpu:0`.
    pub device: String,
    /// The device's name.
    pub device_name: String,
    /// The case's short name.
    pub case: String,
    /// The element type.
    pub dtype: String,
    /// The case's characteristic size.
    pub size: usize,
    /// What `size` counts (`n`, `bytes`, `steps`, `elements`, `products`).
    pub size_unit: String,
    /// Median time of one iteration.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// The unit of median/p10/p90 (`s`).
    pub unit: String,
    /// Samples taken.
    pub samples: usize,
    /// Iterations per sample.
    pub iters_per_sample: u64,
    /// `device-events` or `host-synchronized`.
    pub timing: String,
    /// Work of one iteration.
    pub work: Work,
    /// The achieved rate of the dominant work (see `rate_unit`).
    pub rate: Option<f64>,
    /// `GFLOP/s` or `GB/s`.
    pub rate_unit: Option<String>,
    /// The ceiling that applies (filled by [`Report::finalize`]).
    pub bound: Option<Bound>,
    /// The fraction of that ceiling reached (filled by [`Report::finalize`]).
    pub fraction_of_ceiling: Option<f64>,
    /// Case-specific counts (host syncs, segment allocations, overlap…).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, f64>,
    /// Memory sampled at the phases of a few training steps (training cases only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_curve: Vec<MemoryPoint>,
    /// What ran on cartage's side, in a few words (the fused kernel or the composition; see
    /// `bench/implementation.rs`), or `unknown`: the ops section's rows.
    #[serde(rename = "impl", default, skip_serializing_if = "Option::is_none")]
    pub implementation: Option<String>,
    /// The median of each run, in run order, where the case ran several times (the training
    /// steps, interleaved with the reference's runs); `median`, `p10` and `p90` are then those
    /// of the run with the median median.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    /// The reference library's figure for the same task, with `--vs-torch`.
    pub reference: Option<ReferenceValue>,
    /// The case itself (for readers that want its parameters).
    pub params: Case,
}

/// A task that did not run, with the reason.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Skip {
    /// The task's name.
    pub id: String,
    /// The section.
    pub section: Section,
    /// The device.
    pub device: String,
    /// The case's short name.
    pub case: String,
    /// The element type.
    pub dtype: String,
    /// The case's characteristic size.
    pub size: usize,
    /// Why it did not run.
    pub reason: String,
}

/// Whether the reference (PyTorch or numpy) ran.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ReferenceStatus {
    /// `--vs-torch` was not given.
    #[default]
    NotRequested,
    /// No usable Python library was found.
    NotFound {
        /// What was tried and what was missing.
        reason: String,
    },
    /// The reference ran.
    Ran {
        /// The interpreter.
        python: String,
        /// `torch` version, if present.
        torch: Option<String>,
        /// The CUDA device PyTorch saw, if any.
        torch_cuda: Option<String>,
        /// `numpy` version, if present.
        numpy: Option<String>,
        /// Tasks it measured.
        measured: usize,
        /// Tasks it skipped, with reasons.
        skipped: Vec<(String, String)>,
        /// The settings it ran under, as it reported them (TF32 for matmuls and cuDNN,
        /// `cudnn.benchmark`, cuDNN's version…), name and value.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        settings: Vec<(String, String)>,
    },
    /// The reference runner failed part-way.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

/// The whole report.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Facts about the run.
    pub meta: Meta,
    /// Every backend family.
    pub backends: Vec<BackendEntry>,
    /// Every measured device.
    pub devices: Vec<DeviceEntry>,
    /// Every measurement.
    pub rows: Vec<Row>,
    /// Every task that did not run.
    pub skips: Vec<Skip>,
    /// The reference library.
    pub reference: ReferenceStatus,
}

impl Report {
    /// The rows of one section, in measurement order.
    pub fn section_rows(&self, section: Section) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(move |r| r.section == section)
    }

    /// The skips of one section.
    pub fn section_skips(&self, section: Section) -> impl Iterator<Item = &Skip> {
        self.skips.iter().filter(move |s| s.section == section)
    }

    /// The row of `device` for `case`/`dtype`/`size`, if measured.
    pub fn find(&self, device: &str, case: &str, dtype: &str, size: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.device == device && r.case == case && r.dtype == dtype && r.size == size)
    }

    /// Derive each device's ceilings from its rows, then place every row against them.
    pub fn finalize(&mut self) {
        for device in &mut self.devices {
            device.ceilings = ceilings_of(&self.rows, &device.device);
        }
        let ceilings: BTreeMap<String, Ceilings> = self
            .devices
            .iter()
            .map(|d| (d.device.clone(), d.ceilings.clone()))
            .collect();
        for row in &mut self.rows {
            if let Some(c) = ceilings.get(&row.device) {
                classify(row, c);
            }
        }
    }
}

/// The key of a matmul row in [`Ceilings::matmul_gflops`].
pub fn matmul_key(row: &Row) -> Option<String> {
    match row.params {
        Case::Matmul { tf32: false, .. } => Some(row.dtype.clone()),
        Case::Matmul { tf32: true, .. } => Some(format!("{}-tf32", row.dtype)),
        _ => None,
    }
}

fn ceilings_of(rows: &[Row], device: &str) -> Ceilings {
    let mut c = Ceilings::default();
    let best = |slot: &mut Option<f64>, v: f64| *slot = Some(slot.map_or(v, |s: f64| s.max(v)));
    let mut largest_pinned = 0;
    for row in rows.iter().filter(|r| r.device == device && r.median > 0.0) {
        if row.work.ops > 0.0 {
            let per_op = row.median / row.work.ops;
            c.op_floor_s = Some(c.op_floor_s.map_or(per_op, |f: f64| f.min(per_op)));
        }
        match row.params {
            Case::Vector { .. } => best(&mut c.copy_gbps, row.work.device_bytes / row.median / 1e9),
            Case::HostToDevice { bytes, pinned: true } if bytes >= largest_pinned => {
                largest_pinned = bytes;
                c.host_link_gbps = Some(row.work.link_bytes / row.median / 1e9);
            }
            Case::Matmul { .. } => {
                if let Some(key) = matmul_key(row) {
                    let rate = row.work.flops / row.median / 1e9;
                    let slot = c.matmul_gflops.entry(key).or_insert(rate);
                    *slot = slot.max(rate);
                }
            }
            _ => {}
        }
    }
    c
}

/// Set `row`'s rate, bound and fraction of ceiling: the time each ceiling predicts for its work
/// (flops at the matmul rate, bytes at the copy or host-link bandwidth, ops at the cheapest op's
/// cost); the largest prediction names the bound, and prediction ÷ measured time is the fraction.
pub fn classify(row: &mut Row, c: &Ceilings) {
    let w = row.work;
    let t = row.median;
    if t <= 0.0 {
        return;
    }
    let autocast_key = match &row.params {
        Case::Model(op) => op.compute_dtype().map(str::to_string),
        _ => None,
    };
    let compute_ceiling = matmul_key(row)
        .or(autocast_key)
        .and_then(|k| c.matmul_gflops.get(&k).copied())
        .or_else(|| c.matmul_gflops.get(&row.dtype).copied())
        .or_else(|| c.matmul_gflops.get("f32").copied());
    let predict = |work: f64, rate: Option<f64>| match rate {
        Some(rate) if work > 0.0 && rate > 0.0 => Some(work / rate),
        _ => None,
    };
    let terms = [
        (Bound::Compute, predict(w.flops, compute_ceiling.map(|g| g * 1e9))),
        (Bound::Bandwidth, predict(w.device_bytes, c.copy_gbps.map(|g| g * 1e9))),
        (
            Bound::Bandwidth,
            predict(w.link_bytes, c.host_link_gbps.map(|g| g * 1e9)),
        ),
        (Bound::Latency, c.op_floor_s.filter(|_| w.ops > 0.0).map(|f| f * w.ops)),
    ];
    let is_matmul = matches!(
        row.params,
        Case::Matmul { .. }
            | Case::MatmulLoop { .. }
            | Case::MatmulGraph { .. }
            | Case::MatmulBatched { .. }
            | Case::LossLoop { .. }
            | Case::MatmulShape(_)
    ) || row.params.model_op().is_some_and(|(op, _)| op.compute_bound());
    let rate_term = if w.link_bytes > 0.0 {
        Some((w.link_bytes, "GB/s"))
    } else if w.flops > 0.0 && is_matmul {
        Some((w.flops, "GFLOP/s"))
    } else if w.device_bytes > 0.0 {
        Some((w.device_bytes, "GB/s"))
    } else {
        None
    };
    if let Some((work, unit)) = rate_term {
        row.rate = Some(work / t / 1e9);
        row.rate_unit = Some(unit.to_string());
    }
    let dominant = terms
        .iter()
        .filter_map(|(bound, time)| time.map(|time| (*bound, time)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((bound, predicted)) = dominant {
        row.bound = Some(bound);
        row.fraction_of_ceiling = Some(predicted / t);
    }
}

#[cfg(test)]
mod tests;
