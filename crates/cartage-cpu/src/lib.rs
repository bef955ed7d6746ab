//! The cpu backend of cartage: [`CpuBackend`], the host processor as a device.
//!
//! - Memory: 64-byte aligned host allocations ([`memory::HostSegments`]) under core's caching
//!   allocator; `SegmentHandle.addr` is the host pointer.
//! - Kernels: every `Kernel` variant for every dtype it is defined for. Strided and broadcast
//!   operands are read in place (never a hidden contiguous copy), with tight loops when every
//!   operand is contiguous. Work of at least a million elements goes to rayon; anything smaller
//!   stays on the calling thread, so a tiny op costs tens of nanoseconds.
//! - f32 `exp` (and what is built on it: sigmoid, silu, tanh, softmax) is a branch-free polynomial
//!   within 2 ulp; dense element-wise and row kernels run compiled for AVX-512 or AVX2+FMA when
//!   the processor has them.
//! - Reductions fold in a fixed tree, bit-identical run to run whatever the thread count.
//! - Matmul through the `gemm` crate, chosen by measurement (see [`matmul`]).
//! - Fused 2-D max and average pooling and their input gradients (a gather per input position,
//!   deterministic), and the fused linear layer (its matmul and one in-place pass for the bias
//!   and activation); convolution and attention are composed by the frontend.
//!
//! Entry points for the frontend: [`device_count`] and [`open`].

use std::sync::{Arc, OnceLock};

use cartage_core::{Backend, Device, Error, Result};

mod argreduce;
pub mod backend;
mod backward_rows;
mod cast;
mod cross_entropy;
mod cross_entropy_backward;
mod dispatch;
mod elem;
mod elementwise;
mod fast_math;
mod gelu_backward;
mod host_copy;
mod index;
mod linear;
mod map;
pub mod matmul;
pub mod memory;
mod norm;
mod norm_backward;
mod pool;
mod reduce;
mod reduce_outer;
mod rows;
mod scan;
mod scatter;
mod softmax;
mod sort;
mod strided;
mod tiny_matmul;
mod unary;
mod update;
mod update_many;

#[cfg(test)]
mod tests;

pub use backend::CpuBackend;

/// The number of cpu devices: always 1.
pub fn device_count() -> Result<usize> {
    Ok(1)
}

/// The process's cpu backend (ordinal 0; the same `Arc` on every call).
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>> {
    static BACKEND: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    if ordinal != 0 {
        return Err(Error::BackendUnavailable {
            device: Device::cpu(),
            reason: format!("the cpu backend has one device, ordinal 0; ordinal {ordinal} was asked for"),
        });
    }
    Ok(BACKEND.get_or_init(|| Arc::new(CpuBackend::new())).clone())
}
