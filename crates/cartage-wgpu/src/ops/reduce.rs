//! stub
use cartage_core::{Result, TensorArg};
use crate::backend::WgpuBackend;
pub(crate) fn reduce(backend: &WgpuBackend, op: cartage_core::ReduceOp, input: &TensorArg, _dims: &[usize], _out: &TensorArg) -> Result<()> {
    Err(cartage_core::Error::unsupported(op.name(), input.dtype, cartage_core::Backend::device(backend), "todo"))
}
