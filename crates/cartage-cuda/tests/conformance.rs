//! The backend conformance suite of cartage-core, on `cuda:0`. Without a CUDA device every test
//! prints a SKIP line; with `CARTAGE_REQUIRE=cuda` it fails instead.

cartage_core::conformance_tests!(cuda, || cartage_cuda::open(0));
