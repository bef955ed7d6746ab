//! Host reads are counted with their call sites, so a loop that reads back every step shows up
//! as one line with a large count (R5).

use cartage::prelude::*;
use cartage::stats;

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
