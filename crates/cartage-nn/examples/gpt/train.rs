//! The training loop: AdamW under a warm-up + cosine schedule, gradients clipped to norm 1 on
//! the device, optional autocast (f16 with a `GradScaler`), and a validation pass every
//! `--eval-every` steps that prints the losses, the throughput and the peak device memory.

use std::time::{Duration, Instant};

use cartage::loader::{HostBatch, PrefetchLoader};
use cartage::prelude::*;
use cartage::{CrossEntropy, autocast, format_bytes, memory_stats, synchronize};
use cartage_nn::optim::{AdamW, LrSchedule, Optimizer, WarmupCosine, clip_grad_norm};
use cartage_nn::{GradScaler, Module, ParamStore};

use crate::args::Args;
use crate::corpus::{Corpus, training_batches, validation_batches};
use crate::plot::LossPoint;
use cartage_nn::models::Gpt;

/// What a run measured.
pub struct Summary {
    pub points: Vec<LossPoint>,
    /// Training tokens per second over the whole run (validation passes not counted).
    pub tokens_per_second: f64,
    /// Seconds spent in training steps.
    pub train_seconds: f64,
}

/// The model, its parameters and how to run it.
pub struct Trainer<'a> {
    pub device: Device,
    pub store: &'a ParamStore,
    pub model: &'a Gpt,
    /// The autocast dtype, `None` for f32.
    pub half: Option<DType>,
}

impl Trainer<'_> {
    /// Train for `args.steps` steps on `corpus`, validating every `args.eval_every()` steps.
    pub fn run(&self, corpus: &Corpus, args: &Args) -> anyhow::Result<Summary> {
        let schedule = WarmupCosine {
            base: args.lr,
            min: args.lr / 10.0,
            warmup: (args.steps / 10).clamp(1, 100),
            total: args.steps,
        };
        let mut opt = AdamW::new(self.store, args.lr)?
            .betas((0.9, 0.99))?
            .eps(1e-8)?
            .weight_decay(0.1)?;
        let mut scaler = (self.half == Some(DType::F16)).then(GradScaler::new);
        let val = validation_batches(&corpus.val, args.batch, args.context, args.eval_batches)?;
        let batches = training_batches(corpus.train.clone(), args.batch, args.context, args.steps, args.seed)?;
        let tokens_per_step = (args.batch * args.context) as f64;

        let mut points = vec![LossPoint {
            step: 0,
            train: None,
            val: self.evaluate(&val)?,
        }];
        println!("step {:>5}/{}  val {:.4} (untrained)", 0, args.steps, points[0].val);
        let mut trained = Duration::ZERO;
        let mut interval = Interval::start(&self.device)?;
        for (i, batch) in PrefetchLoader::new(batches, &self.device)?.enumerate() {
            opt.set_learning_rate(schedule.lr(i));
            interval.add(&self.step(&batch?, &mut opt, scaler.as_mut())?)?;
            let step = i + 1;
            if step % args.eval_every() == 0 || step == args.steps {
                let (train, seconds) = interval.finish(&self.device)?;
                trained += seconds;
                let point = LossPoint {
                    step,
                    train: Some(train),
                    val: self.evaluate(&val)?,
                };
                let tokens_per_second = tokens_per_step * interval.steps as f64 / seconds.as_secs_f64();
                self.print(point, args.steps, schedule.lr(i), tokens_per_second)?;
                points.push(point);
                interval = Interval::start(&self.device)?;
            }
        }
        let train_seconds = trained.as_secs_f64();
        Ok(Summary {
            points,
            tokens_per_second: tokens_per_step * args.steps as f64 / train_seconds,
            train_seconds,
        })
    }

    /// One line per evaluation: losses, learning rate, throughput and peak device memory.
    fn print(&self, point: LossPoint, steps: usize, lr: f64, tokens_per_second: f64) -> Result<()> {
        let peak = memory_stats(&self.device)?.peak_allocated_bytes;
        println!(
            "step {:>5}/{steps}  train {:.4}  val {:.4}  lr {lr:.2e}  {tokens_per_second:>7.0} tokens/s  peak {}",
            point.step,
            point.train.unwrap_or(f64::NAN),
            point.val,
            format_bytes(peak as u64),
        );
        Ok(())
    }

    /// One optimizer step on a device batch; returns the loss, detached.
    fn step(&self, batch: &Tensor, opt: &mut AdamW, scaler: Option<&mut GradScaler>) -> Result<Tensor> {
        let loss = {
            let _ac = self.autocast()?;
            self.loss(batch)?
        };
        match scaler {
            Some(scaler) => {
                scaler.scale(&loss)?.backward()?;
                scaler.unscale(self.store)?; // clip the true gradients
                let _norm = clip_grad_norm(self.store, 1.0)?; // on the device, not read
                scaler.step(opt, self.store)?;
                scaler.update();
            }
            None => {
                loss.backward()?;
                let _norm = clip_grad_norm(self.store, 1.0)?; // on the device, not read
                opt.step(self.store)?;
            }
        }
        self.store.zero_grad();
        Ok(loss.detach())
    }

    /// The mean cross-entropy of a batch `[2, B, T]` (windows, then their next characters).
    fn loss(&self, batch: &Tensor) -> Result<Tensor> {
        let (inputs, targets) = (batch.select(0, 0)?, batch.select(0, 1)?.flatten()?);
        let logits = self.model.forward(&inputs)?;
        let vocab = logits.shape()[2];
        logits
            .reshape(&[targets.numel(), vocab])?
            .cross_entropy(&targets, CrossEntropy::default())
    }

    /// The mean loss over the validation batches, in eval mode and without recording.
    fn evaluate(&self, batches: &[HostBatch]) -> Result<f64> {
        self.store.eval();
        let result = (|| {
            let _plain = no_grad();
            let _ac = self.autocast()?;
            let mut total = Tensor::zeros(&[], DType::F32, &self.device)?;
            for batch in PrefetchLoader::new(batches.to_vec(), &self.device)? {
                total = total.add(&self.loss(&batch?)?)?;
            }
            Ok(f64::from(total.item::<f32>()?) / batches.len() as f64)
        })();
        self.store.train();
        result
    }

    /// The autocast scope, when the run uses one.
    fn autocast(&self) -> Result<Option<cartage::AutocastGuard>> {
        self.half.map(|dtype| autocast(&self.device, dtype)).transpose()
    }
}

/// The training losses (summed on the device) and the time since the last evaluation.
struct Interval {
    sum: Tensor,
    steps: usize,
    clock: Instant,
}

impl Interval {
    fn start(device: &Device) -> Result<Interval> {
        Ok(Interval {
            sum: Tensor::zeros(&[], DType::F32, device)?,
            steps: 0,
            clock: Instant::now(),
        })
    }

    fn add(&mut self, loss: &Tensor) -> Result<()> {
        self.sum = self.sum.add(loss)?;
        self.steps += 1;
        Ok(())
    }

    /// The mean training loss (one read from the device) and the time the steps took, the
    /// device's queue drained.
    fn finish(&self, device: &Device) -> Result<(f64, Duration)> {
        let mean = f64::from(self.sum.item::<f32>()?) / self.steps as f64;
        synchronize(device)?;
        Ok((mean, self.clock.elapsed()))
    }
}
