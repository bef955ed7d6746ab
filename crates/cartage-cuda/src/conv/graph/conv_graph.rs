//! The operation graph of one convolution pass: three tensors (`x` [N, C, H, W], `w`
//! [O, C/g, kh, kw], `y` [N, O, OH, OW], each with its strides, unique id and byte alignment),
//! the convolution descriptor (2 spatial dims, cross-correlation, f32 compute) and the pass's
//! operation (forward, backward data or backward filter, alpha 1 and beta 0), finalized as an
//! `OPERATIONGRAPH` on the handle.
//!
//! Dims are always in N, C, H, W order; the strides say the memory layout, so NCHW data and a
//! channels-last (NHWC-backed) view are both described as they lie. Groups are not an attribute
//! of the graph API: cuDNN infers them from `x`'s channels over `w`'s second dim.

use std::ffi::c_int;

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendDescriptorType_t as D;

use crate::conv::ConvPass;
use crate::conv::plan::{PlanKey, data_type};
use crate::cudnn_graph::builder::dense_strides;
use crate::cudnn_graph::descriptor::{Descriptor, Failure, Outcome};

/// The unique id of the forward input (the input gradient for backward data).
pub(crate) const X_UID: i64 = 1;
/// The unique id of the filter (its gradient for backward filter).
pub(crate) const W_UID: i64 = 2;
/// The unique id of the forward output (the output gradient for the backward passes).
pub(crate) const Y_UID: i64 = 3;
/// The unique ids in the order of the operands `(x, w, y)`.
pub(crate) const UIDS: [i64; 3] = [X_UID, W_UID, Y_UID];

/// A finalized operation graph with every descriptor it was built from (kept alive with it).
pub(crate) struct OpGraph {
    /// The `OPERATIONGRAPH` descriptor (dropped first).
    pub(crate) graph: Descriptor,
    _op: Descriptor,
    _conv: Descriptor,
    _tensors: [Descriptor; 3],
}

/// The output size of one spatial dim, as core validated it.
fn out_size(size: c_int, k: c_int, p: c_int, s: c_int, d: c_int) -> i64 {
    ((size + 2 * p - d * (k - 1) - 1) / s + 1) as i64
}

/// The dims of `y` for `key`.
pub(crate) fn y_dims(key: &PlanKey) -> [i64; 4] {
    let [ph, pw, sh, sw, dh, dw] = key.window;
    [
        key.x_dims[0] as i64,
        key.w_dims[0] as i64,
        out_size(key.x_dims[2], key.w_dims[2], ph, sh, dh),
        out_size(key.x_dims[3], key.w_dims[3], pw, sw, dw),
    ]
}

/// One non-virtual tensor descriptor.
fn tensor(
    dtype: sys::cudnnDataType_t,
    uid: i64,
    dims: [i64; 4],
    strides: [i64; 4],
    alignment: i64,
) -> Outcome<Descriptor> {
    crate::cudnn_graph::builder::tensor_descriptor(dtype, uid, dims, strides, alignment, false, false)
}

/// The attribute names of one pass's operation: (descriptor type, alpha, beta, conv, x, w, y).
fn op_attributes(pass: ConvPass) -> (D, A, A, A, A, A, A) {
    match pass {
        ConvPass::Forward => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
        ),
        ConvPass::BackwardData => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
        ),
        ConvPass::BackwardFilter => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
        ),
    }
}

/// Build and finalize the operation graph of `key`'s pass on `handle`, with the operands'
/// byte alignments `[x, w, y]`.
pub(crate) fn build(handle: sys::cudnnHandle_t, key: &PlanKey, alignment: [i64; 3]) -> Outcome<OpGraph> {
    let (storage, compute) = data_type(key.dtype).ok_or_else(|| Failure {
        call: "cudnnBackendSetAttribute",
        what: format!("{} is not a float type cuDNN convolves", key.dtype),
        status: sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
    })?;
    let four = |v: [c_int; 4]| v.map(i64::from);
    let w_dims = four(key.w_dims);
    let x = tensor(storage, X_UID, four(key.x_dims), four(key.x_strides), alignment[0])?;
    let w = tensor(storage, W_UID, w_dims, dense_strides(w_dims), alignment[1])?;
    let y = tensor(storage, Y_UID, y_dims(key), four(key.y_strides), alignment[2])?;

    let [ph, pw, sh, sw, dh, dw] = key.window.map(i64::from);
    let conv = Descriptor::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set_data_type(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, compute)?;
    conv.set_conv_mode(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
    )?;
    conv.set_i64s(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    conv.set_i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &[ph, pw])?;
    conv.set_i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &[ph, pw])?;
    conv.set_i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &[sh, sw])?;
    conv.set_i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &[dh, dw])?;
    conv.finalize()?;

    let (kind, alpha, beta, conv_attr, x_attr, w_attr, y_attr) = op_attributes(key.pass);
    let op = Descriptor::new(kind)?;
    // Half, bf16 and float data all take float scaling factors.
    op.set_f32(alpha, 1.0)?;
    op.set_f32(beta, 0.0)?;
    op.set_descriptors(conv_attr, &[&conv])?;
    op.set_descriptors(x_attr, &[&x])?;
    op.set_descriptors(w_attr, &[&w])?;
    op.set_descriptors(y_attr, &[&y])?;
    op.finalize()?;

    let graph = Descriptor::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    graph.set_descriptors(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    graph.finalize()?;
    Ok(OpGraph {
        graph,
        _op: op,
        _conv: conv,
        _tensors: [x, w, y],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_dims_follow_the_window() {
        let key = PlanKey {
            pass: ConvPass::Forward,
            dtype: cartage_core::DType::BF16,
            math: 1,
            x_dims: [32, 64, 56, 56],
            x_strides: [200704, 3136, 56, 1],
            w_dims: [64, 64, 3, 3],
            y_strides: [200704, 3136, 56, 1],
            window: [1, 1, 1, 1, 1, 1],
            groups: 1,
            benchmark: true,
        };
        assert_eq!(y_dims(&key), [32, 64, 56, 56]);
        let strided = PlanKey {
            window: [1, 1, 2, 2, 1, 1],
            ..key.clone()
        };
        assert_eq!(y_dims(&strided), [32, 64, 28, 28]);
        let dilated = PlanKey {
            window: [2, 2, 1, 1, 2, 2],
            ..key
        };
        assert_eq!(y_dims(&dilated), [32, 64, 56, 56]);
        assert_eq!(dense_strides([64, 64, 3, 3]), [576, 9, 3, 1]);
    }
}
