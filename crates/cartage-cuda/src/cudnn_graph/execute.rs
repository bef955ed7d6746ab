//! Running a finalized execution plan: a `VARIANT_PACK` that binds the graph's unique ids to
//! the operands' device addresses (host addresses for pass-by-value scalars), with the workspace, and `cudnnBackendExecute` on the handle
//! (queued on its stream, the backend's compute stream).

use std::ffi::c_void;

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendDescriptorType_t as D;

use super::descriptor::{Descriptor, Failure, Outcome, check};
use super::engines::ExecPlan;

/// Queue `plan` on `handle` with each non-virtual tensor of its graph bound: `uids[i]` to
/// `pointers[i]`, and `workspace` (null when the plan needs none).
///
/// # Safety
/// `uids` and `pointers` have one entry per non-virtual tensor of the plan's graph. A device
/// tensor's address holds an operand of the layout the graph describes (at least its byte
/// alignment), in live device memory that stays valid until the queued work has run; outputs
/// do not overlap inputs; a pass-by-value tensor's address is host memory holding its value,
/// valid for this call. `workspace` is null for a plan that needs none, else a live device
/// block of at least `plan.workspace` bytes, valid likewise; `handle` is the live handle the
/// plan was finalized on.
pub(crate) unsafe fn execute(
    handle: sys::cudnnHandle_t,
    plan: &ExecPlan,
    uids: &[i64],
    pointers: &[*mut c_void],
    workspace: *mut c_void,
) -> Outcome<()> {
    if uids.len() != pointers.len() {
        return Err(Failure::new(
            "cudnnBackendSetAttribute",
            format!(
                "{} unique ids for {} data pointers in a variant pack",
                uids.len(),
                pointers.len()
            ),
            sys::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM,
        ));
    }
    let pack = Descriptor::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set_i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    pack.set_pointers(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, pointers)?;
    pack.set_pointers(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &[workspace])?;
    pack.finalize()?;
    // SAFETY: a live handle, a finalized plan of it and a finalized variant pack whose pointers
    // satisfy this function's contract; cuDNN queues the work on the handle's stream and reads
    // the variant pack only during this call.
    let status = unsafe { sys::cudnnBackendExecute(handle, plan.plan.raw(), pack.raw()) };
    check(status, "cudnnBackendExecute", || {
        format!("graph engine {}", plan.engine.index)
    })
}
