//! stub
use cartage_core::{Result, TensorArg};
use crate::backend::WgpuBackend;
pub(crate) fn softmax(backend: &WgpuBackend, input: &TensorArg, _dim: usize, _log: bool, _out: &TensorArg) -> Result<()> {
    Err(cartage_core::Error::unsupported("softmax", input.dtype, cartage_core::Backend::device(backend), "todo"))
}
