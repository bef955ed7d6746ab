//! The ops section on cartage: each [`ModelOp`] set up at its shape on the device and measured
//! with the same call a model makes.

use std::collections::BTreeMap;

use cartage::bench::{Bench, Measurement};
use cartage::tensor::nn::{Conv2d, CrossEntropy};
use cartage::{DType, Device, Result, Tensor, Var, graph_memory, memory_stats, reset_peak_memory_stats, synchronize};

use super::{Outcome, random};
use crate::bench::cases::ModelOp;

/// Measure `op` in `dtype` on `device`.
pub fn run(op: &ModelOp, dtype: DType, device: &Device, bench: &Bench) -> Result<Measurement> {
    match *op {
        ModelOp::LayerNorm { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            let w = random(&[cols], dtype, 11, device)?;
            let b = random(&[cols], dtype, 12, device)?;
            bench.run_on(device, || x.layer_norm(Some(&w), Some(&b), 1e-5).map(drop))
        }
        ModelOp::RmsNorm { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            let w = random(&[cols], dtype, 11, device)?;
            bench.run_on(device, || x.rms_norm(Some(&w), 1e-6).map(drop))
        }
        ModelOp::Softmax { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            bench.run_on(device, || x.softmax(-1).map(drop))
        }
        ModelOp::LogSoftmax { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            bench.run_on(device, || x.log_softmax(-1).map(drop))
        }
        ModelOp::CrossEntropy { rows, cols } => {
            let logits = random(&[rows, cols], dtype, 10, device)?;
            // Spread over the classes without a random integer generator on every backend.
            let classes: Vec<i64> = (0..rows).map(|i| ((i * 7919) % cols) as i64).collect();
            let target = Tensor::from_vec(classes, &[rows], device)?;
            bench.run_on(device, || {
                logits.cross_entropy(&target, CrossEntropy::default()).map(drop)
            })
        }
        ModelOp::Exp { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            bench.run_on(device, || x.exp().map(drop))
        }
        ModelOp::Cat { parts, part_rows, cols } => {
            let inputs = (0..parts)
                .map(|i| random(&[part_rows, cols], dtype, 20 + i as u64, device))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = inputs.iter().collect();
            bench.run_on(device, || Tensor::cat(&refs, 0).map(drop))
        }
        ModelOp::Sort { numel } => {
            let x = random(&[numel], dtype, 10, device)?;
            bench.run_on(device, || x.sort(-1, false).map(drop))
        }
        ModelOp::Cumsum { rows, cols } => {
            let x = random(&[rows, cols], dtype, 10, device)?;
            bench.run_on(device, || x.cumsum(-1).map(drop))
        }
        ModelOp::Conv2d {
            batch,
            channels_in,
            channels_out,
            side,
            kernel,
            padding,
        } => {
            let x = random(&[batch, channels_in, side, side], dtype, 10, device)?;
            let w = random(&[channels_out, channels_in, kernel, kernel], dtype, 11, device)?;
            let opts = Conv2d {
                padding: [padding, padding],
                ..Conv2d::default()
            };
            bench.run_on(device, || x.conv2d(&w, None, opts).map(drop))
        }
        ModelOp::MaxPool2d {
            batch,
            channels,
            side,
            kernel,
            stride,
            padding,
        } => {
            let x = random(&[batch, channels, side, side], dtype, 10, device)?;
            bench.run_on(device, || {
                x.max_pool2d([kernel, kernel], [stride, stride], [padding, padding])
                    .map(drop)
            })
        }
        ModelOp::Sdpa {
            batch,
            heads,
            seq,
            head_dim,
            causal,
        } => {
            let shape = [batch, heads, seq, head_dim];
            let q = random(&shape, dtype, 10, device)?;
            let k = random(&shape, dtype, 11, device)?;
            let v = random(&shape, dtype, 12, device)?;
            bench.run_on(device, || {
                Tensor::scaled_dot_product_attention(&q, &k, &v, None, causal, None).map(drop)
            })
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
    })
}
