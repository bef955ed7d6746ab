//! The cartage conformance suite on `wgpu:0` (lavapipe in CI, the NVIDIA adapter on the H200).

cartage_core::conformance_tests!(wgpu, || cartage_wgpu::open(0));
