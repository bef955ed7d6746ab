//! Checkpoints: N steps straight through equal N/2 steps, save, load into a fresh model, N/2
//! steps, bit for bit (dropout's masks included); missing, unexpected and misshapen entries are typed errors.

use cartage::ErrorKind;
use cartage::prelude::*;
use cartage_nn::layers::{Activation, Dropout, Linear, Sequential};
use cartage_nn::optim::{AdamW, Optimizer};
use cartage_nn::{GradScaler, Module, ParamStore, load_checkpoint, save_checkpoint};

struct Run {
    store: ParamStore,
    model: Sequential,
    opt: AdamW,
    scaler: GradScaler,
    data: Generator,
}

fn fresh(width: usize) -> Result<Run> {
    let cpu = Device::cpu();
    let store = ParamStore::new(&cpu);
    let mut init = Generator::new(42);
    let model = Sequential::new()
        .push(Linear::new(&store.root().sub("0"), 8, width, true, &mut init)?)
        .push(Activation::Gelu)
        // Dropout's generator is registered with the store: the checkpoint must carry its
        // position, or the resumed run draws other masks.
        .push(Dropout::new(&store, 0.2, Generator::new(3)))
        .push(Linear::new(&store.root().sub("2"), width, 1, true, &mut init)?);
    let opt = AdamW::new(&store, 1e-2)?;
    Ok(Run {
        store,
        model,
        opt,
        scaler: GradScaler::with_scale(1024.0),
        data: Generator::new(7),
    })
}

fn steps(run: &mut Run, n: usize) -> Result<()> {
    let cpu = Device::cpu();
    for _ in 0..n {
        let x = Tensor::randn_with(&[16, 8], DType::F32, &mut run.data, &cpu)?;
        let y = x.sum(&[1], true)?.tanh()?;
        let loss = run.model.forward(&x)?.sub(&y)?.square()?.mean_all()?;
        run.scaler.scale(&loss)?.backward()?;
        run.scaler.step(&mut run.opt, &run.store)?;
        run.scaler.update();
        run.store.zero_grad();
    }
    Ok(())
}

fn bits(run: &Run) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for var in run.store.vars() {
        out.extend(var.value().to_vec::<f32>()?.into_iter().map(f32::to_bits));
    }
    Ok(out)
}

#[test]
fn resuming_from_a_checkpoint_continues_bit_for_bit() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| cartage::Error::Io {
        path: "tempdir".into(),
        source: e,
    })?;
    let path = dir.path().join("run.safetensors");
    let mut straight = fresh(16)?;
    steps(&mut straight, 10)?;

    let mut first = fresh(16)?;
    steps(&mut first, 5)?;
    save_checkpoint(
        &path,
        &first.store,
        &first.opt,
        Some(&first.scaler),
        &[("data", &first.data)],
    )?;
    drop(first);

    let mut resumed = fresh(16)?;
    let Run {
        store,
        opt,
        scaler,
        data,
        ..
    } = &mut resumed;
    load_checkpoint(&path, store, opt, Some(scaler), &mut [("data", data)])?;
    assert_eq!(resumed.opt.steps(), 5);
    steps(&mut resumed, 5)?;
    assert_eq!(
        bits(&straight)?,
        bits(&resumed)?,
        "resumed training differs from the straight run"
    );
    assert_eq!(straight.opt.learning_rate(), resumed.opt.learning_rate());
    assert_eq!(straight.scaler.state(), resumed.scaler.state());
    Ok(())
}

#[test]
fn a_checkpoint_of_another_model_is_refused_without_changing_anything() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| cartage::Error::Io {
        path: "tempdir".into(),
        source: e,
    })?;
    let path = dir.path().join("small.safetensors");
    let small = fresh(16)?;
    save_checkpoint(&path, &small.store, &small.opt, None, &[])?;

    let mut wider = fresh(32)?;
    let before = bits(&wider)?;
    let err = load_checkpoint(&path, &wider.store, &mut wider.opt, None, &mut []).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StateMismatch);
    assert_eq!(bits(&wider)?, before);

    let store = ParamStore::new(&Device::cpu());
    store
        .root()
        .var("other", Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    let mut opt = AdamW::new(&store, 1e-3)?;
    let err = load_checkpoint(&path, &store, &mut opt, None, &mut []).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StateMismatch);
    assert!(err.to_string().contains("model/other"), "{err}");
    let mut rng = Generator::new(1);
    let mut same = fresh(16)?;
    let err = load_checkpoint(&path, &same.store, &mut same.opt, None, &mut [("missing", &mut rng)]).unwrap_err();
    assert!(err.to_string().contains("generator `missing`"), "{err}");
    let err = load_checkpoint(&path, &small.store, &mut same.opt, None, &mut []).unwrap_err();
    assert!(err.to_string().contains("another ParamStore"), "{err}");
    Ok(())
}
