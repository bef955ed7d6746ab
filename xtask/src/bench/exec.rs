//! Running one [`Task`] on cartage: set up its tensors on the device, measure it with
//! `cartage::bench`, and return the measurement with any case-specific counters.
//!
//! Compute cases live here; transfers and pipelines in `exec/io.rs`, step loops in
//! `exec/steps.rs`, the ops section (forward, and forward + backward) in `exec/model.rs`.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cartage::bench::{Bench, Measurement};
use cartage::{DType, Device, Error, MatmulPrecision, Result, Tensor};

use super::cases::{Case, ModelOp, Task, VectorOp};
use super::report::MemoryPoint;

mod distributed;
mod io;
mod matmul_algo;
mod model;
mod steps;
mod training;

/// A finished measurement and its counters (host syncs, segment allocations…).
pub struct Outcome {
    /// The harness's measurement of one iteration.
    pub measurement: Measurement,
    /// Case-specific counts.
    pub counters: BTreeMap<String, f64>,
    /// Memory sampled at the phases of a few training steps (training cases only).
    pub memory_curve: Vec<MemoryPoint>,
    /// What ran, in a few words (the ops section's rows).
    pub implementation: Option<String>,
}

impl From<Measurement> for Outcome {
    fn from(measurement: Measurement) -> Self {
        Outcome {
            measurement,
            counters: BTreeMap::new(),
            memory_curve: Vec::new(),
            implementation: None,
        }
    }
}

/// Why a task produced no measurement.
pub enum Failure {
    /// The device cannot run it (a mode it lacks), said plainly.
    Unsupported(String),
    /// An error from cartage, or a panic caught at the task boundary.
    Error(String),
}

impl Failure {
    /// The reason, for the report's skip list.
    pub fn reason(&self) -> String {
        match self {
            Failure::Unsupported(reason) => reason.clone(),
            Failure::Error(reason) => format!("failed: {reason}"),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Unsupported { .. } => Failure::Unsupported(e.to_string()),
            other => Failure::Error(other.to_string()),
        }
    }
}

/// Run `task` on `device` with `bench`. Never panics: a panic inside cartage becomes a failure.
pub fn run(task: &Task, device: &Device, bench: &Bench) -> std::result::Result<Outcome, Failure> {
    let dtype = DType::from_name(&task.dtype).ok_or_else(|| Failure::Error(format!("unknown dtype {}", task.dtype)))?;
    let result = catch_unwind(AssertUnwindSafe(|| run_case(&task.case, dtype, device, bench)));
    // Leave the device idle and the cache as the next task expects, whatever happened.
    let _ = cartage::synchronize(device);
    match result {
        Ok(outcome) => outcome,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Failure::Error(format!("panicked: {message}")))
        }
    }
}

fn run_case(case: &Case, dtype: DType, device: &Device, bench: &Bench) -> std::result::Result<Outcome, Failure> {
    match *case {
        Case::Matmul { n, tf32: false } => Ok(matmul(n, dtype, device, bench)?.into()),
        Case::Matmul { n, tf32: true } => matmul_tf32(n, device, bench),
        Case::MatmulLoop { count, n } => Ok(matmul_loop(count, n, dtype, device, bench)?.into()),
        Case::MatmulGraph { count, n } => Ok(matmul_graph(count, n, dtype, device, bench)?.into()),
        Case::MatmulBatched { count, n } => {
            let a = random(&[count, n, n], dtype, 1, device)?;
            let b = random(&[count, n, n], dtype, 2, device)?;
            Ok(bench.run_on(device, || a.matmul(&b).map(drop))?.into())
        }
        Case::HostToDevice { bytes, pinned } => Ok(io::host_to_device(bytes, pinned, device, bench)?.into()),
        Case::DeviceToHost { bytes, pinned } => Ok(io::device_to_host(bytes, pinned, device, bench)?.into()),
        Case::MoveBatch {
            fields,
            field_bytes,
            packed,
        } => Ok(io::move_batch(fields, field_bytes, packed, device, bench)?.into()),
        Case::Pipeline {
            batches,
            batch_bytes,
            cols,
            mode,
        } => Ok(io::pipeline(batches, batch_bytes, cols, mode, device, bench)?.into()),
        Case::LossLoop {
            steps,
            n,
            read_every_step,
        } => Ok(steps::loss_loop(steps, n, read_every_step, device, bench)?),
        Case::AllocLoop {
            steps,
            numel,
            empty_cache,
        } => Ok(steps::alloc_loop(steps, numel, empty_cache, device, bench)?),
        Case::Vector { op, numel } => Ok(vector(op, numel, dtype, device, bench)?.into()),
        Case::Model(ModelOp::MlpTrain {
            layers,
            width,
            batch,
            autocast,
        }) => Ok(training::mlp_train(layers, width, batch, autocast, device, bench)?),
        Case::Model(ModelOp::AdamW { params, tensors }) => Ok(training::adamw(params, tensors, device, bench)?),
        Case::Model(ref op @ ModelOp::GptTrain { .. }) => Ok(training::gpt_train(op, device, bench)?),
        Case::Model(ModelOp::TrainPipeline { layers, width, batch }) => {
            Ok(training::train_pipeline(layers, width, batch, device, bench)?)
        }
        Case::Model(ModelOp::MlpStep { layers, width, batch }) => {
            Ok(model::mlp_step(layers, width, batch, dtype, device, bench)?)
        }
        Case::Model(ref op) => Ok(model::run(op, dtype, device, bench)?),
        Case::ForwardBackward(ref op) => Ok(model::run_backward(op, dtype, device, bench)?),
        Case::Distributed(ref op) => distributed::run(op, bench),
        Case::MatmulShape(shape) => matmul_algo::run(shape, dtype, device, bench),
    }
}

/// Random normal values of `dtype` on `device`, generated in f32 and cast where the device has
/// no generator for `dtype`.
pub fn random(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
    match Tensor::randn(shape, dtype, seed, device) {
        Err(Error::Unsupported { .. }) if dtype != DType::F32 => {
            Tensor::randn(shape, DType::F32, seed, device)?.to_dtype(dtype)
        }
        other => other,
    }
}

fn matmul(n: usize, dtype: DType, device: &Device, bench: &Bench) -> Result<Measurement> {
    let a = random(&[n, n], dtype, 1, device)?;
    let b = random(&[n, n], dtype, 2, device)?;
    bench.run_on(device, || a.matmul(&b).map(drop))
}

fn matmul_tf32(n: usize, device: &Device, bench: &Bench) -> std::result::Result<Outcome, Failure> {
    if !cartage::set_matmul_precision(device, MatmulPrecision::High)? {
        return Err(Failure::Unsupported(
            "the device has no faster f32 matmul mode (TF32); it keeps full f32".into(),
        ));
    }
    let measured = matmul(n, DType::F32, device, bench);
    cartage::set_matmul_precision(device, MatmulPrecision::Highest)?;
    Ok(measured?.into())
}

fn matmul_loop(count: usize, n: usize, dtype: DType, device: &Device, bench: &Bench) -> Result<Measurement> {
    let a = random(&[count, n, n], dtype, 1, device)?;
    let b = random(&[count, n, n], dtype, 2, device)?;
    let view = |t: &Tensor, i: usize| t.narrow(0, i, 1)?.reshape(&[n, n]);
    let lhs = (0..count).map(|i| view(&a, i)).collect::<Result<Vec<_>>>()?;
    let rhs = (0..count).map(|i| view(&b, i)).collect::<Result<Vec<_>>>()?;
    bench.run_on(device, || {
        for (l, r) in lhs.iter().zip(&rhs) {
            drop(l.matmul(r)?);
        }
        Ok(())
    })
}

/// The products of [`matmul_loop`] captured once in a CUDA graph (outputs kept, so the graph
/// holds them); each iteration is one replay.
fn matmul_graph(count: usize, n: usize, dtype: DType, device: &Device, bench: &Bench) -> Result<Measurement> {
    let a = random(&[count, n, n], dtype, 1, device)?;
    let b = random(&[count, n, n], dtype, 2, device)?;
    let view = |t: &Tensor, i: usize| t.narrow(0, i, 1)?.reshape(&[n, n]);
    let lhs = (0..count).map(|i| view(&a, i)).collect::<Result<Vec<_>>>()?;
    let rhs = (0..count).map(|i| view(&b, i)).collect::<Result<Vec<_>>>()?;
    let products = || {
        lhs.iter()
            .zip(&rhs)
            .map(|(l, r)| l.matmul(r))
            .collect::<Result<Vec<_>>>()
    };
    drop(products()?); // warm-up: modules loaded, cache filled
    let (graph, outputs) = cartage::cuda_graph(device, products)?;
    let measured = bench.run_on(device, || graph.replay());
    drop(outputs);
    measured
}

fn vector(op: VectorOp, numel: usize, dtype: DType, device: &Device, bench: &Bench) -> Result<Measurement> {
    let side = (numel as f64).sqrt() as usize;
    let square = &[side, side];
    let flat = &[numel];
    let shape: &[usize] = match op {
        VectorOp::SumRows | VectorOp::Softmax => square,
        _ => flat,
    };
    let x = random(shape, dtype, 3, device)?;
    let y = random(shape, dtype, 4, device)?;
    match op {
        VectorOp::Copy => {
            let out = Tensor::empty(shape, dtype, device)?;
            bench.run_on(device, || out.copy_from(&x))
        }
        VectorOp::Add => bench.run_on(device, || x.add(&y).map(drop)),
        VectorOp::Mul => bench.run_on(device, || x.mul(&y).map(drop)),
        VectorOp::Exp => bench.run_on(device, || x.exp().map(drop)),
        VectorOp::Relu => bench.run_on(device, || x.relu().map(drop)),
        VectorOp::Gelu => bench.run_on(device, || x.gelu().map(drop)),
        VectorOp::SumAll => bench.run_on(device, || x.sum_all().map(drop)),
        VectorOp::SumRows => bench.run_on(device, || x.sum(&[1], false).map(drop)),
        VectorOp::Softmax => bench.run_on(device, || x.softmax(1).map(drop)),
    }
}
