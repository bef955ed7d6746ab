//! The optimizers step all parameters of one device and dtype in one multi-tensor kernel, and
//! each parameter ends exactly where a step of its own would put it.

use cartage::optim::{AdamSlot, SgdSlot, StepReport, adam_step_many, sgd_step_many};
use cartage::prelude::*;
use cartage::{AdamUpdate, ErrorKind, SgdUpdate};
use cartage_nn::ParamStore;
use cartage_nn::optim::{Adam, AdamW, Optimizer, Sgd};

/// Parameter shapes of several sizes, one element and an empty one included.
const SHAPES: [&[usize]; 6] = [&[7, 3], &[1], &[1000], &[0], &[33], &[4, 4, 5]];

/// A store holding one parameter per shape, each with a gradient (`loss = Σ sin(p)·c`).
fn store_with_grads(cpu: &Device) -> Result<ParamStore> {
    let store = ParamStore::new(cpu);
    for (i, shape) in SHAPES.iter().enumerate() {
        let value = Tensor::randn(shape, DType::F32, 100 + i as u64, cpu)?;
        store.root().var(&format!("p{i}"), value)?;
    }
    let mut loss = Tensor::zeros(&[], DType::F32, cpu)?;
    for (i, var) in store.vars().iter().enumerate() {
        let term = var.tensor().sin()?.mul_scalar(1.0 + i as f64)?.sum_all()?;
        loss = loss.add(&term)?;
    }
    loss.backward()?;
    Ok(store)
}

fn values(store: &ParamStore) -> Result<Vec<Vec<f32>>> {
    store.vars().iter().map(|v| v.value().to_vec::<f32>()).collect()
}

/// `steps` steps of `opt`, then each parameter's values and the optimizer's last report.
fn run_optimizer<O: Optimizer>(
    store: &ParamStore,
    opt: &mut O,
    steps: usize,
    report: impl Fn(&O) -> StepReport,
) -> Result<(Vec<Vec<f32>>, StepReport)> {
    for _ in 0..steps {
        opt.step(store)?;
    }
    Ok((values(store)?, report(opt)))
}

/// The same steps as single fused updates, one parameter at a time (`Tensor::adam_step_`).
fn single_adam(store: &ParamStore, steps: u64, rule: AdamUpdate) -> Result<Vec<Vec<f32>>> {
    let _plain = cartage::no_grad();
    let state: Vec<(Tensor, Tensor)> = store
        .vars()
        .iter()
        .map(|v| Ok((v.value().zeros_like()?, v.value().zeros_like()?)))
        .collect::<Result<_>>()?;
    for step in 1..=steps {
        for (var, (m, v)) in store.vars().iter().zip(&state) {
            let g = var.grad().expect("every parameter has a gradient");
            var.value().adam_step_(&g, m, v, AdamUpdate { step, ..rule })?;
        }
    }
    values(store)
}

#[test]
fn adamw_steps_every_parameter_in_one_kernel_as_single_updates_would() -> Result<()> {
    let cpu = Device::cpu();
    let rule = AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
        step: 1,
    };
    let store = store_with_grads(&cpu)?;
    let mut opt = AdamW::new(&store, rule.lr)?;
    let (many, report) = run_optimizer(&store, &mut opt, 3, AdamW::last_step)?;
    assert_eq!(
        report,
        StepReport {
            multi_tensor_kernels: 1,
            fused_updates: 0,
            composed_updates: 0
        },
        "one kernel for all {} parameters",
        SHAPES.len()
    );
    let alone = single_adam(&store_with_grads(&cpu)?, 3, rule)?;
    assert_eq!(many, alone, "bit for bit the values of single updates");
    // Adam (L2 decay) too.
    let store = store_with_grads(&cpu)?;
    let mut adam = Adam::new(&store, 1e-2)?.with((0.9, 0.999), 1e-8, 0.1)?;
    let (many, report) = run_optimizer(&store, &mut adam, 2, Adam::last_step)?;
    assert_eq!(report.multi_tensor_kernels, 1);
    let l2 = AdamUpdate {
        weight_decay: 0.1,
        decoupled: false,
        ..rule
    };
    assert_eq!(many, single_adam(&store_with_grads(&cpu)?, 2, l2)?);
    Ok(())
}

#[test]
fn sgd_with_nesterov_momentum_matches_single_updates_in_one_kernel_per_step() -> Result<()> {
    let cpu = Device::cpu();
    let store = store_with_grads(&cpu)?;
    let mut opt = Sgd::new(&store, 0.1)?;
    (opt.momentum, opt.nesterov, opt.weight_decay) = (0.9, true, 1e-3);
    let (many, report) = run_optimizer(&store, &mut opt, 3, Sgd::last_step)?;
    assert_eq!(report.multi_tensor_kernels, 1);
    assert_eq!(report.fused_updates + report.composed_updates, 0);
    // The same three steps, one parameter at a time.
    let single = store_with_grads(&cpu)?;
    let _plain = cartage::no_grad();
    let buffers: Vec<Tensor> = single
        .vars()
        .iter()
        .map(|v| v.value().zeros_like())
        .collect::<Result<_>>()?;
    for step in 0..3 {
        for (var, buf) in single.vars().iter().zip(&buffers) {
            let rule = SgdUpdate {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 1e-3,
                nesterov: true,
                first_step: step == 0,
            };
            var.value()
                .sgd_step_(&var.grad().expect("a gradient"), Some(buf), rule)?;
        }
    }
    assert_eq!(many, values(&single)?);
    Ok(())
}

#[test]
fn bad_slots_are_typed_errors_and_write_nothing() -> Result<()> {
    let cpu = Device::cpu();
    let rule = AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step: 1,
    };
    let p = Tensor::new([1.0f32, 2.0, 3.0], &cpu)?;
    let g = Tensor::new([0.5f32, 0.5, 0.5], &cpu)?;
    let (m1, v1, m2, v2) = (p.zeros_like()?, p.zeros_like()?, p.zeros_like()?, p.zeros_like()?);
    // One parameter listed twice.
    let twice = [
        AdamSlot {
            param: &p,
            grad: &g,
            exp_avg: &m1,
            exp_avg_sq: &v1,
        },
        AdamSlot {
            param: &p,
            grad: &g,
            exp_avg: &m2,
            exp_avg_sq: &v2,
        },
    ];
    let err = adam_step_many(rule, &twice).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("listed twice"), "{err}");
    assert_eq!(p.to_vec::<f32>()?, vec![1.0, 2.0, 3.0], "nothing written");
    // Mixed dtypes in one call.
    let q = Tensor::new([1.0f64, 2.0, 3.0], &cpu)?;
    let (gq, mq, vq) = (q.zeros_like()?, q.zeros_like()?, q.zeros_like()?);
    let mixed = [
        twice[0],
        AdamSlot {
            param: &q,
            grad: &gq,
            exp_avg: &mq,
            exp_avg_sq: &vq,
        },
    ];
    let err = adam_step_many(rule, &mixed).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::DTypeMismatch | ErrorKind::InvalidArgument),
        "{err}"
    );
    // A momentum rule without its buffer.
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: true,
    };
    let slot = SgdSlot {
        param: &p,
        grad: &g,
        momentum_buffer: None,
    };
    assert!(sgd_step_many(sgd, &[slot]).is_err());
    assert_eq!(p.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
    // No slot: nothing to do.
    assert_eq!(adam_step_many(rule, &[])?, StepReport::default());
    Ok(())
}
