//! Every optimizer is built the same way — `new(&store, lr)` then checked setters — refuses
//! what PyTorch's constructors refuse at the setter that sets it, and clears gradients with
//! `zero_grad` as the store does.

use cartage::prelude::*;
use cartage::{Error, ErrorKind};
use cartage_nn::ParamStore;
use cartage_nn::optim::{Adam, AdamW, Optimizer, Sgd};

fn store() -> Result<ParamStore> {
    let store = ParamStore::new(&Device::cpu());
    store.root().var("w", Tensor::ones(&[3], DType::F32, &Device::cpu())?)?;
    Ok(store)
}

fn refused<T>(r: Result<T>, op: &str) {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => assert!(e.to_string().contains(op), "{op}: {e}"),
        Err(other) => panic!("{op}: expected InvalidArgument, got {other}"),
        Ok(_) => panic!("{op}: accepted"),
    }
}

#[test]
fn setters_check_what_they_set() -> Result<()> {
    let s = store()?;
    refused(Sgd::new(&s, 0.1)?.momentum(-0.5), "Sgd::momentum");
    refused(Sgd::new(&s, 0.1)?.weight_decay(f64::NAN), "Sgd::weight_decay");
    refused(
        Sgd::new(&s, 0.1)?.momentum(0.9)?.dampening(0.1)?.nesterov(true),
        "Sgd::nesterov",
    );
    refused(Sgd::new(&s, 0.1)?.lr(-1.0), "Sgd::lr");
    refused(Adam::new(&s, 1e-3)?.betas((0.9, 1.0)), "Adam::betas");
    refused(Adam::new(&s, 1e-3)?.eps(f64::INFINITY), "Adam::eps");
    refused(AdamW::new(&s, 1e-3)?.weight_decay(-0.1), "AdamW::weight_decay");
    refused(AdamW::new(&s, 1e-3)?.lr(f64::NAN), "AdamW::lr");
    let opt = AdamW::new(&s, 1e-3)?.lr(3e-4)?.betas((0.9, 0.95))?.weight_decay(0.1)?;
    assert_eq!(opt.learning_rate(), 3e-4);
    Ok(())
}

#[test]
fn the_setters_change_the_update() -> Result<()> {
    // One SGD step with weight decay 0.5 on w = 1 and a zero gradient: w -= lr·(0 + 0.5·w).
    let s = store()?;
    let w = s.get("w").expect("a parameter");
    w.set_grad(Some(Tensor::zeros(&[3], DType::F32, &Device::cpu())?))?;
    let mut sgd = Sgd::new(&s, 0.1)?.weight_decay(0.5)?;
    sgd.step(&s)?;
    assert_eq!(w.tensor().to_vec::<f32>()?, vec![0.95; 3]);
    Ok(())
}

#[test]
fn zero_grad_on_the_optimizer_clears_the_stores_gradients() -> Result<()> {
    let s = store()?;
    let w = s.get("w").expect("a parameter");
    w.tensor().square()?.sum_all()?.backward()?;
    assert!(w.grad().is_some());
    let opt = Adam::new(&s, 1e-3)?;
    opt.zero_grad(&s);
    assert!(w.grad().is_none(), "zero_grad clears (PyTorch's set_to_none default)");
    assert!(matches!(
        Sgd::new(&s, 0.1)?.lr(-1.0).map(drop).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    ));
    Ok(())
}
