//! The parameter store, the layers and the optimizers: moves in place after the optimizer is
//! built (LESSONS R13), optimizer updates against their formulas, typed errors, and a small
//! model that learns.

use cartage::ErrorKind;
use cartage::prelude::*;
use cartage_nn::layers::{
    Activation, Conv2d, Dropout, Embedding, LayerNorm, Linear, MaxPool2d, MultiHeadAttention, RmsNorm, Sequential,
    TransformerBlock,
};
use cartage_nn::optim::{Adam, AdamW, Optimizer, Sgd};
use cartage_nn::{Module, ParamStore};

mod common;

/// A device other than the CPU when one opens (wgpu:0, else cuda:0).
fn other_device() -> Option<Device> {
    common::gpu_devices("cartage-nn training").into_iter().next()
}

fn mlp(store: &ParamStore, rng: &mut Generator) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 4, 16, true, rng)?)
        .push(Activation::Tanh)
        .push(Linear::new(&store.root().sub("2"), 16, 1, true, rng)?))
}

fn batch(device: &Device) -> Result<(Tensor, Tensor)> {
    let x = Tensor::randn(&[32, 4], DType::F32, 5, device)?;
    let y = x.sum(&[1], true)?.sin()?;
    Ok((x, y))
}

/// Train `steps` AdamW steps, moving the store to `move_to` after `move_after` steps (the
/// optimizer was built before), and return the final parameters on the CPU.
fn train(steps: usize, move_after: usize, move_to: &Device) -> Result<Vec<Vec<f32>>> {
    let cpu = Device::cpu();
    let mut store = ParamStore::new(&cpu);
    let mut rng = Generator::new(11);
    let model = mlp(&store, &mut rng)?;
    let mut opt = AdamW::new(&store, 1e-2)?;
    for step in 0..steps {
        if step == move_after {
            store.to(move_to)?;
        }
        let (x, y) = batch(&store.device())?;
        let loss = model.forward(&x)?.sub(&y)?.square()?.mean_all()?;
        loss.backward()?;
        opt.step(&store)?;
        store.zero_grad();
    }
    store
        .vars()
        .iter()
        .map(|v| v.value().to(&cpu)?.to_vec::<f32>())
        .collect()
}

#[test]
fn moving_the_model_after_building_the_optimizer_trains_the_moved_parameters() -> Result<()> {
    // The stale-handle bug (R13) cannot happen: the optimizer holds variables, not tensors, and
    // its state follows them. Moving half-way gives what never moving gives.
    let straight = train(10, usize::MAX, &Device::cpu())?;
    let target = other_device().unwrap_or(Device::cpu());
    let moved = train(10, 5, &target)?;
    for (a, b) in straight.iter().zip(&moved) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4, "moved to {target}: {x} vs {y}");
        }
    }
    // A dtype change in place is followed too.
    let store = ParamStore::new(&Device::cpu());
    let w = store.root().var("w", Tensor::ones(&[3], DType::F32, &Device::cpu())?)?;
    let mut opt = Adam::new(&store, 0.1)?;
    w.tensor().sum_all()?.backward()?;
    opt.step(&store)?;
    store.zero_grad();
    let mut store = store;
    store.to_dtype(DType::F64)?;
    w.tensor().sum_all()?.backward()?;
    opt.step(&store)?;
    assert_eq!(w.value().dtype(), DType::F64);
    Ok(())
}

#[test]
fn optimizers_follow_their_formulas() -> Result<()> {
    let cpu = Device::cpu();
    // Loss Σ c·w with a fixed gradient c, two steps each.
    let c = [1.0f64, -2.0, 0.5];
    let run = |make: &dyn Fn(&ParamStore) -> Box<dyn Optimizer>| -> Result<Vec<f64>> {
        let store = ParamStore::new(&cpu);
        let w = store
            .root()
            .var("w", Tensor::from_slice(&[0.5f64, 1.0, -1.0], &[3], &cpu)?)?;
        let mut opt = make(&store);
        for _ in 0..2 {
            w.tensor()
                .mul(&Tensor::from_slice(&c, &[3], &cpu)?)?
                .sum_all()?
                .backward()?;
            opt.step(&store)?;
            store.zero_grad();
        }
        w.value().to_vec::<f64>()
    };
    let close = |got: Vec<f64>, want: Vec<f64>| {
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-9, "{got:?} vs {want:?}");
        }
    };
    let p0 = [0.5f64, 1.0, -1.0];
    // SGD with momentum 0.9, weight decay 0.1, lr 0.1.
    let mut want = p0.to_vec();
    let mut buf = [0.0f64; 3];
    for step in 0..2 {
        for i in 0..3 {
            let g = c[i] + 0.1 * want[i];
            buf[i] = if step == 0 { g } else { 0.9 * buf[i] + g };
            want[i] -= 0.1 * buf[i];
        }
    }
    close(
        run(&|s| {
            let mut o = Sgd::new(s, 0.1).unwrap();
            o.momentum = 0.9;
            o.weight_decay = 0.1;
            Box::new(o)
        })?,
        want,
    );
    // Nesterov.
    let mut want = p0.to_vec();
    let mut buf = [0.0f64; 3];
    for step in 0..2 {
        for i in 0..3 {
            buf[i] = if step == 0 { c[i] } else { 0.9 * buf[i] + c[i] };
            want[i] -= 0.1 * (c[i] + 0.9 * buf[i]);
        }
    }
    close(
        run(&|s| {
            let mut o = Sgd::new(s, 0.1).unwrap();
            o.momentum = 0.9;
            o.nesterov = true;
            Box::new(o)
        })?,
        want,
    );
    // AdamW, lr 0.1, weight decay 0.01.
    let adam = |decoupled: bool, wd: f64| {
        let mut p = p0.to_vec();
        let (mut m, mut v) = ([0.0f64; 3], [0.0f64; 3]);
        for t in 1..=2 {
            for i in 0..3 {
                let mut g = c[i];
                if decoupled {
                    p[i] *= 1.0 - 0.1 * wd;
                } else {
                    g += wd * p[i];
                }
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                let (bc1, bc2) = (1.0 - 0.9f64.powi(t), 1.0 - 0.999f64.powi(t));
                p[i] -= 0.1 / bc1 * m[i] / ((v[i] / bc2).sqrt() + 1e-8);
            }
        }
        p
    };
    close(run(&|s| Box::new(AdamW::new(s, 0.1).unwrap()))?, adam(true, 0.01));
    close(
        run(&|s| Box::new(Adam::new(s, 0.1).unwrap().with((0.9, 0.999), 1e-8, 0.05).unwrap()))?,
        adam(false, 0.05),
    );
    Ok(())
}

#[test]
fn bad_uses_are_typed_errors() -> Result<()> {
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let other = ParamStore::new(&cpu);
    let mut rng = Generator::new(0);
    let layer = Linear::new(&store.root().sub("fc"), 3, 2, true, &mut rng)?;
    let mut opt = Sgd::new(&store, 0.1)?;
    let err = opt.step(&other).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("another ParamStore"), "{err}");
    let err = layer.forward(&Tensor::ones(&[2, 4], DType::F32, &cpu)?).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert!(err.to_string().contains("Linear"), "{err}");
    let err = Linear::new(&store.root().sub("fc"), 3, 2, true, &mut rng)
        .err()
        .unwrap();
    assert!(err.to_string().contains("already exists"), "{err}");
    let attention = MultiHeadAttention::new(&store.root().sub("attn"), 8, 2, true, &mut rng)?;
    assert_eq!(
        attention
            .forward(&Tensor::ones(&[4, 8], DType::F32, &cpu)?)
            .unwrap_err()
            .kind(),
        ErrorKind::ShapeMismatch
    );
    assert!(MultiHeadAttention::new(&store.root().sub("bad"), 8, 3, true, &mut rng).is_err());
    Ok(())
}

#[test]
fn layers_have_pytorch_shapes_and_initialisations_and_gradients_reach_every_parameter() -> Result<()> {
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let mut rng = Generator::new(3);
    let root = store.root();
    let linear = Linear::new(&root.sub("linear"), 64, 8, true, &mut rng)?;
    let w = linear.weight().value().to_vec::<f32>()?;
    assert!(w.iter().all(|v| v.abs() <= 1.0 / 8.0), "U(±1/√64)");
    assert!(w.iter().any(|v| v.abs() > 0.1), "spread over the range");
    let embedding = Embedding::new(&root.sub("embedding"), 10, 8, &mut rng)?;
    let norm = LayerNorm::new(&root.sub("norm"), 8, 1e-5)?;
    let rms = RmsNorm::new(&root.sub("rms"), 8, 1e-6)?;
    let block = TransformerBlock::new(&root.sub("block"), 8, 2, true, &mut rng)?;
    let conv = Conv2d::new(&root.sub("conv"), 2, 3, [3, 3], Default::default(), true, &mut rng)?;
    let ids = Tensor::from_slice(&[1i64, 4, 9, 0, 2, 3], &[2, 3], &cpu)?;
    let h = embedding.forward(&ids)?; // [2, 3, 8]
    let h = block.forward(&rms.forward(&norm.forward(&h)?)?)?;
    assert_eq!(h.shape(), &[2, 3, 8]);
    let image = Tensor::randn(&[1, 2, 6, 6], DType::F32, 1, &cpu)?;
    let pooled = MaxPool2d {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
    }
    .forward(&conv.forward(&image)?)?;
    assert_eq!(pooled.shape(), &[1, 3, 2, 2]);
    let loss = h
        .square()?
        .mean_all()?
        .add(&pooled.mean_all()?)?
        .add(&linear.forward(&Tensor::ones(&[1, 64], DType::F32, &cpu)?)?.sum_all()?)?;
    loss.backward()?;
    for (name, var) in store.named_vars() {
        let g = var.grad().unwrap_or_else(|| panic!("{name} got no gradient"));
        assert_eq!(g.shape(), var.shape().as_slice(), "{name}");
    }
    assert_eq!(
        store.num_params(),
        store
            .vars()
            .iter()
            .map(|v| v.shape().iter().product::<usize>())
            .sum::<usize>()
    );
    Ok(())
}

#[test]
fn dropout_follows_the_store_mode() -> Result<()> {
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let dropout = Dropout::new(&store, 0.5, Generator::new(1));
    let x = Tensor::ones(&[1000], DType::F32, &cpu)?;
    let kept = dropout.forward(&x)?.to_vec::<f32>()?;
    assert!(kept.iter().all(|&v| v == 0.0 || v == 2.0));
    assert!(kept.contains(&0.0) && kept.contains(&2.0));
    store.eval();
    assert_eq!(dropout.forward(&x)?.to_vec::<f32>()?, vec![1.0; 1000]);
    store.train();
    assert!(store.is_training());
    Ok(())
}

#[test]
fn a_small_model_learns_on_every_device() -> Result<()> {
    let mut devices = vec![Device::cpu()];
    devices.extend(other_device());
    for device in devices {
        let store = ParamStore::new(&device);
        let mut rng = Generator::new(7);
        let model = mlp(&store, &mut rng)?;
        let mut opt = AdamW::new(&store, 3e-2)?;
        let (x, y) = batch(&device)?;
        let first = model.forward(&x)?.sub(&y)?.square()?.mean_all()?.item::<f32>()?;
        let mut total = Tensor::zeros(&[], DType::F32, &device)?;
        for _ in 0..150 {
            let loss = model.forward(&x)?.sub(&y)?.square()?.mean_all()?;
            loss.backward()?;
            opt.step(&store)?;
            store.zero_grad();
            total = total.add(&loss.detach())?;
        }
        let last = model.forward(&x)?.sub(&y)?.square()?.mean_all()?.item::<f32>()?;
        assert!(last < 0.05 * first, "{device}: loss {first} → {last}");
        assert!(total.item::<f32>()?.is_finite());
    }
    Ok(())
}

#[test]
fn rms_norm_layer_without_eps_uses_the_dtype_machine_epsilon() -> Result<()> {
    // nn.RMSNorm(dim, eps=None): eps = torch.finfo(x.dtype).eps (2⁻²³ for f32).
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let norm = RmsNorm::new(&store.root().sub("rms"), 4, None)?;
    let data = [1e-4f32, -2e-4, 3e-4, 5e-5];
    let got = norm
        .forward(&Tensor::from_slice(&data, &[1, 4], &cpu)?)?
        .to_vec::<f32>()?;
    let ms = data.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 4.0;
    for (g, v) in got.iter().zip(data) {
        let want = v as f64 / (ms + 2f64.powi(-23)).sqrt();
        assert!((*g as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "{got:?}");
    }
    Ok(())
}
