//! stub
use cartage_core::{Result, TensorArg};
use crate::backend::WgpuBackend;
/// Tiling.
#[derive(Clone, Copy, Debug)]
pub struct MatmulTiling;
pub(crate) fn matmul(backend: &WgpuBackend, lhs: &TensorArg, _rhs: &TensorArg, _out: &TensorArg) -> Result<()> {
    Err(cartage_core::Error::unsupported("matmul", lhs.dtype, cartage_core::Backend::device(backend), "todo"))
}
