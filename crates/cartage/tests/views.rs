//! Views share storage; `contiguous` copies only when it must; `reshape` is a view when the
//! strides allow and otherwise an explicit, counted copy (R12); `copy_from` writes into a view.

use cartage::prelude::*;
use cartage::stats;

fn cpu() -> Device {
    Device::cpu()
}

#[test]
fn views_share_storage_and_read_the_right_elements() -> Result<()> {
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &cpu())?.reshape(&[2, 3, 4])?;
    let views = [
        x.transpose(0, 2)?,
        x.t()?,
        x.permute(&[1, 2, 0])?,
        x.narrow(-1, 1, 2)?,
        x.unsqueeze(1)?,
        x.unsqueeze(-1)?,
        x.narrow(0, 1, 1)?.squeeze(0)?,
        x.reshape(&[6, 4])?,
        x.flatten()?,
        x.narrow(2, 0, 1)?.broadcast_to(&[5, 2, 3, 4])?,
    ];
    for v in &views {
        assert!(v.shares_storage(&x), "{v:?}");
        assert_eq!(v.origin(), x.origin(), "a view keeps its source's origin");
    }
    assert_eq!(views[1].shape(), &[2, 4, 3]);
    assert_eq!(views[1].narrow(0, 0, 1)?.to_vec::<f32>()?[..4], [0.0, 4.0, 8.0, 1.0]);
    assert_eq!(views[2].shape(), &[3, 4, 2]);
    assert_eq!(views[2].to_vec::<f32>()?[..4], [0.0, 12.0, 1.0, 13.0]);
    assert_eq!(views[3].to_vec::<f32>()?[..4], [1.0, 2.0, 5.0, 6.0]);
    assert_eq!(views[6].shape(), &[3, 4]);
    assert_eq!(views[6].to_vec::<f32>()?[0], 12.0);
    let b = &views[9];
    assert_eq!(b.shape(), &[5, 2, 3, 4]);
    assert_eq!(b.to_vec::<f32>()?[..8], [0.0, 0.0, 0.0, 0.0, 4.0, 4.0, 4.0, 4.0]);
    assert_eq!(x.size_in_bytes(), 96);
    assert_eq!(views[3].size_in_bytes(), 48);
    assert_eq!(views[3].storage_bytes(), 96);
    Ok(())
}

#[test]
fn contiguous_copies_only_when_needed() -> Result<()> {
    let x = Tensor::rand(&[8, 16], DType::F32, 3, &cpu())?;
    let same = x.contiguous()?;
    assert!(same.shares_storage(&x), "a contiguous tensor is returned as is");
    let row = x.narrow(0, 2, 3)?;
    assert!(row.is_contiguous());
    assert!(
        row.contiguous()?.shares_storage(&x),
        "a run of whole rows is already contiguous"
    );

    let t = x.t()?;
    assert!(!t.is_contiguous());
    let c = t.contiguous()?;
    assert!(!c.shares_storage(&x));
    assert!(c.is_contiguous());
    assert_eq!(c.to_vec::<f32>()?, t.to_vec::<f32>()?);
    let columns = x.narrow(1, 3, 5)?;
    assert!(!columns.is_contiguous());
    assert_eq!(columns.contiguous()?.shape(), &[8, 5]);
    Ok(())
}

#[test]
fn reshape_copies_only_when_strides_forbid_a_view_and_counts_it() -> Result<()> {
    let x = Tensor::arange(0.0, 12.0, 1.0, DType::I64, &cpu())?.reshape(&[3, 4])?;
    let before = stats();
    let view = x.narrow(1, 0, 2)?.reshape(&[3, 2, 1])?;
    assert!(view.shares_storage(&x), "splitting off a unit dimension needs no copy");
    let copied = x.t()?.reshape(&[12])?;
    let after = stats();
    assert!(!copied.shares_storage(&x));
    assert_eq!(copied.to_vec::<i64>()?, vec![0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
    assert!(after.implicit_copies > before.implicit_copies);
    assert!(after.implicit_copy_bytes >= before.implicit_copy_bytes + 96);
    Ok(())
}

#[test]
fn copy_from_writes_into_a_view_seen_by_every_sharer() -> Result<()> {
    let x = Tensor::zeros(&[2, 3], DType::F32, &cpu())?;
    let alias = x.clone();
    let column = x.narrow(1, 1, 1)?;
    column.copy_from(&Tensor::from_slice(&[7.0f32, 8.0], &[2, 1], &cpu())?)?;
    assert_eq!(alias.to_vec::<f32>()?, vec![0.0, 7.0, 0.0, 0.0, 8.0, 0.0]);
    assert!(column.copy_from(&Tensor::zeros(&[2], DType::F32, &cpu())?).is_err());
    let broadcast = Tensor::zeros(&[1], DType::F32, &cpu())?.broadcast_to(&[4])?;
    assert!(broadcast.copy_from(&Tensor::ones(&[4], DType::F32, &cpu())?).is_err());
    Ok(())
}

#[test]
fn moving_to_the_same_device_is_a_cheap_clone_with_a_new_origin() -> Result<()> {
    let x = Tensor::ones(&[4], DType::F32, &cpu())?;
    let line = line!() + 1;
    let y = x.to(&cpu())?;
    assert!(y.shares_storage(&x));
    assert_eq!(y.origin().line(), line);
    let z = x.to_dtype(DType::F32)?;
    assert!(z.shares_storage(&x));
    let h = x.to_device_dtype(&cpu(), DType::F16)?;
    assert!(!h.shares_storage(&x));
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.to_vec_f64()?, vec![1.0; 4]);
    Ok(())
}

#[test]
fn tensors_cross_threads() -> Result<()> {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
    let x = Tensor::arange(0.0, 8.0, 1.0, DType::F32, &cpu())?;
    let handle = std::thread::spawn(move || x.sum_all()?.item::<f32>());
    assert_eq!(handle.join().expect("the thread finished")?, 28.0);
    Ok(())
}
