//! The backend conformance suite (filled in by the testsuite work).
