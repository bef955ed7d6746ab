//! Helpers shared by the attention tests: the lock that runs a binary's tests one at a time,
//! the relative error they judge by, operands with interleaved heads, and `cuda:0` with cuDNN
//! and a guard that puts the backend's attention and convolution switches back.

use std::sync::{Arc, Mutex, MutexGuard};

use cartage_core::{Backend, DType, DeviceBuffer, Layout, Op, TensorArg};
use cartage_cuda::{AttentionApi, CudaBackend};

/// A lock held by each test of a binary whose tests must not overlap: they flip the backend's
/// switches, or read the device's peak allocated memory, which a test beside them would move.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The largest difference relative to the largest reference magnitude (at least `floor`); a
/// non-finite element counts as infinitely far.
pub fn relative_worst(what: &str, got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: element counts differ");
    let scale = want.iter().fold(floor, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_finite() {
                (g - w).abs() / scale
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// The logical `[B, N, D]` values of a buffer laid out as `[N, B, D]` (interleaved heads).
pub fn deinterleave(raw: &[f64], b: usize, n: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; raw.len()];
    for bi in 0..b {
        for i in 0..n {
            out[(bi * n + i) * d..][..d].copy_from_slice(&raw[(i * b + bi) * d..][..d]);
        }
    }
    out
}

/// The operand `[B, N, D]` over `buf`: dense, or with interleaved heads (a `[N, B, D]` buffer).
pub fn operand(buf: &DeviceBuffer, [b, n, d]: [usize; 3], heads: bool, dtype: DType) -> TensorArg {
    let layout = if heads {
        Layout::from_parts(&[b, n, d], &[d, b * d, 1], 0).expect("layout")
    } else {
        Layout::contiguous(&[b, n, d]).expect("layout")
    };
    buf.arg(layout, dtype)
}

/// `cuda:0` and its CUDA backend, or `None` after a SKIP line (no device, or no cuDNN: the
/// backend lists `conv2d` exactly where cuDNN loads).
pub fn cudnn_backend(test: &str) -> Option<(Arc<dyn Backend>, Arc<CudaBackend>)> {
    let b = super::backend(test)?;
    if !b.capabilities().supports(Op::Conv2d, DType::F32) {
        eprintln!("SKIP cuda/{test}: cuDNN 9 not found on cuda:0 (conv2d is not listed)");
        return None;
    }
    let cuda = cartage_cuda::open_cuda(0).expect("cuda:0 opened above");
    Some((b, cuda))
}

/// The backend's attention implementation and convolution search switches, put back on drop.
pub struct Restore(Arc<CudaBackend>, AttentionApi, bool);

impl Restore {
    /// Remember `cuda`'s switches as they are now.
    pub fn new(cuda: &Arc<CudaBackend>) -> Self {
        Restore(cuda.clone(), cuda.attention_api(), cuda.conv_benchmark())
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.0.set_attention_api(self.1);
        self.0.set_conv_benchmark(self.2);
    }
}
