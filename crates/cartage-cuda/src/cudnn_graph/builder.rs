//! [`GraphBuilder`]: the tensors and operations of one cuDNN operation graph, finalized on a
//! handle as an [`OpGraph`] that keeps every descriptor it was built from alive.
//!
//! Tensors are 4-D here (every graph cartage builds is), each with its dims, strides, data type,
//! unique id and byte alignment. Three kinds:
//! - real tensors ([`GraphBuilder::real`]): device memory bound at execution by their unique id;
//! - virtual tensors ([`GraphBuilder::virtual_tensor`]): intermediates that live only inside
//!   the fused engine; they get unique ids too (from the builder's own counter, above every real
//!   id), since cuDNN tells tensors apart by them;
//! - pass-by-value scalars ([`GraphBuilder::by_value`]): `[1, 1, 1, 1]` tensors whose value the
//!   variant pack passes as a host address at each execution.
//!
//! Operations: matmul (`A [b, h, m, k] · B [b, h, k, n] → C [b, h, m, n]`), pointwise (unary,
//! binary, or ternary for `BINARY_SELECT`, with the axis for `GEN_INDEX`), reduction (to the dims
//! of the output) and reshape (the same elements under other dims and strides, a transposition
//! here).

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendDescriptorType_t as D;

use super::descriptor::{Descriptor, Outcome};

/// Bytes every real and virtual tensor is said to be aligned to unless told otherwise (what the
/// fused engines need; real tensors pass their own).
pub(crate) const ALIGNMENT: i64 = 16;

/// One tensor of a graph under construction: its place in the builder and its dims and strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    index: usize,
    /// Its dims.
    pub(crate) dims: [i64; 4],
    /// Its strides, in elements.
    pub(crate) strides: [i64; 4],
}

/// A pointwise operation's inputs beyond `x`: none, `b`, or `b` and the selector `t`
/// (`BINARY_SELECT`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Inputs {
    /// A unary operation.
    Unary,
    /// A binary operation with second input `b`.
    Binary(Tensor),
    /// A ternary operation: `b` and the condition `t`.
    Ternary(Tensor, Tensor),
}

/// The descriptors of one graph being built.
pub(crate) struct GraphBuilder {
    /// Every descriptor made so far (tensors, operations and their sub-descriptors).
    kept: Vec<Descriptor>,
    /// The places in `kept` of the operations, in the order they were added.
    ops: Vec<usize>,
    /// The unique id the next virtual tensor gets.
    next_virtual: i64,
}

/// A finalized operation graph with every descriptor it was built from (kept alive with it).
pub(crate) struct OpGraph {
    /// The `OPERATIONGRAPH` descriptor (dropped first).
    pub(crate) graph: Descriptor,
    _kept: Vec<Descriptor>,
}

/// Dense row-major strides of `dims`.
pub(crate) fn dense_strides(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

impl GraphBuilder {
    /// An empty graph whose virtual tensors get unique ids from `first_virtual_uid` on (above
    /// every real tensor's id).
    pub(crate) fn new(first_virtual_uid: i64) -> Self {
        GraphBuilder {
            kept: Vec::new(),
            ops: Vec::new(),
            next_virtual: first_virtual_uid,
        }
    }

    fn keep(&mut self, d: Descriptor) -> usize {
        self.kept.push(d);
        self.kept.len() - 1
    }

    fn desc(&self, t: Tensor) -> &Descriptor {
        &self.kept[t.index]
    }

    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &mut self,
        dtype: sys::cudnnDataType_t,
        uid: i64,
        dims: [i64; 4],
        strides: [i64; 4],
        alignment: i64,
        is_virtual: bool,
        by_value: bool,
    ) -> Outcome<Tensor> {
        let t = tensor_descriptor(dtype, uid, dims, strides, alignment, is_virtual, by_value)?;
        Ok(Tensor {
            index: self.keep(t),
            dims,
            strides,
        })
    }

    /// A real (device memory) tensor bound to `uid` at execution.
    pub(crate) fn real(
        &mut self,
        dtype: sys::cudnnDataType_t,
        uid: i64,
        dims: [i64; 4],
        strides: [i64; 4],
        alignment: i64,
    ) -> Outcome<Tensor> {
        self.tensor(dtype, uid, dims, strides, alignment, false, false)
    }

    /// A virtual tensor of `dtype` (an intermediate of the fused engine).
    pub(crate) fn virtual_tensor(
        &mut self,
        dtype: sys::cudnnDataType_t,
        dims: [i64; 4],
        strides: [i64; 4],
    ) -> Outcome<Tensor> {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        self.tensor(dtype, uid, dims, strides, ALIGNMENT, true, false)
    }

    /// A pass-by-value scalar `[1, 1, 1, 1]` of `dtype` bound to `uid` (a host address) at
    /// execution.
    pub(crate) fn by_value(&mut self, dtype: sys::cudnnDataType_t, uid: i64) -> Outcome<Tensor> {
        self.tensor(dtype, uid, [1; 4], [1; 4], ALIGNMENT, false, true)
    }

    fn add_op(&mut self, op: Descriptor) {
        let index = self.keep(op);
        self.ops.push(index);
    }

    /// `c = a · b` (batched over the first two dims), computed in f32.
    pub(crate) fn matmul(&mut self, a: Tensor, b: Tensor, c: Tensor) -> Outcome<()> {
        let desc = Descriptor::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        desc.set_data_type(A::CUDNN_ATTR_MATMUL_COMP_TYPE, sys::cudnnDataType_t::CUDNN_DATA_FLOAT)?;
        desc.finalize()?;
        let op = Descriptor::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.desc(a)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.desc(b)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.desc(c)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&desc])?;
        op.finalize()?;
        self.keep(desc);
        self.add_op(op);
        Ok(())
    }

    /// `y = mode(x, inputs…)` in `compute` precision; `axis` for `GEN_INDEX` (the dim whose
    /// index is generated).
    pub(crate) fn pointwise(
        &mut self,
        mode: sys::cudnnPointwiseMode_t,
        compute: sys::cudnnDataType_t,
        x: Tensor,
        inputs: Inputs,
        y: Tensor,
        axis: Option<i64>,
    ) -> Outcome<()> {
        let desc = Descriptor::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        desc.set_pointwise_mode(A::CUDNN_ATTR_POINTWISE_MODE, mode)?;
        desc.set_data_type(A::CUDNN_ATTR_POINTWISE_MATH_PREC, compute)?;
        if let Some(axis) = axis {
            desc.set_i64s(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        desc.finalize()?;
        let op = Descriptor::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&desc])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.desc(x)])?;
        match inputs {
            Inputs::Unary => {}
            Inputs::Binary(b) => {
                op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.desc(b)])?;
            }
            Inputs::Ternary(b, t) => {
                op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.desc(b)])?;
                op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[self.desc(t)])?;
            }
        }
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.desc(y)])?;
        // Unit scaling of both inputs, said explicitly as cudnn-frontend does.
        op.set_f32(A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0)?;
        op.set_f32(A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0)?;
        op.finalize()?;
        self.keep(desc);
        self.add_op(op);
        Ok(())
    }

    /// `y = reduce(x)` over the dims where `y` has size 1 and `x` does not, in f32.
    pub(crate) fn reduction(&mut self, reduce: sys::cudnnReduceTensorOp_t, x: Tensor, y: Tensor) -> Outcome<()> {
        let desc = Descriptor::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        desc.set_reduction_op(A::CUDNN_ATTR_REDUCTION_OPERATOR, reduce)?;
        desc.set_data_type(
            A::CUDNN_ATTR_REDUCTION_COMP_TYPE,
            sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        )?;
        desc.finalize()?;
        let op = Descriptor::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.desc(x)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.desc(y)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&desc])?;
        op.finalize()?;
        self.keep(desc);
        self.add_op(op);
        Ok(())
    }

    /// `y` = the elements of `x` under `y`'s dims and strides.
    pub(crate) fn reshape(&mut self, x: Tensor, y: Tensor) -> Outcome<()> {
        let op = Descriptor::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.desc(x)])?;
        op.set_descriptors(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.desc(y)])?;
        op.finalize()?;
        self.add_op(op);
        Ok(())
    }

    /// The operation graph of every operation added, finalized on `handle`.
    pub(crate) fn finalize(self, handle: sys::cudnnHandle_t) -> Outcome<OpGraph> {
        let graph = Descriptor::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
        let ops: Vec<&Descriptor> = self.ops.iter().map(|&i| &self.kept[i]).collect();
        graph.set_descriptors(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
        graph.finalize()?;
        Ok(OpGraph {
            graph,
            _kept: self.kept,
        })
    }
}

/// One finalized tensor descriptor: its dtype, unique id, dims, strides and byte alignment,
/// virtual (an intermediate of the graph) or not, passed by value (a host scalar) or not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tensor_descriptor(
    dtype: sys::cudnnDataType_t,
    uid: i64,
    dims: [i64; 4],
    strides: [i64; 4],
    alignment: i64,
    is_virtual: bool,
    by_value: bool,
) -> Outcome<Descriptor> {
    let t = Descriptor::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set_data_type(A::CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?;
    t.set_i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims)?;
    t.set_i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &strides)?;
    t.set_i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[alignment])?;
    t.set_bool(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual)?;
    if by_value {
        t.set_bool(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
    }
    t.finalize()?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_strides_are_row_major() {
        assert_eq!(dense_strides([2, 3, 4, 5]), [60, 20, 5, 1]);
        assert_eq!(dense_strides([8, 1, 1024, 1]), [1024, 1024, 1, 1]);
    }
}
