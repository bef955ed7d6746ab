//! Data parallelism on one GPU through the whole path (feature `nccl`): `DataParallel` over an
//! NCCL group of one on cuda:0 — its buckets flattened, all-reduced on the communicator's own
//! stream while backward keeps queuing kernels on the compute stream, installed as gradient
//! views and read by the optimizer — takes the same AdamW steps as plain training of the same
//! model on the same device.
//!
//! Without a CUDA device or without NCCL the test prints a SKIP line, and fails instead under
//! `CARTAGE_REQUIRE=cuda`.
#![cfg(feature = "nccl")]

use cartage::distributed::ProcessGroup;
use cartage::prelude::*;
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{DataParallel, Module, ParamStore};

const STEPS: usize = 5;
const WIDTH: usize = 256;

fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE").is_ok_and(|v| v.split(',').any(|k| k.trim() == "cuda"))
}

/// An NCCL group of one on `device`, or `None` after a loud skip.
fn group_of_one(device: &Device) -> Option<ProcessGroup> {
    let test = "ddp_cuda/data_parallel_of_one_gpu_takes_the_plain_steps";
    let skip = |reason: &str| cartage_core::testsuite::skip::device_missing(test, &device.to_string(), reason);
    let backend = match cartage::runtime::backend(device) {
        Ok(b) => b,
        Err(e) => {
            assert!(
                !required(),
                "CARTAGE_REQUIRE names cuda but {device} does not open: {e}"
            );
            skip(&e.to_string());
            return None;
        }
    };
    let engine = backend
        .collective_engine()
        .expect("the nccl feature gives CUDA an engine");
    if let Err(e) = engine.check(&backend) {
        assert!(!required(), "CARTAGE_REQUIRE names cuda but NCCL does not load: {e}");
        skip(&e.to_string());
        return None;
    }
    let id = engine.unique_id(&backend).unwrap();
    Some(ProcessGroup::new(engine.join(&backend, &id, 0, 1).unwrap()))
}

/// Four layers, so that several buckets leave while backward still runs.
fn model(store: &ParamStore) -> Result<Sequential> {
    let mut rng = Generator::new(7);
    let root = store.root();
    Ok(Sequential::new()
        .push(Linear::new(&root.sub("0"), 64, WIDTH, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&root.sub("2"), WIDTH, WIDTH, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&root.sub("4"), WIDTH, WIDTH, true, &mut rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&root.sub("6"), WIDTH, 10, true, &mut rng)?))
}

fn batch(step: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let x = Tensor::randn(&[32, 64], DType::F32, 100 + step as u64, device)?;
    let y = Tensor::randn(&[32, 10], DType::F32, 200 + step as u64, device)?;
    Ok((x, y))
}

/// Train `STEPS` AdamW steps, through `ddp` when given; the final parameters.
fn train(store: &ParamStore, net: &Sequential, ddp: Option<&DataParallel>, device: &Device) -> Result<Vec<Vec<f32>>> {
    let mut opt = AdamW::new(store, 1e-2)?;
    for step in 0..STEPS {
        let (x, y) = batch(step, device)?;
        let loss = net.forward(&x)?.sub(&y)?.square()?.mean_all()?;
        match ddp {
            Some(ddp) => ddp.backward(&loss)?,
            None => drop(loss.backward()?),
        }
        opt.step(store)?;
        store.zero_grad();
    }
    store.vars().iter().map(|v| v.value().to_vec::<f32>()).collect()
}

#[test]
fn data_parallel_of_one_gpu_takes_the_plain_steps() {
    let device = Device::cuda(0);
    let Some(group) = group_of_one(&device) else {
        return;
    };
    let plain_store = ParamStore::new(&device);
    let plain_net = model(&plain_store).unwrap();
    let plain = train(&plain_store, &plain_net, None, &device).unwrap();

    let store = ParamStore::new(&device);
    let net = model(&store).unwrap();
    // One weight matrix per bucket at most: the first buckets are all-reduced while backward
    // still computes the earlier layers' gradients.
    let ddp = DataParallel::new(&store, group)
        .unwrap()
        .with_bucket_bytes(WIDTH * WIDTH * 4)
        .unwrap();
    assert!(ddp.buckets().len() >= 4, "{} buckets", ddp.buckets().len());
    let parallel = train(&store, &net, Some(&ddp), &device).unwrap();

    for (name, (p, q)) in store
        .named_vars()
        .iter()
        .map(|(n, _)| n)
        .zip(plain.iter().zip(&parallel))
    {
        assert_eq!(p.len(), q.len());
        for (a, b) in p.iter().zip(q) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{name}: {a} against {b}");
        }
    }
    // Dropping the wrapper (and with it the communicator) leaves the device working.
    drop(ddp);
    cartage::runtime::backend(&device).unwrap().synchronize().unwrap();
}
