//! The backend conformance suite, written once and instantiated by every backend crate.
//!
//! A backend crate adds `cartage-core = { workspace = true, features = ["testsuite"] }` to its
//! dev-dependencies and one line to `tests/conformance.rs`:
//!
//! ```text
//! cartage_core::conformance_tests!(cpu, || cartage_cpu::open(0));
//! ```
//!
//! That expands to a module `cpu` with one `#[test]` per kernel family (`cpu::fill`,
//! `cpu::matmul`, …); each calls a plain function of this module with the backend. Every test:
//! - runs each dtype `capabilities()` lists for its ops, and checks that every other dtype is
//!   refused with [`crate::Error::Unsupported`] rather than a panic;
//! - covers empty, scalar, one-element, odd, large (≥ 2^20 + 1 elements, cheap ops only),
//!   transposed, narrowed, permuted, offset and broadcast (stride-0) operands;
//! - draws fresh random inputs (the seed is printed; `CARTAGE_TEST_SEED` replays it) in ranges
//!   valid for the op, and compares with an f64 host reference ([`mod@reference`]) under per-dtype
//!   tolerances; outputs are poisoned with 0xFF bytes first, so an unwritten element fails, and
//!   bytes outside an output view must stay untouched.
//!
//! When `open` fails, the test prints `SKIP conformance/<suite>/<test>: <device>: <reason>` to
//! the real stderr and passes, unless `CARTAGE_REQUIRE` (a comma list of `cpu`, `cuda`, `wgpu`)
//! names the device's kind: then it fails with the reason.

pub mod attention;
pub mod attention_backward;
mod attention_mask;
pub mod backward;
pub mod buffers;
pub mod checks;
pub mod conv;
pub mod conv_backward;
pub mod convert;
pub mod creation;
pub mod cross_entropy;
pub mod elementwise;
pub mod errors;
pub mod errors_model;
pub mod harness;
pub mod index;
pub mod layout_props;
pub mod linear;
pub mod matmul;
pub mod memory;
pub mod norm;
pub mod norm_backward;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod reference;
pub mod reference_model;
pub mod scan;
pub mod scatter;
pub mod skip;
pub mod sort;
pub mod unary_edges;
pub mod update;
pub mod update_many;
pub mod views;

pub use buffers::{DeviceBuffer, Operand, Spec};
pub use harness::{Harness, run, run_exclusive};
pub use reference::Tolerance;
pub use views::{Case, LARGE, View, ViewKind};

/// Instantiate the conformance suite for one backend: `conformance_tests!(name, open)` where
/// `open` is an expression of type `Fn() -> cartage_core::Result<Arc<dyn Backend>>` (usually a
/// closure calling the backend crate's `open(0)`). Expands to a module `name` of `#[test]`s.
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $open:expr) => {
        #[allow(missing_docs)]
        mod $name {
            // The caller's items (a local `open` function, say) stay reachable from `$open`.
            #[allow(unused_imports)]
            use super::*;
            use $crate::testsuite as suite;
            const SUITE: &str = stringify!($name);

            #[test]
            fn device_and_transfers() {
                suite::run(
                    SUITE,
                    "device_and_transfers",
                    $open,
                    suite::memory::device_and_transfers,
                );
            }
            #[test]
            fn memory_stats() {
                suite::run_exclusive(SUITE, "memory_stats", $open, suite::memory::memory_stats);
            }
            #[test]
            fn fill() {
                suite::run(SUITE, "fill", $open, suite::creation::fill);
            }
            #[test]
            fn arange() {
                suite::run(SUITE, "arange", $open, suite::creation::arange);
            }
            #[test]
            fn random_uniform() {
                suite::run(SUITE, "random_uniform", $open, suite::random::random_uniform);
            }
            #[test]
            fn random_normal() {
                suite::run(SUITE, "random_normal", $open, suite::random::random_normal);
            }
            #[test]
            fn cast() {
                suite::run(SUITE, "cast", $open, suite::convert::cast);
            }
            #[test]
            fn copy() {
                suite::run(SUITE, "copy", $open, suite::convert::copy);
            }
            #[test]
            fn unary() {
                suite::run(SUITE, "unary", $open, suite::elementwise::unary);
            }
            #[test]
            fn unary_edges() {
                suite::run(SUITE, "unary_edges", $open, suite::unary_edges::unary_edges);
            }
            #[test]
            fn binary() {
                suite::run(SUITE, "binary", $open, suite::elementwise::binary);
            }
            #[test]
            fn integer_wrapping() {
                suite::run(
                    SUITE,
                    "integer_wrapping",
                    $open,
                    suite::elementwise::integer_wrapping,
                );
            }
            #[test]
            fn compare() {
                suite::run(SUITE, "compare", $open, suite::elementwise::compare);
            }
            #[test]
            fn where_select() {
                suite::run(SUITE, "where_select", $open, suite::elementwise::where_select);
            }
            #[test]
            fn reduce() {
                suite::run(SUITE, "reduce", $open, suite::reduce::reduce);
            }
            #[test]
            fn reduce_large() {
                suite::run(SUITE, "reduce_large", $open, suite::reduce::reduce_large);
            }
            #[test]
            fn softmax() {
                suite::run(SUITE, "softmax", $open, suite::reduce::softmax);
            }
            #[test]
            fn scan() {
                suite::run(SUITE, "scan", $open, suite::scan::scan);
            }
            #[test]
            fn sort() {
                suite::run(SUITE, "sort", $open, suite::sort::sort);
            }
            #[test]
            fn norm() {
                suite::run(SUITE, "norm", $open, suite::norm::norm);
            }
            #[test]
            fn cross_entropy() {
                suite::run(SUITE, "cross_entropy", $open, suite::cross_entropy::cross_entropy);
            }
            #[test]
            fn softmax_backward() {
                suite::run(
                    SUITE,
                    "softmax_backward",
                    $open,
                    suite::backward::softmax_backward,
                );
            }
            #[test]
            fn norm_backward() {
                suite::run(SUITE, "norm_backward", $open, suite::norm_backward::norm_backward);
            }
            #[test]
            fn norm_backward_params() {
                suite::run(
                    SUITE,
                    "norm_backward_params",
                    $open,
                    suite::norm_backward::norm_backward_params,
                );
            }
            #[test]
            fn gelu_backward() {
                suite::run(SUITE, "gelu_backward", $open, suite::backward::gelu_backward);
            }
            #[test]
            fn cross_entropy_backward() {
                suite::run(
                    SUITE,
                    "cross_entropy_backward",
                    $open,
                    suite::backward::cross_entropy_backward,
                );
            }
            #[test]
            fn optimizer_update() {
                suite::run(SUITE, "optimizer_update", $open, suite::update::update);
            }
            #[test]
            fn optimizer_update_many() {
                suite::run(
                    SUITE,
                    "optimizer_update_many",
                    $open,
                    suite::update_many::update_many,
                );
            }
            #[test]
            fn attention() {
                suite::run(SUITE, "attention", $open, suite::attention::attention);
            }
            #[test]
            fn attention_backward() {
                suite::run(
                    SUITE,
                    "attention_backward",
                    $open,
                    suite::attention_backward::attention_backward,
                );
            }
            #[test]
            fn linear() {
                suite::run(SUITE, "linear", $open, suite::linear::linear);
            }
            #[test]
            fn matmul() {
                suite::run(SUITE, "matmul", $open, suite::matmul::matmul);
            }
            #[test]
            fn gather() {
                suite::run(SUITE, "gather", $open, suite::index::gather);
            }
            #[test]
            fn index_select() {
                suite::run(SUITE, "index_select", $open, suite::index::index_select);
            }
            #[test]
            fn index_out_of_range() {
                suite::run(
                    SUITE,
                    "index_out_of_range",
                    $open,
                    suite::index::index_out_of_range,
                );
            }
            #[test]
            fn scatter() {
                suite::run(SUITE, "scatter", $open, suite::scatter::scatter);
            }
            #[test]
            fn layout_props() {
                suite::run(SUITE, "layout_props", $open, suite::layout_props::layout_props);
            }
            #[test]
            fn malformed_kernels() {
                suite::run(
                    SUITE,
                    "malformed_kernels",
                    $open,
                    suite::errors::malformed_kernels,
                );
            }
            #[test]
            fn conv2d() {
                suite::run(SUITE, "conv2d", $open, suite::conv::conv2d);
            }
            #[test]
            fn conv2d_backward() {
                suite::run(
                    SUITE,
                    "conv2d_backward",
                    $open,
                    suite::conv_backward::conv2d_backward,
                );
            }
            #[test]
            fn pool2d() {
                suite::run(SUITE, "pool2d", $open, suite::pool::pool2d);
            }
            #[test]
            fn pool2d_backward() {
                suite::run(SUITE, "pool2d_backward", $open, suite::pool::pool2d_backward);
            }
            #[test]
            fn malformed_model_kernels() {
                suite::run(
                    SUITE,
                    "malformed_model_kernels",
                    $open,
                    suite::errors_model::malformed_model_kernels,
                );
            }
        }
    };
}
