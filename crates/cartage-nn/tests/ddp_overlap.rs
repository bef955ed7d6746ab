//! Buckets overlapped with backward: `DataParallel::backward` queues a bucket's all-reduce from
//! autograd's gradient-ready hooks, before backward has produced the model's last gradient, and
//! the gradients it leaves are those of averaging after backward.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cartage::distributed::{Collective, CollectiveCall, CollectiveHandle, InProcessCollective, ProcessGroup};
use cartage::prelude::*;
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::{DataParallel, Module, ParamStore};

type Log = Arc<Mutex<Vec<String>>>;

/// An in-process member that writes every collective it is asked to run into `log`.
struct Recording {
    inner: InProcessCollective,
    log: Log,
}

impl Collective for Recording {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
    fn run(&self, call: &CollectiveCall<'_>) -> Result<CollectiveHandle> {
        self.log.lock().unwrap().push(format!("issue {}", call.name()));
        self.inner.run(call)
    }
}

/// Three layers, so that the first buckets are complete long before backward reaches the input
/// layer.
fn model(store: &ParamStore, seed: u64) -> Result<Sequential> {
    let mut rng = Generator::new(seed);
    Ok(Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 5, 8, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&store.root().sub("2"), 8, 8, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&store.root().sub("4"), 8, 3, true, &mut rng)?))
}

fn loss(net: &Sequential, rank: usize) -> Result<Tensor> {
    let x = Tensor::randn(&[6, 5], DType::F32, 10 + rank as u64, &Device::cpu())?;
    net.forward(&x)?.square()?.mean_all()
}

fn grads(store: &ParamStore) -> Result<Vec<Vec<f32>>> {
    store.vars().iter().map(|v| v.grad().unwrap().to_vec::<f32>()).collect()
}

/// What one rank saw: its event log from one synced backward, its buckets, and the gradients of
/// the overlapped path and of the after-backward path.
struct Seen {
    log: Vec<String>,
    buckets: Vec<Vec<String>>,
    overlapped: Vec<Vec<f32>>,
    after: Vec<Vec<f32>>,
}

#[test]
fn a_bucket_is_all_reduced_before_backward_produces_the_last_gradient() {
    let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(60)).unwrap();
    let seen: Vec<Seen> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|inner| {
                scope.spawn(move || -> Result<Seen> {
                    let log: Log = Arc::default();
                    let rank = inner.rank();
                    let group = ProcessGroup::new(Arc::new(Recording {
                        inner,
                        log: Arc::clone(&log),
                    }));
                    let store = ParamStore::new(&Device::cpu());
                    let net = model(&store, rank as u64)?;
                    // Added before the wrapper's, so each runs before the wrapper's hook.
                    for (name, var) in store.named_vars() {
                        let log = Arc::clone(&log);
                        var.on_grad_ready(Arc::new(move |_: &Var, _: &Tensor| {
                            log.lock().unwrap().push(format!("grad {name}"));
                            Ok(())
                        }));
                    }
                    let ddp = DataParallel::new(&store, group)?.with_bucket_bytes(160)?;
                    log.lock().unwrap().clear();
                    ddp.backward(&loss(&net, rank)?)?;
                    log.lock().unwrap().push("backward returned".into());
                    let overlapped = grads(&store)?;
                    store.zero_grad();
                    loss(&net, rank)?.backward()?; // plain backward: no collective
                    ddp.sync_gradients()?;
                    let after = grads(&store)?;
                    let buckets = ddp.buckets().into_iter().map(|b| b.names).collect();
                    let log = log.lock().unwrap().clone();
                    Ok(Seen {
                        log,
                        buckets,
                        overlapped,
                        after,
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    for (rank, s) in seen.iter().enumerate() {
        assert!(s.buckets.len() >= 3, "the test needs several buckets: {:?}", s.buckets);
        let first_backward = &s.log[..s.log.iter().position(|e| e == "backward returned").unwrap()];
        let issued: Vec<usize> = positions(first_backward, |e| e == "issue all_reduce");
        let produced: Vec<usize> = positions(first_backward, |e| e.starts_with("grad "));
        assert_eq!(produced.len(), 6, "rank {rank}: {first_backward:?}");
        assert_eq!(
            issued.len(),
            s.buckets.len(),
            "rank {rank}: one all-reduce per bucket: {first_backward:?}"
        );
        assert!(
            issued[0] < *produced.last().unwrap(),
            "rank {rank}: no all-reduce was issued before the last gradient: {first_backward:?}"
        );
        // Each bucket leaves as soon as it and the buckets before it are complete: only other
        // issues lie between that moment and its own.
        let mut complete = 0;
        for (b, names) in s.buckets.iter().enumerate() {
            for n in names {
                complete = complete.max(first_backward.iter().position(|e| *e == format!("grad {n}")).unwrap());
            }
            assert!(
                issued[b] > complete,
                "rank {rank}, bucket {b} left before its gradients"
            );
            assert!(
                first_backward[complete + 1..issued[b]]
                    .iter()
                    .all(|e| e.starts_with("issue")),
                "rank {rank}, bucket {b} {names:?} waited for later gradients: {first_backward:?}"
            );
        }
        assert_eq!(s.overlapped, s.after, "rank {rank}: overlapping changed the gradients");
        assert_eq!(
            s.overlapped, seen[0].overlapped,
            "rank {rank}: the ranks' gradients differ"
        );
    }
}

fn positions(events: &[String], pick: impl Fn(&str) -> bool) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| pick(e))
        .map(|(i, _)| i)
        .collect()
}

/// A plain backward and one under `no_sync` issue no collective; dropping the wrapper removes
/// its hooks.
#[test]
fn unsynced_backward_and_a_dropped_wrapper_issue_nothing() {
    let log: Log = Arc::default();
    let inner = InProcessCollective::group(&Device::cpu(), 1, Duration::from_secs(10))
        .unwrap()
        .pop()
        .unwrap();
    let group = ProcessGroup::new(Arc::new(Recording {
        inner,
        log: Arc::clone(&log),
    }));
    let store = ParamStore::new(&Device::cpu());
    let net = model(&store, 0).unwrap();
    let ddp = DataParallel::new(&store, group).unwrap();
    log.lock().unwrap().clear();
    loss(&net, 0).unwrap().backward().unwrap();
    {
        let _local = ddp.no_sync();
        ddp.backward(&loss(&net, 0).unwrap()).unwrap();
    }
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
    ddp.backward(&loss(&net, 0).unwrap()).unwrap();
    assert_eq!(log.lock().unwrap().len(), 1, "one bucket: {:?}", log.lock().unwrap());
    drop(ddp);
    log.lock().unwrap().clear();
    loss(&net, 0).unwrap().backward().unwrap();
    assert!(log.lock().unwrap().is_empty());
}
