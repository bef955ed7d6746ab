//! What the NCCL test binaries share: running their tests one at a time, and opening CUDA
//! backends with NCCL loaded (a SKIP line without them, a failure under `CARTAGE_REQUIRE=cuda`).

#![allow(dead_code)]

use std::sync::Arc;

use cartage_core::Backend;

/// Tests of a binary share the GPUs' compute streams (and some time them): they run one at a
/// time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Hold while a test runs.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// True when `CARTAGE_REQUIRE` names cuda.
pub fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE").is_ok_and(|v| v.split(',').any(|k| k.trim() == "cuda"))
}

/// `count` CUDA backends with NCCL loaded, or `None` after a loud skip naming `suite/test`. A
/// missing driver, device or NCCL library fails under `CARTAGE_REQUIRE=cuda` when `count` is 1;
/// a second GPU is never required.
pub fn backends(suite: &str, test: &str, count: usize) -> Option<Vec<Arc<dyn Backend>>> {
    let skip = |device: &str, reason: &str| {
        cartage_core::testsuite::skip::device_missing(&format!("{suite}/{test}"), device, reason);
    };
    let mut opened = Vec::new();
    for ordinal in 0..count {
        match cartage_cuda::open(ordinal) {
            Ok(b) => opened.push(b),
            Err(e) => {
                assert!(
                    !(required() && ordinal == 0),
                    "CARTAGE_REQUIRE names cuda but {test} cannot open cuda:0: {e}"
                );
                skip(&format!("cuda:{ordinal}"), &e.to_string());
                return None;
            }
        }
    }
    if let Err(reason) = cartage_cuda::nccl::version() {
        assert!(
            !required(),
            "CARTAGE_REQUIRE names cuda but NCCL does not load: {reason}"
        );
        skip("nccl", &reason);
        return None;
    }
    Some(opened)
}
