//! A rank that never joins: rank 0 of a group of two joins with a fresh id, rank 1 never comes,
//! and the join fails with a typed error after the engine's timeout instead of hanging. Needs one
//! GPU (the missing rank is simply never started). Its own test binary: the abandoned join
//! stays blocked inside NCCL on a helper thread until the process exits.
//!
//! Without a CUDA device or without NCCL the test prints a SKIP line, and fails instead under
//! `CARTAGE_REQUIRE=cuda`.
#![cfg(feature = "nccl")]

use std::time::{Duration, Instant};

use cartage_core::{CollectiveEngine, Error};
use cartage_cuda::nccl::NcclEngine;

fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE").is_ok_and(|v| v.split(',').any(|k| k.trim() == "cuda"))
}

fn skip(device: &str, reason: &str) {
    cartage_core::testsuite::skip::device_missing("nccl_join/a_rank_that_never_joins", device, reason);
}

#[test]
fn a_rank_that_never_joins_fails_the_other_within_the_timeout() {
    let backend = match cartage_cuda::open(0) {
        Ok(b) => b,
        Err(e) => {
            assert!(!required(), "CARTAGE_REQUIRE names cuda but cuda:0 does not open: {e}");
            return skip("cuda:0", &e.to_string());
        }
    };
    if let Err(reason) = cartage_cuda::nccl::version() {
        assert!(
            !required(),
            "CARTAGE_REQUIRE names cuda but NCCL does not load: {reason}"
        );
        return skip("nccl", &reason);
    }
    let timeout = Duration::from_secs(3);
    let engine = NcclEngine::new().with_timeout(timeout);
    let id = engine.unique_id(&backend).unwrap();
    let started = Instant::now();
    let err = match engine.join(&backend, &id, 0, 2) {
        Ok(_) => panic!("joined a group of two alone"),
        Err(e) => e,
    };
    let waited = started.elapsed();
    assert!(
        matches!(
            err,
            Error::RanksMissing {
                rank: 0,
                world_size: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(10),
        "{waited:?}"
    );
    eprintln!("nccl_join: rank 0 gave up after {waited:?}: {err}");
}
