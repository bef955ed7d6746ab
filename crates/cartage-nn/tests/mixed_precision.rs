//! Mixed precision (LESSONS R25): autocast's op list, f32 master weights, and a GradScaler that
//! rescues f16 gradients which underflow without it and skips steps that overflow.

use cartage::prelude::*;
use cartage::{ErrorKind, autocast};
use cartage_nn::layers::Linear;
use cartage_nn::optim::{AdamW, Optimizer, Sgd};
use cartage_nn::{GradScaler, Module, ParamStore};
use std::sync::{Mutex, MutexGuard};

/// The runtime's sync counters are process-wide: a test that counts host syncs holds this lock,
/// and so does every other test here that reads values back, so no other test adds to its count.
static COUNTED: Mutex<()> = Mutex::new(());

fn counted() -> MutexGuard<'static, ()> {
    COUNTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn autocast_runs_products_in_half_and_reductions_in_f32() -> Result<()> {
    let _serial = counted();
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let mut rng = Generator::new(1);
    let layer = Linear::new(&store.root().sub("fc"), 8, 4, true, &mut rng)?;
    let x = Tensor::randn(&[3, 8], DType::F32, 2, &cpu)?;
    let w = Tensor::ones(&[4], DType::F32, &cpu)?;
    {
        let _ac = autocast(&cpu, DType::BF16)?;
        let h = x.matmul(&layer.weight().tensor().t()?)?;
        assert_eq!(h.dtype(), DType::BF16);
        let y = layer.forward(&x)?; // product and bias in bf16, as PyTorch's `linear`
        assert_eq!(y.dtype(), DType::BF16);
        assert_eq!(
            y.add(&x.narrow(1, 0, 4)?)?.dtype(),
            DType::F32,
            "mixed operands: the wider"
        );
        assert_eq!(h.softmax(-1)?.dtype(), DType::F32);
        assert_eq!(h.log_softmax(-1)?.dtype(), DType::F32);
        assert_eq!(h.layer_norm(Some(&w), None, 1e-5)?.dtype(), DType::F32);
        assert_eq!(h.rms_norm(None, 1e-6)?.dtype(), DType::F32);
        assert_eq!(h.sum_all()?.dtype(), DType::F32);
        assert_eq!(h.mean(&[1], false)?.dtype(), DType::F32);
        assert_eq!(h.var(&[1], 1.0, false)?.dtype(), DType::F32);
        assert_eq!(
            h.max_all()?.dtype(),
            DType::BF16,
            "max is exact in any dtype: not in the list"
        );
        let target = Tensor::from_slice(&[0i64, 3, 1], &[3], &cpu)?;
        assert_eq!(h.cross_entropy(&target, Default::default())?.dtype(), DType::F32);
        let loss = y.square()?.mean_all()?;
        loss.backward()?;
    }
    assert_eq!(cartage::autocast_dtype(), None);
    let g = layer.weight().grad().unwrap();
    assert_eq!(g.dtype(), DType::F32, "master weights and their gradients stay f32");
    assert_eq!(layer.weight().value().dtype(), DType::F32);
    // Outside autocast nothing is promoted.
    let half = x.to_dtype(DType::BF16)?;
    assert_eq!(half.add(&x).unwrap_err().kind(), ErrorKind::DTypeMismatch);
    assert_eq!(autocast(&cpu, DType::F32).err().unwrap().kind(), ErrorKind::WrongDType);
    Ok(())
}

/// A linear regression whose loss is tiny (× 1e-9): its f16 gradients underflow.
fn tiny_loss_steps(scaler: Option<&mut GradScaler>, steps: usize) -> Result<(f32, f32, usize)> {
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let mut rng = Generator::new(5);
    let layer = Linear::new(&store.root().sub("fc"), 16, 1, false, &mut rng)?;
    let mut opt = AdamW::new(&store, 2e-2)?.with((0.9, 0.999), 1e-12, 0.0)?;
    let x = Tensor::randn(&[64, 16], DType::F32, 6, &cpu)?;
    let y = x.sum(&[1], true)?;
    let loss_now = || -> Result<f32> {
        let _plain = cartage::no_grad();
        layer.forward(&x)?.sub(&y)?.square()?.mean_all()?.item::<f32>()
    };
    let first = loss_now()?;
    let mut stepped = 0;
    let mut scaler = scaler;
    for _ in 0..steps {
        let loss = {
            let _ac = autocast(&cpu, DType::F16)?;
            layer.forward(&x)?.sub(&y)?.square()?.mean_all()?.mul_scalar(1e-9)?
        };
        match scaler.as_deref_mut() {
            Some(s) => {
                s.scale(&loss)?.backward()?;
                stepped += usize::from(s.step(&mut opt, &store)?);
                s.update();
            }
            None => {
                loss.backward()?;
                opt.step(&store)?;
                stepped += 1;
            }
        }
        store.zero_grad();
    }
    Ok((first, loss_now()?, stepped))
}

#[test]
fn f16_gradients_underflow_without_the_scaler_and_train_with_it() -> Result<()> {
    let _serial = counted();
    let (first, last, _) = tiny_loss_steps(None, 30)?;
    assert_eq!(
        first, last,
        "without scaling every f16 gradient flushed to zero: nothing moved"
    );
    let mut scaler = GradScaler::new();
    let (first, last, stepped) = tiny_loss_steps(Some(&mut scaler), 30)?;
    assert!(last < 0.5 * first, "with scaling the model trains: {first} → {last}");
    assert_eq!(stepped, 30);
    Ok(())
}

#[test]
fn an_overflowing_step_is_skipped_and_the_scale_backs_off() -> Result<()> {
    let _serial = counted();
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let w = store.root().var("w", Tensor::ones(&[4], DType::F32, &cpu)?)?;
    let mut opt = Sgd::new(&store, 0.1)?;
    let mut scaler = GradScaler::with_scale(1e9);
    let loss = {
        let _ac = autocast(&cpu, DType::F16)?;
        // The gradient reaching the f16 product is 1e9: above f16's 65504.
        w.tensor()
            .reshape(&[1, 4])?
            .matmul(&Tensor::ones(&[4, 1], DType::F32, &cpu)?)?
            .sum_all()?
    };
    cartage::reset_stats();
    scaler.scale(&loss)?.backward()?;
    assert!(!scaler.step(&mut opt, &store)?, "an inf gradient skips the step");
    assert_eq!(cartage::stats().host_syncs, 1, "one flag read back per step");
    scaler.update();
    assert_eq!(scaler.current_scale(), 5e8);
    assert_eq!(w.value().to_vec::<f32>()?, vec![1.0; 4], "parameters untouched");
    assert_eq!(opt.learning_rate(), 0.1);
    let state = scaler.state();
    let mut resumed = GradScaler::new();
    resumed.load_state(state);
    assert_eq!(resumed.current_scale(), 5e8);
    Ok(())
}
