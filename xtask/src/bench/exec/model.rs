//! The ops section on cartage: each [`ModelOp`] set up at its shape on the device and measured
//! with the same call a model makes, forward alone ([`run`]) or with its backward
//! ([`run_backward`]: the inputs PyTorch computes gradients for are [`Var`]s, backward runs from
//! a fixed output gradient, the gradients are freed), each with the words for what ran
//! ([`crate::bench::implementation`]).

use std::collections::BTreeMap;

use cartage::bench::Bench;
use cartage::tensor::nn::{Conv2dOptions, CrossEntropy};
use cartage::{
    DType, Device, Result, Tensor, Var, device_capabilities, graph_memory, memory_stats, reset_peak_memory_stats,
    synchronize,
};

use super::{Outcome, random};
use crate::bench::cases::ModelOp;
use crate::bench::implementation::{self, Observed};

/// The call of an op on its inputs.
type Call = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

/// An op set up at its shape: the inputs PyTorch computes gradients for, and the call that
/// takes them (with what else it reads, targets and ids, captured).
struct Setup {
    inputs: Vec<Tensor>,
    call: Call,
}

impl Setup {
    fn new(op: &ModelOp, dtype: DType, device: &Device) -> Result<Setup> {
        let setup = |inputs: Vec<Tensor>, call: Call| Ok(Setup { inputs, call });
        match *op {
            ModelOp::LayerNorm { rows, cols } => setup(
                vec![
                    random(&[rows, cols], dtype, 10, device)?,
                    random(&[cols], dtype, 11, device)?,
                    random(&[cols], dtype, 12, device)?,
                ],
                Box::new(|t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)),
            ),
            ModelOp::RmsNorm { rows, cols } => setup(
                vec![
                    random(&[rows, cols], dtype, 10, device)?,
                    random(&[cols], dtype, 11, device)?,
                ],
                Box::new(|t| t[0].rms_norm(Some(&t[1]), 1e-6)),
            ),
            ModelOp::Softmax { rows, cols } => setup(
                vec![random(&[rows, cols], dtype, 10, device)?],
                Box::new(|t| t[0].softmax(-1)),
            ),
            ModelOp::LogSoftmax { rows, cols } => setup(
                vec![random(&[rows, cols], dtype, 10, device)?],
                Box::new(|t| t[0].log_softmax(-1)),
            ),
            ModelOp::CrossEntropy { rows, cols } => {
                // Spread over the classes without a random integer generator on every backend.
                let classes: Vec<i64> = (0..rows).map(|i| ((i * 7919) % cols) as i64).collect();
                let target = Tensor::from_vec(classes, &[rows], device)?;
                setup(
                    vec![random(&[rows, cols], dtype, 10, device)?],
                    Box::new(move |t| t[0].cross_entropy(&target, CrossEntropy::default())),
                )
            }
            ModelOp::Exp { rows, cols } => setup(
                vec![random(&[rows, cols], dtype, 10, device)?],
                Box::new(|t| t[0].exp()),
            ),
            ModelOp::Cat { parts, part_rows, cols } => setup(
                (0..parts)
                    .map(|i| random(&[part_rows, cols], dtype, 20 + i as u64, device))
                    .collect::<Result<Vec<_>>>()?,
                Box::new(|t| Tensor::cat(&t.iter().collect::<Vec<_>>(), 0)),
            ),
            ModelOp::Sort { numel } => setup(
                vec![random(&[numel], dtype, 10, device)?],
                Box::new(|t| Ok(t[0].sort(-1, false)?.0)),
            ),
            ModelOp::Cumsum { rows, cols } => setup(
                vec![random(&[rows, cols], dtype, 10, device)?],
                Box::new(|t| t[0].cumsum(-1)),
            ),
            ModelOp::Conv2d {
                batch,
                channels_in,
                channels_out,
                side,
                kernel,
                padding,
            } => {
                let opts = Conv2dOptions {
                    padding: [padding, padding],
                    ..Conv2dOptions::default()
                };
                setup(
                    vec![
                        random(&[batch, channels_in, side, side], dtype, 10, device)?,
                        random(&[channels_out, channels_in, kernel, kernel], dtype, 11, device)?,
                    ],
                    Box::new(move |t| t[0].conv2d(&t[1], None, opts)),
                )
            }
            ModelOp::MaxPool2d {
                batch,
                channels,
                side,
                kernel,
                stride,
                padding,
            } => setup(
                vec![random(&[batch, channels, side, side], dtype, 10, device)?],
                Box::new(move |t| t[0].max_pool2d([kernel, kernel], [stride, stride], [padding, padding])),
            ),
            ModelOp::Sdpa {
                batch,
                heads,
                seq,
                head_dim,
                causal,
                padded,
            } => {
                let shape = [batch, heads, seq, head_dim];
                let mask = if padded {
                    let keep: Vec<bool> = (0..batch * seq)
                        .map(|i| i % seq < crate::bench::cases::key_padding_len(i / seq, seq))
                        .collect();
                    Some(Tensor::from_slice(&keep, &[batch, 1, 1, seq], device)?)
                } else {
                    None
                };
                setup(
                    vec![
                        random(&shape, dtype, 10, device)?,
                        random(&shape, dtype, 11, device)?,
                        random(&shape, dtype, 12, device)?,
                    ],
                    Box::new(move |t| {
                        Tensor::scaled_dot_product_attention(&t[0], &t[1], &t[2], mask.as_ref(), causal, None)
                    }),
                )
            }
            ModelOp::Embedding { num, dim, batch, seq } => {
                let ids: Vec<i64> = (0..batch * seq).map(|i| ((i * 7919) % num) as i64).collect();
                let ids = Tensor::from_vec(ids, &[batch, seq], device)?;
                setup(
                    vec![random(&[num, dim], dtype, 10, device)?],
                    Box::new(move |t| t[0].embedding(&ids)),
                )
            }
            ModelOp::MlpStep { .. }
            | ModelOp::MlpTrain { .. }
            | ModelOp::AdamW { .. }
            | ModelOp::GptTrain { .. }
            | ModelOp::TrainPipeline { .. } => Err(cartage::Error::invalid(
                "bench",
                "internal: the training steps are measured by `mlp_step` and `mlp_train`",
            )),
        }
    }

    /// The inputs as variables, and their tracked tensors.
    fn variables(&self) -> Result<(Vec<Var>, Vec<Tensor>)> {
        let vars = self
            .inputs
            .iter()
            .map(|t| Var::new(t.clone()))
            .collect::<Result<Vec<_>>>()?;
        let tracked = vars.iter().map(Var::tensor).collect();
        Ok((vars, tracked))
    }
}

/// The backend family of `device` (`cpu`, `cuda`, `wgpu`).
fn backend(device: &Device) -> String {
    device.to_string().split(':').next().unwrap_or_default().to_string()
}

/// The words for what ran, from the device's capabilities and what a call showed.
fn implementation(op: &ModelOp, dtype: DType, device: &Device, backward: bool, seen: &Observed) -> Option<String> {
    let caps = device_capabilities(device).ok()?;
    Some(implementation::cartage(
        op,
        &backend(device),
        dtype,
        &caps,
        backward,
        seen,
    ))
}

/// The cuDNN algorithm each pass of a convolution row's shape ran on a CUDA device, as the
/// backend records them (`CudaBackend::conv_algorithms`): `(op, words)`; empty elsewhere.
fn conv_algorithms(op: &ModelOp, dtype: DType, device: &Device) -> Vec<(String, String)> {
    #[cfg(feature = "cuda")]
    if let ModelOp::Conv2d {
        batch,
        channels_in,
        channels_out,
        side,
        kernel,
        ..
    } = *op
        && let Ok(backend) = cartage::backend(device)
        && let Some(cuda) = backend.as_any().downcast_ref::<cartage_cuda::CudaBackend>()
    {
        let (input, weight) = (
            [batch, channels_in, side, side],
            [channels_out, channels_in, kernel, kernel],
        );
        let mut found: Vec<(String, String)> = Vec::new();
        for choice in cuda.conv_algorithms() {
            if choice.dtype != dtype || choice.input != input || choice.weight != weight {
                continue;
            }
            let algorithm = choice.algorithm.rsplit("_ALGO_").next().unwrap_or(&choice.algorithm);
            let math = choice
                .math
                .trim_start_matches("CUDNN_")
                .trim_end_matches("_MATH")
                .to_lowercase();
            let how = if choice.searched { "searched" } else { "heuristics" };
            let op = choice.pass.op().to_string();
            found.retain(|(o, _)| *o != op);
            found.push((op, format!("{algorithm} ({math} math, {how})")));
        }
        return found;
    }
    let _ = (op, dtype, device);
    Vec::new()
}

/// What ran each attention pass of an attention row's shape on a CUDA device, where the backend
/// considered cuDNN for it (`CudaBackend::attention_choices`): `(op, words)`; empty elsewhere.
fn attention_implementations(op: &ModelOp, dtype: DType, device: &Device) -> Vec<(String, String)> {
    #[cfg(feature = "cuda")]
    if let ModelOp::Sdpa {
        batch,
        heads,
        seq,
        head_dim,
        causal,
        padded,
    } = *op
        && let Ok(backend) = cartage::backend(device)
        && let Some(cuda) = backend.as_any().downcast_ref::<cartage_cuda::CudaBackend>()
    {
        let sizes = [batch * heads, seq, seq, head_dim, head_dim];
        let mut found: Vec<(String, String)> = Vec::new();
        for choice in cuda.attention_choices() {
            if choice.dtype != dtype || choice.sizes != sizes || choice.causal != causal || choice.masked != padded {
                continue;
            }
            let op = choice.pass.op().to_string();
            found.retain(|(o, _)| *o != op);
            found.push((op, choice.implementation));
        }
        return found;
    }
    let _ = (op, dtype, device);
    Vec::new()
}

/// Only attention's path depends on more than the capabilities: one call with the inputs as
/// variables shows which node its forward recorded.
fn observe_forward(op: &ModelOp, setup: &Setup) -> Result<Observed> {
    if !matches!(op, ModelOp::Sdpa { .. }) {
        return Ok(Observed::default());
    }
    let (_vars, tracked) = setup.variables()?;
    let out = (setup.call)(&tracked)?;
    Ok(Observed {
        forward_node: out.grad_fn().map(str::to_string),
        backward_rise: None,
        ..Observed::default()
    })
}

/// Measure `op` in `dtype` on `device`, forward only.
pub fn run(op: &ModelOp, dtype: DType, device: &Device, bench: &Bench) -> Result<Outcome> {
    let setup = Setup::new(op, dtype, device)?;
    let measurement = bench.run_on(device, || (setup.call)(&setup.inputs).map(drop))?;
    let seen = Observed {
        conv_algorithms: conv_algorithms(op, dtype, device),
        attention_implementations: attention_implementations(op, dtype, device),
        ..observe_forward(op, &setup)?
    };
    Ok(Outcome {
        implementation: implementation(op, dtype, device, false, &seen),
        ..Outcome::from(measurement)
    })
}

/// Measure `op` in `dtype` on `device` with its backward: each call runs the forward on the
/// variables, backward from a fixed random output gradient (from the loss itself where the
/// output is one value), and frees every variable's gradient. After timing, one more call is
/// watched for the words on what ran (attention's recorded node and its backward's memory).
pub fn run_backward(op: &ModelOp, dtype: DType, device: &Device, bench: &Bench) -> Result<Outcome> {
    let setup = Setup::new(op, dtype, device)?;
    let (vars, tracked) = setup.variables()?;
    let out = (setup.call)(&tracked)?;
    let grad = if out.numel() == 1 {
        None
    } else {
        Some(random(out.shape(), out.dtype(), 90, device)?)
    };
    let forward_node = out.grad_fn().map(str::to_string);
    drop(out);
    let step = || -> Result<()> {
        let out = (setup.call)(&tracked)?;
        drop(out.backward_with(grad.as_ref(), false)?);
        vars.iter().for_each(Var::zero_grad);
        Ok(())
    };
    let measurement = bench.run_on(device, step)?;

    let out = (setup.call)(&tracked)?;
    synchronize(device)?;
    let start = memory_stats(device)?.allocated_bytes;
    reset_peak_memory_stats(device)?;
    drop(out.backward_with(grad.as_ref(), false)?);
    synchronize(device)?;
    let peak = memory_stats(device)?.peak_allocated_bytes;
    vars.iter().for_each(Var::zero_grad);
    let seen = Observed {
        forward_node,
        backward_rise: Some(peak.saturating_sub(start)),
        conv_algorithms: conv_algorithms(op, dtype, device),
        attention_implementations: attention_implementations(op, dtype, device),
    };
    Ok(Outcome {
        implementation: implementation(op, dtype, device, true, &seen),
        ..Outcome::from(measurement)
    })
}

/// One training step of the MLP: forward, `mean(out²)`, backward, gradients freed. Counters:
/// the bytes the graph saved for backward (the activations) and the peak of allocated memory
/// during backward above its level when backward starts.
pub fn mlp_step(
    layers: usize,
    width: usize,
    batch: usize,
    dtype: DType,
    device: &Device,
    bench: &Bench,
) -> Result<Outcome> {
    let x = random(&[batch, width], dtype, 30, device)?;
    // Scaled so that activations keep their size through the layers (a unit-variance init).
    let scale = 1.0 / (width as f64).sqrt();
    let weights = (0..layers)
        .map(|i| Var::new(random(&[width, width], dtype, 40 + i as u64, device)?.mul_scalar(scale)?))
        .collect::<Result<Vec<_>>>()?;
    let forward = || -> Result<Tensor> {
        let mut h = x.clone();
        for (i, w) in weights.iter().enumerate() {
            h = h.matmul(&w.tensor())?;
            if i + 1 < weights.len() {
                h = h.relu()?;
            }
        }
        h.square()?.mean_all()
    };
    let measurement = bench.run_on(device, || {
        forward()?.backward()?;
        weights.iter().for_each(Var::zero_grad);
        Ok(())
    })?;

    let loss = forward()?;
    synchronize(device)?;
    let activations = graph_memory(device).saved_bytes;
    let start = memory_stats(device)?.allocated_bytes;
    reset_peak_memory_stats(device)?;
    loss.backward()?;
    synchronize(device)?;
    let peak = memory_stats(device)?.peak_allocated_bytes;
    weights.iter().for_each(Var::zero_grad);
    Ok(Outcome {
        measurement,
        counters: BTreeMap::from([
            ("activation_bytes".to_string(), activations as f64),
            ("backward_peak_bytes".to_string(), peak.saturating_sub(start) as f64),
        ]),
        memory_curve: Vec::new(),
        implementation: None,
    })
}
