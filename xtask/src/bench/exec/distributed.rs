//! The distributed section's cases: one process drives every GPU, one thread per rank, over
//! NCCL (`cartage-cuda`'s `nccl` feature, loaded at run time). Rank 0 runs on the measuring
//! thread inside the bench closure; each call there tells ranks 1.. to make the same call, so
//! every rank issues the same collectives, and rank 0's device timeline (which waits for the
//! others inside NCCL) is what the harness times.

use std::collections::BTreeMap;

use cartage::bench::Bench;

use super::{Failure, Outcome};
use crate::bench::cases::{DistOp, busbw_gbps};

/// Run `op`: its ranks use `cuda:0..cuda:world`.
pub fn run(op: &DistOp, bench: &Bench) -> Result<Outcome, Failure> {
    let gpus = crate::bench::plan::cuda_gpus();
    if gpus < op.world() {
        return Err(Failure::Unsupported(format!(
            "needs {} CUDA GPUs; this machine has {gpus}",
            op.world()
        )));
    }
    let mut outcome = ranks::run(op, bench)?;
    let seconds = outcome.measurement.median().as_secs_f64();
    let counters: BTreeMap<String, f64> = match *op {
        DistOp::AllReduce { bytes, world } => [
            ("busbw_gbps".to_string(), busbw_gbps(bytes, world, seconds)),
            ("algbw_gbps".to_string(), bytes as f64 / seconds / 1e9),
        ]
        .into(),
        DistOp::DdpGpt { .. } => [("tokens_per_s".to_string(), op.size() as f64 / seconds)].into(),
    };
    outcome.counters.extend(counters);
    Ok(outcome)
}

#[cfg(not(feature = "cuda"))]
mod ranks {
    use super::*;

    pub fn run(_: &DistOp, _: &Bench) -> Result<Outcome, Failure> {
        Err(Failure::Unsupported(
            "xtask was built without the `cuda` feature (NCCL)".into(),
        ))
    }
}

#[cfg(feature = "cuda")]
mod ranks {
    use std::collections::VecDeque;
    use std::sync::mpsc;

    use cartage::distributed::{CollectiveHandle, ProcessGroup, ReduceKind};
    use cartage::tensor::nn::CrossEntropy;
    use cartage::{DType, Device, Result, Tensor};
    use cartage_cuda::nccl::NcclEngine;
    use cartage_nn::DataParallel;
    use cartage_nn::models::{Gpt, GptConfig};
    use cartage_nn::optim::{AdamW, Optimizer};
    use cartage_nn::{Module, ParamStore};

    use super::*;

    /// Collectives kept in flight before the oldest is waited for (waiting per call would
    /// serialise the host with the device).
    const IN_FLIGHT: usize = 32;

    pub fn run(op: &DistOp, bench: &Bench) -> Result<Outcome, Failure> {
        let groups = join(op.world())?;
        match *op {
            DistOp::AllReduce { bytes, .. } => {
                // Collectives run on their communicator's own stream, which the compute stream's
                // events do not follow: time them by the host clock, whose closing
                // synchronisation waits for them.
                let host = bench.clone().timing(cartage::bench::TimingMode::HostSynchronized);
                Ok(lockstep(groups, &host, |group| AllReduce::new(group, bytes))?)
            }
            DistOp::DdpGpt {
                layers,
                dim,
                heads,
                context,
                batch,
                vocab,
                ..
            } => {
                let config = GptConfig::new(vocab, context, dim, heads, layers);
                Ok(lockstep(groups, bench, |group| DdpStep::new(group, config, batch))?)
            }
        }
    }

    /// A group over `cuda:0..cuda:world`, one member per rank.
    fn join(world: usize) -> Result<Vec<ProcessGroup>> {
        let backends = (0..world)
            .map(|i| cartage::runtime::backend(&Device::cuda(i)))
            .collect::<Result<Vec<_>>>()?;
        // A rank that fails leaves the others waiting inside NCCL: give up after two minutes.
        let members = NcclEngine::new()
            .with_timeout(std::time::Duration::from_secs(120))
            .local_group(&backends)?;
        Ok(members.into_iter().map(ProcessGroup::new).collect())
    }

    /// What one rank repeats.
    trait Call: Sized {
        fn call(&mut self) -> Result<()>;
        fn finish(&mut self) -> Result<()>;
    }

    /// Build each rank's state on its own thread (ranks 1.. spawned first, as building may
    /// communicate), then time rank 0's calls on this thread; each of them first tells the other
    /// ranks to make one call.
    fn lockstep<S: Call>(
        groups: Vec<ProcessGroup>,
        bench: &Bench,
        setup: impl Fn(ProcessGroup) -> Result<S> + Sync,
    ) -> Result<Outcome> {
        let mut groups = groups.into_iter();
        let first = groups.next().expect("a group has a rank 0");
        let device = first.device();
        std::thread::scope(|scope| {
            let mut senders = Vec::new();
            let mut workers = Vec::new();
            for group in groups {
                let (tx, rx) = mpsc::channel::<()>();
                senders.push(tx);
                let setup = &setup;
                workers.push(scope.spawn(move || -> Result<()> {
                    let mut state = setup(group)?;
                    while rx.recv().is_ok() {
                        state.call()?;
                    }
                    state.finish()
                }));
            }
            let measured = setup(first).and_then(|mut state| {
                let m = bench.run_on(&device, || {
                    for tx in &senders {
                        // A rank that stopped reports its error when joined.
                        let _ = tx.send(());
                    }
                    state.call()
                });
                state.finish()?;
                m
            });
            drop(senders);
            for worker in workers {
                match worker.join() {
                    Ok(result) => result?,
                    Err(_) => return Err(cartage::Error::invalid("bench", "a rank's thread panicked")),
                }
            }
            Ok(measured?.into())
        })
    }

    /// An in-place all-reduce of `bytes` of f32.
    struct AllReduce {
        group: ProcessGroup,
        buffer: Tensor,
        in_flight: VecDeque<CollectiveHandle>,
    }

    impl AllReduce {
        fn new(group: ProcessGroup, bytes: usize) -> Result<AllReduce> {
            let buffer = Tensor::zeros(&[bytes / 4], DType::F32, &group.device())?; // sums stay finite
            Ok(AllReduce {
                group,
                buffer,
                in_flight: VecDeque::new(),
            })
        }
    }

    impl Call for AllReduce {
        fn call(&mut self) -> Result<()> {
            self.in_flight
                .push_back(self.group.all_reduce(&self.buffer, ReduceKind::Sum)?);
            while self.in_flight.len() > IN_FLIGHT {
                if let Some(h) = self.in_flight.pop_front() {
                    h.wait()?;
                }
            }
            Ok(())
        }

        fn finish(&mut self) -> Result<()> {
            self.in_flight.drain(..).try_for_each(CollectiveHandle::wait)
        }
    }

    /// One data-parallel GPT training step: forward, `DataParallel::backward` (buckets
    /// all-reduced during backward), AdamW, gradients freed.
    struct DdpStep {
        store: ParamStore,
        model: Gpt,
        ddp: DataParallel,
        opt: AdamW,
        x: Tensor,
        y: Tensor,
        rows: usize,
        vocab: usize,
    }

    impl DdpStep {
        fn new(group: ProcessGroup, config: GptConfig, batch: usize) -> Result<DdpStep> {
            let device = group.device();
            let rank = group.rank();
            let (context, vocab) = (config.context, config.vocab);
            let store = ParamStore::new(&device);
            let model = Gpt::new(&store.root(), config, &mut cartage::Generator::new(rank as u64))?;
            let ddp = DataParallel::new(&store, group)?;
            let opt = AdamW::new(&store, 1e-3)?;
            let ids = |offset: usize| -> Result<Tensor> {
                let v: Vec<i64> = (0..batch * context)
                    .map(|i| ((i * 7919 + offset + rank * 31) % vocab) as i64)
                    .collect();
                Tensor::from_vec(v, &[batch, context], &device)
            };
            let (x, y) = (ids(0)?, ids(1)?.reshape(&[batch * context])?);
            Ok(DdpStep {
                store,
                model,
                ddp,
                opt,
                x,
                y,
                rows: batch * context,
                vocab,
            })
        }
    }

    impl Call for DdpStep {
        fn call(&mut self) -> Result<()> {
            let logits = self.model.forward(&self.x)?.reshape(&[self.rows, self.vocab])?;
            let loss = logits.cross_entropy(&self.y, CrossEntropy::default())?;
            self.ddp.backward(&loss)?;
            self.opt.step(&self.store)?;
            self.store.zero_grad();
            Ok(())
        }

        fn finish(&mut self) -> Result<()> {
            Ok(())
        }
    }
}
