//! Running a finalized execution plan: a `VARIANT_PACK` that binds the graph's unique ids to
//! the operands' device addresses, with the workspace, and `cudnnBackendExecute` on the handle
//! (queued on its stream, the backend's compute stream).

use std::ffi::c_void;

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendDescriptorType_t as D;

use super::conv_graph::{W_UID, X_UID, Y_UID};
use super::descriptor::{Descriptor, Outcome, check};
use super::engines::ExecPlan;

/// Queue `plan` on `handle` for the operands at device addresses `x`, `w`, `y` (in the roles
/// of the graph's tensors) with `workspace` (null when the plan needs none).
///
/// # Safety
/// The addresses hold operands of the layouts the plan's graph describes (at least their byte
/// alignment), in live device memory that stays valid until the queued work has run; the
/// pass's output does not overlap its inputs; `workspace` is null for a plan that needs none,
/// else a live device block of at least `plan.workspace` bytes, valid likewise; `handle` is the
/// live handle the plan was finalized on.
pub(crate) unsafe fn execute(
    handle: sys::cudnnHandle_t,
    plan: &ExecPlan,
    [x, w, y]: [*mut c_void; 3],
    workspace: *mut c_void,
) -> Outcome<()> {
    let pack = Descriptor::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set_i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &[X_UID, W_UID, Y_UID])?;
    pack.set_pointers(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, &[x, w, y])?;
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
