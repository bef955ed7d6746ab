//! ZeRO stage 1 on the in-process engine: `ShardedOptimizer` over AdamW takes the steps of
//! plain data parallelism with AdamW (within f32 tolerance) on 2 and 3 ranks, while each rank
//! keeps about 1/N of the optimizer state the memory estimator counts for the model.

use std::sync::Arc;
use std::time::Duration;

use cartage::distributed::{InProcessCollective, ProcessGroup};
use cartage::memory::{Optimizer as Estimated, TrainingEstimate};
use cartage::prelude::*;
use cartage_nn::ddp::ShardedOptimizer;
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{DataParallel, Module, ParamStore};

const BATCH: usize = 12;
const STEPS: usize = 5;

/// 5 → 7 → 3: 42 + 24 = 66 parameters, which 4 ranks do not divide (padding is exercised).
fn model(store: &ParamStore, seed: u64) -> Result<Sequential> {
    let mut rng = Generator::new(seed);
    Ok(Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 5, 7, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&store.root().sub("2"), 7, 3, true, &mut rng)?))
}

fn shard_loss(net: &Sequential, step: usize, rank: usize, world: usize) -> Result<Tensor> {
    let cpu = Device::cpu();
    let x = Tensor::randn(&[BATCH, 5], DType::F32, 100 + step as u64, &cpu)?;
    let y = Tensor::randn(&[BATCH, 3], DType::F32, 200 + step as u64, &cpu)?;
    let n = BATCH / world;
    let (x, y) = (x.narrow(0, rank * n, n)?, y.narrow(0, rank * n, n)?);
    net.forward(&x)?.sub(&y)?.square()?.mean_all()
}

/// What one rank ends with.
struct Outcome {
    params: Vec<Vec<f32>>,
    state_bytes: usize,
}

/// `world` ranks train STEPS steps with AdamW, sharded or plain DDP.
fn train(world: usize, sharded: bool) -> Vec<Outcome> {
    let members = InProcessCollective::group(&Device::cpu(), world, Duration::from_secs(60)).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                scope.spawn(move || -> Result<Outcome> {
                    let group = ProcessGroup::new(Arc::new(member));
                    let rank = group.rank();
                    let store = ParamStore::new(&Device::cpu());
                    let net = model(&store, rank as u64)?; // the broadcast must fix the seeds
                    let make = |s: &ParamStore| AdamW::new(s, 1e-2)?.with((0.9, 0.99), 1e-8, 0.05);
                    let state_bytes;
                    if sharded {
                        let mut opt = ShardedOptimizer::new(&store, group, make)?;
                        for step in 0..STEPS {
                            shard_loss(&net, step, rank, world)?.backward()?;
                            opt.step(&store)?;
                            store.zero_grad();
                        }
                        state_bytes = opt.local_state_bytes()?;
                        assert_eq!(
                            state_bytes,
                            opt.state(&store)?
                                .tensors
                                .iter()
                                .map(|(_, t)| t.numel() * 4)
                                .sum::<usize>()
                        );
                    } else {
                        let ddp = DataParallel::new(&store, group)?;
                        let mut opt = make(&store)?;
                        for step in 0..STEPS {
                            ddp.backward(&shard_loss(&net, step, rank, world)?)?;
                            opt.step(&store)?;
                            store.zero_grad();
                        }
                        let state = opt.state(&store)?;
                        state_bytes = state.tensors.iter().map(|(_, t)| t.numel() * 4).sum();
                    }
                    let params = store
                        .vars()
                        .iter()
                        .map(|v| v.value().to_vec::<f32>())
                        .collect::<Result<_>>()?;
                    Ok(Outcome { params, state_bytes })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

#[test]
fn sharded_adamw_takes_the_steps_of_plain_data_parallel() {
    for world in [2, 3] {
        let plain = train(world, false);
        let sharded = train(world, true);
        for (rank, outcome) in sharded.iter().enumerate() {
            assert_eq!(
                outcome.params, sharded[0].params,
                "rank {rank} of {world} drifted from rank 0"
            );
            let flat = |p: &[Vec<f32>]| p.iter().flatten().copied().collect::<Vec<f32>>();
            let (got, want) = (flat(&outcome.params), flat(&plain[rank].params));
            assert_eq!(got.len(), 66);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{world} ranks: {g} vs {w}");
            }
        }
        // The parameters moved: the comparison is not between two untouched models.
        let start = {
            let store = ParamStore::new(&Device::cpu());
            model(&store, 0).unwrap();
            store.vars()[0].value().to_vec::<f32>().unwrap()
        };
        assert_ne!(sharded[0].params[0], start);
    }
}

#[test]
fn each_rank_keeps_a_world_sizeth_of_the_optimizer_state() {
    let estimate = TrainingEstimate::new(66, DType::F32, Estimated::Adam).optimizer_bytes() as usize;
    assert_eq!(estimate, 66 * 2 * 4);
    for world in [2, 3, 4] {
        let plain = train(world, false);
        let sharded = train(world, true);
        for rank in 0..world {
            assert_eq!(
                plain[rank].state_bytes, estimate,
                "plain AdamW holds what the estimator counts"
            );
            let local = sharded[rank].state_bytes;
            // ceil(66 / world) elements, two moments of 4 bytes each.
            assert_eq!(local, 66usize.div_ceil(world) * 8, "{world} ranks");
            assert!(
                local * world >= estimate && local * world < estimate + world * 8,
                "{world} ranks: {local}"
            );
        }
    }
}

/// A store other than the one it was built on is refused with a typed error.
#[test]
fn another_store_is_refused() {
    let member = InProcessCollective::group(&Device::cpu(), 1, Duration::from_secs(10))
        .unwrap()
        .pop()
        .unwrap();
    let store = ParamStore::new(&Device::cpu());
    model(&store, 0).unwrap();
    let mut opt = ShardedOptimizer::new(&store, ProcessGroup::new(Arc::new(member)), |s| AdamW::new(s, 1e-3)).unwrap();
    let other = ParamStore::new(&Device::cpu());
    let err = opt.step(&other).unwrap_err();
    assert_eq!(err.kind(), cartage::ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("another ParamStore"), "{err}");
}
