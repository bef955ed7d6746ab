//! The memory lessons (docs/LESSONS.md) on real training steps: R19, parameters, gradients and Adam's
//! two moments measured against the estimator, exactly, with the activations reported; R21,
//! `empty_cache` every step against keeping the cache. One test function: the allocator's
//! counters are per device, and tests run on parallel threads.

use cartage::memory::{Optimizer as Estimated, TrainingEstimate};
use cartage::prelude::*;
use cartage::{empty_cache, graph_memory, memory_stats};
use cartage_nn::layers::{Activation, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{Module, ParamStore};

mod common;

fn requested(device: &Device) -> usize {
    memory_stats(device).unwrap().requested_bytes
}

/// The CPU and every GPU that opens.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices("memory_lessons"));
    devices
}

#[test]
fn memory_lessons_on_real_training_steps() -> Result<()> {
    for device in devices() {
        an_adamw_step_holds_what_the_estimator_says(&device)?;
        emptying_the_cache_every_step_only_adds_device_allocations(&device)?;
    }
    Ok(())
}

/// R19: parameters + gradients + two moments = 4× the parameters, exactly; activations apart.
fn an_adamw_step_holds_what_the_estimator_says(device: &Device) -> Result<()> {
    let x = Tensor::randn(&[32, 256], DType::F32, 1, device)?;
    let before = requested(device);
    let store = ParamStore::new(device);
    let mut rng = Generator::new(0);
    let model = Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 256, 512, false, &mut rng)?)
        .push(Activation::Relu)
        .push(Linear::new(&store.root().sub("2"), 512, 128, false, &mut rng)?);
    let shapes: Vec<Vec<usize>> = store.vars().iter().map(|v| v.shape().to_vec()).collect();
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let estimate = TrainingEstimate::for_shapes(&refs, DType::F32, Estimated::Adam)?;

    let with_params = requested(device);
    assert_eq!(
        (with_params - before) as u64,
        estimate.parameter_bytes(),
        "{device}: parameters"
    );

    let loss = model.forward(&x)?.square()?.mean_all()?;
    let activations = graph_memory(device).saved_bytes;
    assert!(activations > 0);
    loss.backward()?;
    drop(loss);
    let with_grads = requested(device);
    assert_eq!(
        (with_grads - with_params) as u64,
        estimate.gradient_bytes(),
        "{device}: gradients"
    );

    let mut opt = AdamW::new(&store, 1e-3)?;
    opt.step(&store)?;
    let with_state = requested(device);
    assert_eq!(
        (with_state - with_grads) as u64,
        estimate.optimizer_bytes(),
        "{device}: Adam's moments"
    );
    println!(
        "{device}: parameters {} B, gradients {} B, moments {} B (4× parameters in all), activations saved for backward {activations} B",
        estimate.parameter_bytes(),
        estimate.gradient_bytes(),
        estimate.optimizer_bytes()
    );
    store.zero_grad();
    assert_eq!((requested(device) - with_params) as u64, estimate.optimizer_bytes());
    Ok(())
}

/// R21: a real training loop with `empty_cache` after every step gives every segment back and
/// takes it again the next step; keeping the cache takes its segments once.
fn emptying_the_cache_every_step_only_adds_device_allocations(device: &Device) -> Result<()> {
    let store = ParamStore::new(device);
    let mut rng = Generator::new(4);
    let model = Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 64, 256, true, &mut rng)?)
        .push(Activation::Gelu)
        .push(Linear::new(&store.root().sub("2"), 256, 8, true, &mut rng)?);
    let mut opt = AdamW::new(&store, 1e-3)?;
    let x = Tensor::randn(&[4096, 64], DType::F32, 9, device)?; // 4 MiB activations: segments of their own
    let mut run = |steps: usize, empty: bool| -> Result<u64> {
        let start = memory_stats(device)?.segment_allocs;
        for _ in 0..steps {
            model.forward(&x)?.square()?.mean_all()?.backward()?;
            opt.step(&store)?;
            store.zero_grad();
            if empty {
                empty_cache(device)?;
            }
        }
        Ok(memory_stats(device)?.segment_allocs - start)
    };
    run(2, false)?; // warm: the cache holds what a step needs
    let kept = run(10, false)?;
    let emptied = run(10, true)?;
    assert_eq!(kept, 0, "{device}: a warm cache serves every step without new segments");
    // The first of the ten steps still runs on the warm cache; each later one follows an
    // `empty_cache` and must take its segments again.
    assert!(
        emptied >= 9,
        "{device}: emptying every step takes segments again every step ({emptied})"
    );
    println!("{device}: segments taken over 10 steps: {kept} keeping the cache, {emptied} emptying it");
    Ok(())
}
