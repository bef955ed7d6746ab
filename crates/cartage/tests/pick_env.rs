//! `Device::pick()` reads `CARTAGE_DEVICE`: a bare `cuda` is a typed error, `cpu` picks the CPU,
//! unset picks the best available device. Alone in its binary: it changes the environment.

use cartage::Error;
use cartage::prelude::*;
use cartage::runtime::DEVICE_ENV;

#[test]
fn pick_reads_the_environment() -> Result<()> {
    // Open every backend first, so that no driver reads the environment while it changes.
    let best = Device::best_available();
    // SAFETY: this binary has this one test, so no other thread reads or writes the
    // environment while it changes.
    unsafe { std::env::set_var(DEVICE_ENV, "cuda") };
    let bare = Device::pick();
    // SAFETY: as above.
    unsafe { std::env::set_var(DEVICE_ENV, "cpu") };
    let cpu = Device::pick();
    // SAFETY: as above.
    unsafe { std::env::remove_var(DEVICE_ENV) };
    let unset = Device::pick();
    assert!(matches!(bare, Err(Error::InvalidDevice { .. })), "{bare:?}");
    assert_eq!(cpu?, Device::cpu());
    assert_eq!(unset?, best);
    Ok(())
}
