//! The shared backend conformance suite (cartage-core's `testsuite`), run against the cpu backend.

cartage_core::conformance_tests!(cpu, || cartage_cpu::open(0));
