//! Running a [`MatmulShape`] on CUDA: the library and the search are set on the device's
//! backend for the measurement and restored after it; other devices have no such choice and
//! report it as unsupported (a skip line).

use cartage::bench::Bench;
use cartage::{DType, Device};

use super::super::cases::MatmulShape;
use super::{Failure, Outcome};

/// Measure `shape` on `device`.
pub fn run(shape: MatmulShape, dtype: DType, device: &Device, bench: &Bench) -> Result<Outcome, Failure> {
    #[cfg(feature = "cuda")]
    {
        let backend = cartage::backend(device)?;
        if let Some(cuda) = backend.as_any().downcast_ref::<cartage_cuda::CudaBackend>() {
            return on_cuda(cuda, shape, dtype, device, bench);
        }
    }
    let _ = (shape, dtype, bench);
    Err(Failure::Unsupported(format!(
        "{device} has no choice of matmul library (GemmEx against cuBLASLt is a CUDA A/B)"
    )))
}

#[cfg(feature = "cuda")]
fn on_cuda(
    cuda: &cartage_cuda::CudaBackend,
    shape: MatmulShape,
    dtype: DType,
    device: &Device,
    bench: &Bench,
) -> Result<Outcome, Failure> {
    use std::collections::BTreeMap;

    use cartage_cuda::MatmulLibrary;

    use super::super::cases::MatmulAlgo;
    use super::random;

    let a = random(&[shape.m, shape.k], dtype, 1, device)?;
    let b = random(&[shape.k, shape.n], dtype, 2, device)?;
    let (library, search) = match shape.algo {
        MatmulAlgo::GemmEx => (MatmulLibrary::GemmEx, false),
        MatmulAlgo::LtHeuristic => (MatmulLibrary::Lt, false),
        MatmulAlgo::LtSearch => (MatmulLibrary::Auto, true),
    };
    cuda.set_matmul_library(library);
    cartage::set_matmul_algo_search(device, search)?;
    let before = cuda.matmul_counters();
    let measured = bench.run_on(device, || a.matmul(&b).map(drop));
    let after = cuda.matmul_counters();
    cuda.set_matmul_library(MatmulLibrary::Auto);
    cartage::set_matmul_algo_search(device, false)?;
    let mut outcome = Outcome::from(measured?);
    let delta = |a: u64, b: u64| (a - b) as f64;
    outcome.counters = BTreeMap::from([
        ("searches".to_string(), delta(after.searches, before.searches)),
        ("lt_products".to_string(), delta(after.lt_products, before.lt_products)),
        (
            "gemm_ex_products".to_string(),
            delta(after.gemm_ex_products, before.gemm_ex_products),
        ),
        (
            "lt_fallbacks".to_string(),
            delta(after.lt_fallbacks, before.lt_fallbacks),
        ),
    ]);
    Ok(outcome)
}
