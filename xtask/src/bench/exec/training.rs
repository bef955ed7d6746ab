//! The training section's whole-step cases on cartage: `cartage-nn` training steps of an MLP
//! ([`ModelOp::MlpTrain`]) and a GPT ([`ModelOp::GptTrain`]), the fused AdamW step alone ([`ModelOp::AdamW`]), and the R31
//! breakdown of one real step's time ([`ModelOp::TrainPipeline`]).

use std::collections::BTreeMap;
use std::time::Instant;

use cartage::bench::Bench;
use cartage::optim::{AdamSlot, adam_step_many};
use cartage::tensor::nn::CrossEntropy;
use cartage::{AdamUpdate, DType, Device, Result, Tensor, memory_stats, reset_peak_memory_stats, synchronize};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{Module, ParamStore};

use super::{Outcome, random};
#[allow(unused_imports, reason = "named in the module docs")]
use crate::bench::cases::ModelOp;
use crate::bench::report::MemoryPoint;
use crate::gpt_fixture::GptFixture;

/// The classifier of [`ModelOp::MlpTrain`]: `layers - 1` hidden `Linear(width, width)` + ReLU
/// and a `Linear(width, 10)` head, initialised from seed 0.
fn classifier(store: &ParamStore, layers: usize, width: usize) -> Result<Sequential> {
    let mut rng = cartage::Generator::new(0);
    let mut model = Sequential::new();
    for i in 0..layers.saturating_sub(1) {
        model = model
            .push(Linear::new(&store.root().sub(2 * i), width, width, true, &mut rng)?)
            .push(Activation::Relu);
    }
    Ok(model.push(Linear::new(&store.root().sub("head"), width, 10, true, &mut rng)?))
}

/// One step: forward (under bf16 autocast when asked), cross-entropy, backward, AdamW,
/// gradients freed. Returns the loss (not read).
fn train_step(
    model: &Sequential,
    store: &ParamStore,
    opt: &mut AdamW,
    x: &Tensor,
    y: &Tensor,
    autocast: bool,
) -> Result<Tensor> {
    let loss = {
        let _ac = if autocast {
            Some(cartage::autocast(&x.device(), DType::BF16)?)
        } else {
            None
        };
        model.forward(x)?.cross_entropy(y, CrossEntropy::default())?
    };
    loss.backward()?;
    opt.step(store)?;
    store.zero_grad();
    Ok(loss.detach())
}

/// Class labels `i mod 10` for a batch.
fn labels(batch: usize, device: &Device) -> Result<Tensor> {
    let classes: Vec<i64> = (0..batch).map(|i| (i % 10) as i64).collect();
    Tensor::from_vec(classes, &[batch], device)
}

/// A whole training step with `cartage-nn` (see [`ModelOp::MlpTrain`]). Counter: the peak of
/// allocated memory during one step above its level before the step.
pub fn mlp_train(
    layers: usize,
    width: usize,
    batch: usize,
    autocast: bool,
    device: &Device,
    bench: &Bench,
) -> Result<Outcome> {
    let store = ParamStore::new(device);
    let model = classifier(&store, layers, width)?;
    let mut opt = AdamW::new(&store, 1e-3)?;
    let x = random(&[batch, width], DType::F32, 50, device)?;
    let y = labels(batch, device)?;
    let step = || train_step(&model, &store, &mut opt, &x, &y, autocast).map(drop);
    measure_step(step, device, bench)
}

/// Time a training `step` after one untimed step (the optimizer's state exists from then on,
/// as in the timed steps), with the counter `step_peak_bytes`: how far allocated memory rose
/// above its level before one more step, during it.
fn measure_step(mut step: impl FnMut() -> Result<()>, device: &Device, bench: &Bench) -> Result<Outcome> {
    step()?;
    synchronize(device)?;
    let start = memory_stats(device)?.allocated_bytes;
    reset_peak_memory_stats(device)?;
    step()?;
    synchronize(device)?;
    let peak = memory_stats(device)?.peak_allocated_bytes.saturating_sub(start);
    let measurement = bench.run_on(device, &mut step)?;
    Ok(Outcome {
        measurement,
        counters: BTreeMap::from([("step_peak_bytes".to_string(), peak as f64)]),
        memory_curve: Vec::new(),
        implementation: None,
    })
}

/// A whole GPT training step (see [`ModelOp::GptTrain`]) on random token ids. Counter: the peak
/// of allocated memory during one step above its level before the step.
pub fn gpt_train(op: &ModelOp, device: &Device, bench: &Bench) -> Result<Outcome> {
    let &ModelOp::GptTrain {
        layers,
        dim,
        heads,
        context,
        batch,
        vocab,
        autocast,
        graph,
    } = op
    else {
        return Err(cartage::Error::invalid("gpt_train", "internal: not a GPT case"));
    };
    let mut config = cartage_nn::models::GptConfig::new(vocab, context, dim, heads, layers);
    if let Some(recompute) =
        crate::bench::cases::gpt_recompute().map_err(|e| cartage::Error::invalid("gpt_train", e))?
    {
        config.recompute = recompute;
    }
    let mut gpt = GptFixture::new(config, batch, device)?;
    let mut step = |mark: Mark<'_>| -> Result<()> {
        let loss = gpt.loss(autocast)?;
        mark("forward")?;
        loss.backward()?;
        mark("backward")?;
        gpt.opt.step(&gpt.store)?;
        mark("optimizer")?;
        gpt.store.zero_grad();
        drop(loss);
        mark("zero_grad")
    };
    if graph {
        // One eager step first (modules loaded, moments created), then forward and backward
        // captured with the gradients absent, so the graph writes them; each step replays it
        // and the optimizer steps eagerly (its step count and learning rate change per step).
        step(&mut |_| Ok(()))?;
        let forward_backward = || -> Result<Tensor> {
            let loss = gpt.loss(autocast)?;
            loss.backward()?;
            Ok(loss.detach())
        };
        let (captured, loss) = cartage::cuda_graph(device, forward_backward)?;
        let measured = measure_step(
            || {
                captured.replay()?;
                gpt.opt.step(&gpt.store)
            },
            device,
            bench,
        );
        drop(loss);
        gpt.store.zero_grad();
        drop(captured);
        return measured;
    }
    let mut outcome = measure_step(|| step(&mut |_| Ok(())), device, bench)?;
    outcome.memory_curve = memory_curve(device, CURVE_STEPS, &mut step)?;
    Ok(outcome)
}

/// Called by a training step at the end of each phase, with the phase's name.
type Mark<'a> = &'a mut dyn FnMut(&'static str) -> Result<()>;

/// Steps sampled for a training case's memory curve.
const CURVE_STEPS: u32 = 3;

/// Run `steps` more training steps, sampling device memory before the first and after each phase
/// the step marks (`forward`, `backward`, `optimizer`, `zero_grad`). Reading the allocator's
/// statistics needs no synchronisation: they count blocks as the host hands them out and takes
/// them back. Each point's `peak` is the highest allocated level since the previous point.
fn memory_curve(device: &Device, steps: u32, step: &mut dyn FnMut(Mark<'_>) -> Result<()>) -> Result<Vec<MemoryPoint>> {
    let mut points = Vec::new();
    let sample = |points: &mut Vec<MemoryPoint>, step: u32, phase: &str| -> Result<()> {
        let stats = memory_stats(device)?;
        points.push(MemoryPoint {
            step,
            phase: phase.to_string(),
            allocated: stats.allocated_bytes as f64,
            reserved: stats.reserved_bytes as f64,
            peak: stats.peak_allocated_bytes as f64,
        });
        reset_peak_memory_stats(device)
    };
    synchronize(device)?;
    sample(&mut points, 0, "start")?;
    for i in 0..steps {
        step(&mut |phase| sample(&mut points, i, phase))?;
    }
    synchronize(device)?;
    Ok(points)
}

/// One AdamW step over `tensors` parameters of `params / tensors` elements with their gradients
/// given (see [`ModelOp::AdamW`]): one multi-tensor step over all of them
/// (`cartage::optim::adam_step_many`: one fused kernel per group of tensors where the backend has
/// it, else one fused update per tensor).
pub fn adamw(params: usize, tensors: usize, device: &Device, bench: &Bench) -> Result<Outcome> {
    let each = params / tensors.max(1);
    let make = |seed: u64| random(&[each], DType::F32, seed, device);
    let weights = (0..tensors as u64).map(|i| make(60 + i)).collect::<Result<Vec<_>>>()?;
    let grads = (0..tensors as u64)
        .map(|i| make(5060 + i))
        .collect::<Result<Vec<_>>>()?;
    let moments = weights
        .iter()
        .map(|w| Ok((w.zeros_like()?, w.zeros_like()?)))
        .collect::<Result<Vec<_>>>()?;
    let mut step = 0u64;
    let mut update = || -> Result<()> {
        step += 1;
        let rule = AdamUpdate {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
            step,
        };
        let slots: Vec<AdamSlot<'_>> = weights
            .iter()
            .zip(&grads)
            .zip(&moments)
            .map(|((param, grad), (exp_avg, exp_avg_sq))| AdamSlot {
                param,
                grad,
                exp_avg,
                exp_avg_sq,
            })
            .collect();
        adam_step_many(rule, &slots).map(drop)
    };
    update()?;
    Ok(bench.run_on(device, &mut update)?.into())
}

/// A host batch as a data loader would hand it over: features decoded from a cheap generator
/// and standardised per row, labels `i mod 10`.
fn host_batch(batch: usize, width: usize, step: u64) -> (Vec<f32>, Vec<i64>) {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ step;
    let mut features: Vec<f32> = (0..batch * width)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    for row in features.chunks_mut(width.max(1)) {
        let mean = row.iter().sum::<f32>() / row.len() as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / row.len() as f32;
        let inv = 1.0 / (var + 1e-5).sqrt();
        row.iter_mut().for_each(|v| *v = (*v - mean) * inv);
    }
    (features, (0..batch).map(|i| (i % 10) as i64).collect())
}

/// The phases of one pipelined step, in seconds.
#[derive(Clone, Copy, Default)]
struct Phases {
    load: f64,
    copy: f64,
    compute: f64,
    sync: f64,
}

/// Run `steps` pipelined steps of the model and return each phase's median: build the host
/// batch, copy it to the device (synchronised), run the step (synchronised), read the loss.
fn measure_phases(layers: usize, width: usize, batch: usize, steps: usize, device: &Device) -> Result<Phases> {
    let store = ParamStore::new(device);
    let model = classifier(&store, layers, width)?;
    let mut opt = AdamW::new(&store, 1e-3)?;
    let mut samples = Vec::with_capacity(steps);
    for step in 0..steps as u64 + 2 {
        let t0 = Instant::now();
        let (features, classes) = host_batch(batch, width, step);
        let t1 = Instant::now();
        let x = Tensor::from_slice(&features, &[batch, width], device)?;
        let y = Tensor::from_slice(&classes, &[batch], device)?;
        synchronize(device)?;
        let t2 = Instant::now();
        let loss = train_step(&model, &store, &mut opt, &x, &y, false)?;
        synchronize(device)?;
        let t3 = Instant::now();
        let value = loss.item::<f32>()?;
        let t4 = Instant::now();
        if !value.is_finite() {
            return Err(cartage::Error::invalid(
                "train_pipeline",
                format!("the loss is {value}"),
            ));
        }
        if step >= 2 {
            let s = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64();
            samples.push(Phases {
                load: s(t0, t1),
                copy: s(t1, t2),
                compute: s(t2, t3),
                sync: s(t3, t4),
            });
        }
    }
    let median = |f: fn(&Phases) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Ok(Phases {
        load: median(|p| p.load),
        copy: median(|p| p.copy),
        compute: median(|p| p.compute),
        sync: median(|p| p.sync),
    })
}

/// LESSONS R31 (see [`ModelOp::TrainPipeline`]). Counters, each a median over the timed steps in
/// seconds: `load_s` (building the host batch), `copy_s` (host→device, synchronised), `sync_s`
/// (reading the loss once the device is idle), `launch_s` and `kernels_s` (the step's compute
/// time split into the same step on 8-wide tensors, where kernels take next to nothing and what
/// remains is launching and bookkeeping, and the rest). The measurement is the whole step.
pub fn train_pipeline(layers: usize, width: usize, batch: usize, device: &Device, bench: &Bench) -> Result<Outcome> {
    let steps = 20;
    let real = measure_phases(layers, width, batch, steps, device)?;
    let tiny = measure_phases(layers, 8, 8, steps, device)?;
    let launch = tiny.compute.min(real.compute);
    let store = ParamStore::new(device);
    let model = classifier(&store, layers, width)?;
    let mut opt = AdamW::new(&store, 1e-3)?;
    let mut step = 0u64;
    let measurement = bench.run_on(device, || {
        step += 1;
        let (features, classes) = host_batch(batch, width, step);
        let x = Tensor::from_slice(&features, &[batch, width], device)?;
        let y = Tensor::from_slice(&classes, &[batch], device)?;
        let loss = train_step(&model, &store, &mut opt, &x, &y, false)?;
        loss.item::<f32>().map(drop)
    })?;
    Ok(Outcome {
        measurement,
        counters: BTreeMap::from([
            ("load_s".to_string(), real.load.max(0.0)),
            ("copy_s".to_string(), real.copy.max(0.0)),
            ("launch_s".to_string(), launch.max(0.0)),
            ("kernels_s".to_string(), (real.compute - launch).max(0.0)),
            ("sync_s".to_string(), real.sync.max(0.0)),
        ]),
        memory_curve: Vec::new(),
        implementation: None,
    })
}
