//! Data-parallel training on the CPU, with ranks as threads over the in-process test engine: N
//! ranks, each training on its shard, end with identical parameters equal (within f32 tolerance)
//! to one process training on the whole batch — with several buckets or one, with SGD and AdamW,
//! and with gradient accumulation under `no_sync`.

use std::sync::Arc;
use std::time::Duration;

use cartage::distributed::{InProcessCollective, ProcessGroup};
use cartage::prelude::*;
use cartage::{Error, ErrorKind};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer, Sgd};
use cartage_nn::{DataParallel, DistributedSampler, Module, ParamStore};

const BATCH: usize = 12;
const STEPS: usize = 4;

/// The model every rank builds: 5 → 8 → 3, initialised from `seed`.
fn model(store: &ParamStore, seed: u64) -> Result<Sequential> {
    let mut rng = Generator::new(seed);
    Ok(Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 5, 8, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&store.root().sub("2"), 8, 3, true, &mut rng)?))
}

/// Step `step`'s inputs `[BATCH, 5]` and targets `[BATCH, 3]`, rows `rows`.
fn batch(step: usize, rows: std::ops::Range<usize>) -> Result<(Tensor, Tensor)> {
    let cpu = Device::cpu();
    let x = Tensor::randn(&[BATCH, 5], DType::F32, 100 + step as u64, &cpu)?;
    let y = Tensor::randn(&[BATCH, 3], DType::F32, 200 + step as u64, &cpu)?;
    let n = rows.len();
    Ok((x.narrow(0, rows.start, n)?, y.narrow(0, rows.start, n)?))
}

fn loss(net: &Sequential, x: &Tensor, y: &Tensor, scale: f64) -> Result<Tensor> {
    net.forward(x)?.sub(y)?.square()?.mean_all()?.mul_scalar(scale)
}

#[derive(Clone, Copy)]
enum Opt {
    Sgd,
    AdamW,
}

fn optimizer(kind: Opt, store: &ParamStore) -> Result<Box<dyn Optimizer>> {
    Ok(match kind {
        Opt::Sgd => {
            let mut sgd = Sgd::new(store, 0.1)?;
            sgd.momentum = 0.9;
            Box::new(sgd)
        }
        Opt::AdamW => Box::new(AdamW::new(store, 1e-2)?),
    })
}

fn params(store: &ParamStore) -> Result<Vec<Vec<f32>>> {
    store.vars().iter().map(|v| v.value().to_vec::<f32>()).collect()
}

/// One process, the whole batch, `micro` micro-batches accumulated per step.
fn single_process(kind: Opt, micro: usize) -> Result<Vec<Vec<f32>>> {
    let store = ParamStore::new(&Device::cpu());
    let net = model(&store, 0)?;
    let mut opt = optimizer(kind, &store)?;
    let per_micro = BATCH / micro;
    for step in 0..STEPS {
        for m in 0..micro {
            let (x, y) = batch(step, m * per_micro..(m + 1) * per_micro)?;
            loss(&net, &x, &y, 1.0 / micro as f64)?.backward()?;
        }
        opt.step(&store)?;
        store.zero_grad();
    }
    params(&store)
}

/// `world` ranks as threads, each on its shard of every micro-batch; rank r starts from seed r
/// (the broadcast from rank 0 must fix that). Returns every rank's final parameters.
fn data_parallel(kind: Opt, world: usize, micro: usize, bucket_bytes: usize) -> Vec<Vec<Vec<f32>>> {
    let members = InProcessCollective::group(&Device::cpu(), world, Duration::from_secs(60)).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                scope.spawn(move || -> Result<Vec<Vec<f32>>> {
                    let group = ProcessGroup::new(Arc::new(member));
                    let rank = group.rank();
                    let store = ParamStore::new(&Device::cpu());
                    let net = model(&store, rank as u64)?;
                    let ddp = DataParallel::new(&store, group)?.with_bucket_bytes(bucket_bytes)?;
                    let mut opt = optimizer(kind, &store)?;
                    let per_micro = BATCH / micro;
                    let shard = per_micro / world;
                    for step in 0..STEPS {
                        for m in 0..micro {
                            let start = m * per_micro + rank * shard;
                            let (x, y) = batch(step, start..start + shard)?;
                            let l = loss(&net, &x, &y, 1.0 / micro as f64)?;
                            if m + 1 < micro {
                                let _local = ddp.no_sync();
                                ddp.backward(&l)?;
                            } else {
                                ddp.backward(&l)?;
                            }
                        }
                        opt.step(&store)?;
                        store.zero_grad();
                    }
                    params(&store)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}: {g} vs {w}");
    }
    assert_eq!(got.iter().flatten().count(), want.iter().flatten().count());
}

#[test]
fn ranks_take_the_steps_of_one_process_on_the_whole_batch() {
    for (kind, name) in [(Opt::Sgd, "sgd"), (Opt::AdamW, "adamw")] {
        let reference = single_process(kind, 1).unwrap();
        for world in [2, 3, 4] {
            // 64 bytes: several buckets; the default: one.
            for bucket_bytes in [64, DataParallel::DEFAULT_BUCKET_BYTES] {
                let ranks = data_parallel(kind, world, 1, bucket_bytes);
                for (rank, p) in ranks.iter().enumerate() {
                    assert_eq!(p, &ranks[0], "{name}: rank {rank} of {world} drifted from rank 0");
                }
                assert_close(
                    &ranks[0],
                    &reference,
                    &format!("{name} on {world} ranks, {bucket_bytes}-byte buckets"),
                );
            }
        }
    }
}

#[test]
fn accumulation_under_no_sync_matches_the_whole_batch() {
    let reference = single_process(Opt::Sgd, 2).unwrap();
    let ranks = data_parallel(Opt::Sgd, 2, 2, 256);
    assert_eq!(ranks[0], ranks[1]);
    assert_close(&ranks[0], &reference, "2 micro-steps on 2 ranks");
}

/// Under `no_sync` gradients stay local (they differ between ranks); the next synced backward
/// averages the accumulated sums.
#[test]
fn no_sync_keeps_gradients_local_until_the_next_synced_backward() {
    let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(60)).unwrap();
    let grads: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                scope.spawn(move || -> Result<_> {
                    let group = ProcessGroup::new(Arc::new(member));
                    let rank = group.rank();
                    let store = ParamStore::new(&Device::cpu());
                    let net = model(&store, 0)?;
                    let ddp = DataParallel::new(&store, group)?;
                    let weight = store.get("2.weight").unwrap();
                    let (x, y) = batch(0, rank * 6..rank * 6 + 6)?;
                    {
                        let _local = ddp.no_sync();
                        ddp.backward(&loss(&net, &x, &y, 1.0)?)?;
                    }
                    let local = weight.grad().unwrap().to_vec::<f32>()?;
                    let (x2, y2) = batch(1, rank * 6..rank * 6 + 6)?;
                    loss(&net, &x2, &y2, 1.0)?.backward()?; // accumulate, no sync: plain backward
                    let summed = weight.grad().unwrap().to_vec::<f32>()?;
                    ddp.sync_gradients()?;
                    Ok((local, summed, weight.grad().unwrap().to_vec::<f32>()?))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert_ne!(grads[0].0, grads[1].0, "no_sync still averaged");
    assert_eq!(grads[0].2, grads[1].2, "the synced gradients differ");
    for (i, avg) in grads[0].2.iter().enumerate() {
        let want = (grads[0].1[i] + grads[1].1[i]) / 2.0;
        assert!((avg - want).abs() <= 1e-6 * want.abs().max(1.0), "{avg} vs {want}");
    }
}

#[test]
fn buckets_follow_the_size_and_reverse_order() {
    let members = InProcessCollective::group(&Device::cpu(), 1, Duration::from_secs(10)).unwrap();
    let group = ProcessGroup::new(Arc::new(members.into_iter().next().unwrap()));
    let store = ParamStore::new(&Device::cpu());
    model(&store, 0).unwrap();
    let ddp = DataParallel::new(&store, group.clone()).unwrap();
    let one = ddp.buckets();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].names, vec!["2.bias", "2.weight", "0.bias", "0.weight"]);
    assert_eq!(one[0].bytes, (3 + 24 + 8 + 40) * 4);
    let ddp = ddp.with_bucket_bytes(128).unwrap();
    let names: Vec<Vec<String>> = ddp.buckets().into_iter().map(|b| b.names).collect();
    assert_eq!(
        names,
        vec![vec!["2.bias", "2.weight"], vec!["0.bias"], vec!["0.weight"]]
    );
    assert_eq!(ddp.with_bucket_bytes(0).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

/// Ranks that built different models are told so at construction, not after a corrupt step.
#[test]
fn ranks_with_different_models_are_refused() {
    let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(60)).unwrap();
    let errors: Vec<Error> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                scope.spawn(move || {
                    let group = ProcessGroup::new(Arc::new(member));
                    let store = ParamStore::new(&Device::cpu());
                    let width = 4 + group.rank();
                    let mut rng = Generator::new(0);
                    Linear::new(&store.root().sub("fc"), width, 2, true, &mut rng).unwrap();
                    DataParallel::new(&store, group).unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for err in errors {
        assert!(err.to_string().contains("build the same model on every rank"), "{err}");
    }
}

#[test]
fn losses_and_metrics_average_across_ranks() {
    let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(60)).unwrap();
    let means: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|member| {
                scope.spawn(move || -> Result<Vec<f64>> {
                    let group = ProcessGroup::new(Arc::new(member));
                    let rank = group.rank() as f64;
                    let ddp = DataParallel::new(&ParamStore::new(&Device::cpu()), group)?;
                    let loss = Tensor::full(&[], 1.0 + rank, DType::F32, &Device::cpu())?;
                    let hits = Tensor::full(&[1], 10.0 * rank, DType::I64, &Device::cpu())?;
                    ddp.mean_across_ranks(&[&loss, &hits])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert_eq!(means[0], vec![1.5, 5.0]);
    assert_eq!(means[0], means[1]);
}

#[test]
fn the_sampler_splits_each_epoch_among_the_ranks() {
    for (len, world) in [(10, 4), (12, 3), (7, 2)] {
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(len, r, world).indices(3))
            .collect();
        let per = len.div_ceil(world);
        assert!(shards.iter().all(|s| s.len() == per));
        let mut seen: Vec<usize> = shards.iter().flatten().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..len).collect::<Vec<_>>(), "every item read in the epoch");
        let next: Vec<usize> = DistributedSampler::new(len, 0, world).indices(4);
        assert_ne!(next, shards[0], "a new epoch reshuffles");
    }
    let mut exact = DistributedSampler::new(10, 1, 4);
    exact.drop_last = true;
    exact.shuffle = false;
    assert_eq!(exact.indices(0), vec![1, 5]);
    assert!(DistributedSampler::new(10, 4, 4).indices(0).is_empty());
}
