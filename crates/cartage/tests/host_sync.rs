//! Host reads are counted with their call sites, so a loop that reads back every step shows up
//! as one line with a large count (R5).

use cartage::prelude::*;
use cartage::{Error, stats};

#[test]
fn every_host_read_is_counted_at_its_call_site() -> Result<()> {
    let d = Device::cpu();
    let x = Tensor::rand(&[16], DType::F32, 9, &d)?;
    let before = stats().host_syncs;

    // The anti-pattern: read a scalar back every step.
    let mut total = 0.0f32;
    let per_step_line = line!() + 2;
    for _ in 0..5 {
        total += x.sum_all()?.item::<f32>()?;
    }
    // The pattern: accumulate on the device, read once.
    let mut acc = Tensor::zeros(&[], DType::F32, &d)?;
    for _ in 0..5 {
        acc = acc.add(&x.sum_all()?)?;
    }
    let once_line = line!() + 1;
    let once = acc.item::<f32>()?;
    let vec_line = line!() + 1;
    let values = x.to_vec_f64()?;

    let s = stats();
    assert_eq!(s.syncs_at(file!(), per_step_line), 5);
    assert_eq!(s.syncs_at(file!(), once_line), 1);
    assert_eq!(s.syncs_at(file!(), vec_line), 1);
    assert!(s.host_syncs >= before + 7);
    let hottest_here = s
        .sync_sites
        .iter()
        .find(|(site, _)| site.file() == file!())
        .expect("this file's syncs are listed");
    assert_eq!(hottest_here.0.line(), per_step_line, "sites are sorted by count");
    assert!((total - once).abs() <= 1e-3 * once.abs(), "{total} vs {once}");
    assert_eq!(values.len(), 16);
    // Ops, views and constructors do not synchronise.
    let quiet = stats().host_syncs;
    let _ = x.mul(&x)?.t()?.sum(&[0], true)?;
    assert_eq!(stats().syncs_at(file!(), line!() - 1), 0);
    assert!(stats().host_syncs >= quiet);
    Ok(())
}

/// The range of an integer tensor's values is known on the host when the host wrote them (or
/// `arange` did), survives moves, copies and fitting casts, and is forgotten by an in-place
/// write.
#[test]
fn host_written_indices_carry_their_range() -> Result<()> {
    let cpu = Device::cpu();
    let ids = Tensor::from_slice(&[3i64, -2, 9], &[3], &cpu)?;
    let range = |t: &Tensor| t.storage().known_range().map(|r| (r.min, r.max));
    assert_eq!(range(&ids), Some((-2, 9)));
    assert_eq!(
        range(&Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?),
        None,
        "floats carry none"
    );
    assert_eq!(range(&ids.to(&cpu)?), Some((-2, 9)));
    assert_eq!(range(&ids.to_dtype(DType::I32)?), Some((-2, 9)));
    let grid = Tensor::from_slice(&[3i64, -2, 9, 4, 0, 1], &[2, 3], &cpu)?;
    assert_eq!(
        range(&grid.t()?.contiguous()?),
        Some((-2, 9)),
        "a contiguous copy keeps it"
    );
    let wide = Tensor::from_slice(&[0i64, 1 << 40], &[2], &cpu)?;
    assert_eq!(
        range(&wide.to_dtype(DType::I32)?),
        None,
        "a cast that wraps forgets the range"
    );
    assert_eq!(range(&Tensor::arange(0.0, 10.0, 1.0, DType::I32, &cpu)?), Some((0, 9)));
    assert_eq!(range(&Tensor::arange(7.0, -1.0, -2.0, DType::I64, &cpu)?), Some((1, 7)));
    assert_eq!(
        range(&Tensor::arange(0.0, 1.0, 0.25, DType::I64, &cpu)?),
        None,
        "inexact steps"
    );
    // Arithmetic makes values the host does not know.
    assert_eq!(range(&ids.add(&ids)?), None);
    // An in-place write moves the version on, and the range no longer holds.
    ids.copy_from(&Tensor::from_slice(&[100i64, 200, 300], &[3], &cpu)?)?;
    assert_eq!(range(&ids), None);
    Ok(())
}

/// On CUDA an index check is read back after its kernel (a host wait) unless the host knows the
/// indices are in range: host-made ids and targets launch an embedding, a cross-entropy and
/// their backward passes without waiting; ids computed on the device wait once; a bad index
/// is an error either way.
#[test]
fn host_made_indices_launch_without_waiting_on_cuda() -> Result<()> {
    let device = Device::cuda(0);
    let backend = match cartage::backend(&device) {
        Ok(backend) => backend,
        Err(e) => {
            let required = std::env::var("CARTAGE_REQUIRE").is_ok_and(|v| v.split(',').any(|k| k.trim() == "cuda"));
            assert!(!required, "CARTAGE_REQUIRE names cuda but {device} did not open: {e}");
            eprintln!("SKIP host_made_indices_launch_without_waiting_on_cuda: {device}: {e}");
            return Ok(());
        }
    };
    let cpu = Device::cpu();
    let table = Var::new(Tensor::randn(&[100, 16], DType::F32, 1, &device)?)?;
    let ids = Tensor::from_slice(&[3i64, 99, 0, 42, 3], &[5], &device)?;
    let before = backend.launch_waits();
    let rows = table.tensor().embedding(&ids)?;
    let logits = rows.reshape(&[5, 16])?;
    let targets = Tensor::from_slice(&[1i32, 15, 0, 7, 7], &[5], &device)?;
    let loss = logits.cross_entropy(&targets, Default::default())?;
    loss.backward()?;
    let positions = Tensor::arange(0.0, 5.0, 1.0, DType::I64, &device)?;
    let by_position = table.tensor().index_select(0, &positions)?;
    let moved = Tensor::from_slice(&[5i64, 6], &[2], &cpu)?.to(&device)?;
    let by_moved = table.tensor().embedding(&moved)?;
    assert_eq!(
        backend.launch_waits(),
        before,
        "host-made indices must not wait for the device"
    );

    // The results are those of the CPU.
    let table_cpu = table.tensor().to(&cpu)?;
    let expect = table_cpu.embedding(&ids.to(&cpu)?)?;
    assert_eq!(rows.to_vec::<f32>()?, expect.to_vec::<f32>()?);
    assert_eq!(
        by_position.to_vec::<f32>()?,
        table_cpu.narrow(0, 0, 5)?.to_vec::<f32>()?
    );
    assert_eq!(by_moved.to_vec::<f32>()?, table_cpu.narrow(0, 5, 2)?.to_vec::<f32>()?);
    let grad = table.grad().expect("the table has a gradient").to_vec::<f32>()?;
    assert!(grad[3 * 16..4 * 16].iter().any(|g| *g != 0.0) && grad[16..2 * 16].iter().all(|g| *g == 0.0));

    // Indices computed on the device are checked and waited for.
    let computed = ids.add(&Tensor::zeros(&[5], DType::I64, &device)?)?;
    let waits = backend.launch_waits();
    let again = table.tensor().embedding(&computed)?;
    assert_eq!(backend.launch_waits(), waits + 1, "device-made indices are read back");
    assert_eq!(again.to_vec::<f32>()?, expect.to_vec::<f32>()?);
    // So are host-made ones written in place since.
    ids.copy_from(&computed)?;
    let waits = backend.launch_waits();
    let _ = table.tensor().embedding(&ids)?;
    assert_eq!(backend.launch_waits(), waits + 1, "an in-place write forgets the range");

    // A bad index is an error, whether the range shows it or the device finds it.
    let bad = Tensor::from_slice(&[0i64, 100], &[2], &device)?;
    let err = table.tensor().embedding(&bad).expect_err("index 100 of 100 rows");
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 100,
                size: 100,
                ..
            }
        ),
        "{err}"
    );
    let bad_computed = bad.add(&Tensor::zeros(&[2], DType::I64, &device)?)?;
    let err = table
        .tensor()
        .embedding(&bad_computed)
        .expect_err("index 100 of 100 rows");
    assert!(matches!(err, Error::IndexOutOfRange { index: 100, .. }), "{err}");
    let bad_target = Tensor::from_slice(&[1i32, 16, 0, 7, 7], &[5], &device)?;
    let err = logits
        .cross_entropy(&bad_target, Default::default())
        .expect_err("class 16 of 16");
    assert!(matches!(err, Error::IndexOutOfRange { index: 16, .. }), "{err}");
    // A view whose storage holds a bad value but whose own values are in range is fine.
    let view = Tensor::from_slice(&[-5i64, 7, 8], &[3], &device)?.narrow(0, 1, 2)?;
    let picked = table.tensor().embedding(&view)?;
    assert_eq!(picked.to_vec::<f32>()?, table_cpu.narrow(0, 7, 2)?.to_vec::<f32>()?);
    Ok(())
}
