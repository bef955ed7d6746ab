//! Structural checks of a [`Kernel`] before any binding is made: operand shapes and dtypes
//! agree with what the variant promises, dimensions are in range, and every buffer offset is a
//! multiple of its element size. With `Kernel::check_bounds` this makes a malformed kernel an
//! `Error`, never a bad binding, a shader reading garbage, or a panic.

use cartage_core::{DType, Error, Kernel, ReduceOp, Result, TensorArg};

/// Check everything the kernels rely on besides bounds and capabilities.
pub(crate) fn check(kernel: &Kernel) -> Result<()> {
    for arg in kernel.operands() {
        aligned(arg)?;
    }
    match kernel {
        Kernel::Fill { .. } | Kernel::Arange { .. } | Kernel::Random { .. } => Ok(()),
        Kernel::Cast { input, out } => same_shape("cast", input, out),
        Kernel::Copy { input, out } => {
            same_shape("copy", input, out)?;
            same_dtype("copy", input, out)
        }
        Kernel::Unary { op, input, out } => {
            same_shape(op.name(), input, out)?;
            same_dtype(op.name(), input, out)
        }
        Kernel::Binary { op, lhs, rhs, out } => {
            for arg in [lhs, rhs] {
                same_shape(op.name(), arg, out)?;
                same_dtype(op.name(), arg, out)?;
            }
            Ok(())
        }
        Kernel::Compare { op, lhs, rhs, out } => {
            same_shape(op.name(), lhs, out)?;
            same_shape(op.name(), rhs, out)?;
            same_dtype(op.name(), lhs, rhs)?;
            dtype_is(op.name(), out, DType::Bool, "a comparison writes a bool output")
        }
        Kernel::Where {
            cond,
            on_true,
            on_false,
            out,
        } => {
            for arg in [cond, on_true, on_false] {
                same_shape("where", arg, out)?;
            }
            dtype_is("where", cond, DType::Bool, "the condition of `where` must be bool")?;
            same_dtype("where", on_true, out)?;
            same_dtype("where", on_false, out)
        }
        Kernel::Reduce { op, input, dims, out } => reduce(*op, input, dims, out),
        Kernel::Softmax { input, dim, out, .. } => {
            same_shape("softmax", input, out)?;
            same_dtype("softmax", input, out)?;
            dim_in_range("softmax", *dim, input.layout.rank())
        }
        Kernel::Matmul { lhs, rhs, out } => matmul(lhs, rhs, out),
        Kernel::Gather { input, index, dim, out } => gather(input, index, *dim, out),
        Kernel::IndexSelect { input, index, dim, out } => index_select(input, index, *dim, out),
    }
}

fn mismatch(op: &'static str, a: &TensorArg, b: &TensorArg, reason: impl Into<String>) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: a.layout.shape().to_vec(),
        rhs: b.layout.shape().to_vec(),
        reason: reason.into(),
    }
}

fn same_shape(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if a.layout.shape() == b.layout.shape() {
        return Ok(());
    }
    Err(mismatch(
        op,
        a,
        b,
        "a kernel's operands have the output's shape (broadcast before launch)",
    ))
}

fn same_dtype(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if a.dtype == b.dtype {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "operands of dtypes {} and {} in one kernel; they must match",
            a.dtype, b.dtype
        ),
    ))
}

fn dtype_is(op: &'static str, arg: &TensorArg, dtype: DType, expected: &'static str) -> Result<()> {
    if arg.dtype == dtype {
        return Ok(());
    }
    Err(Error::WrongDType {
        op,
        dtype: arg.dtype,
        expected,
    })
}

fn aligned(arg: &TensorArg) -> Result<()> {
    let size = arg.dtype.size_in_bytes();
    if arg.buffer.offset.is_multiple_of(size) {
        return Ok(());
    }
    Err(Error::invalid(
        "launch",
        format!(
            "a {} operand starts at byte {} of its segment, not a multiple of its {size}-byte elements",
            arg.dtype, arg.buffer.offset
        ),
    ))
}

fn dim_in_range(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim < rank {
        return Ok(());
    }
    Err(Error::DimOutOfRange {
        op,
        dim: dim as isize,
        rank,
    })
}

fn reduce(op: ReduceOp, input: &TensorArg, dims: &[usize], out: &TensorArg) -> Result<()> {
    let name = op.name();
    let rank = input.layout.rank();
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::invalid(
            name,
            format!("dims {dims:?} must be sorted and distinct"),
        ));
    }
    for &d in dims {
        dim_in_range(name, d, rank)?;
    }
    let shape = input.layout.shape();
    let expected: Vec<usize> = (0..rank)
        .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
        .collect();
    if out.layout.shape() != expected.as_slice() {
        return Err(mismatch(
            name,
            input,
            out,
            format!("the output keeps the input's rank with the reduced dims {dims:?} of size 1"),
        ));
    }
    if out.dtype != op.output_dtype(input.dtype) {
        return Err(Error::WrongDType {
            op: name,
            dtype: out.dtype,
            expected: "argmax/argmin write i64; the other reductions keep the input dtype",
        });
    }
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && dims.len() != 1 {
        return Err(Error::invalid(name, "argmax/argmin reduce exactly one dimension"));
    }
    let reduced: usize = dims.iter().map(|&d| shape[d]).product();
    if reduced == 0
        && out.layout.numel() > 0
        && matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
    {
        return Err(Error::invalid(name, "the reduction of zero elements has no value"));
    }
    Ok(())
}

fn matmul(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    let (l, r, o) = (lhs.layout.shape(), rhs.layout.shape(), out.layout.shape());
    if l.len() != 3 || r.len() != 3 || o.len() != 3 {
        return Err(mismatch(
            "matmul",
            lhs,
            rhs,
            "the matmul kernel takes rank-3 operands [B, M, K] × [B, K, N]",
        ));
    }
    if l[0] != r[0] || l[2] != r[1] || o != [l[0], l[1], r[2]] {
        return Err(mismatch(
            "matmul",
            lhs,
            rhs,
            format!("[B, M, K] × [B, K, N] → [B, M, N] does not hold with output {o:?}"),
        ));
    }
    same_dtype("matmul", lhs, rhs)?;
    same_dtype("matmul", lhs, out)?;
    if !out.layout.is_contiguous() {
        return Err(Error::invalid("matmul", "the matmul output must be contiguous"));
    }
    Ok(())
}

fn index_dtype(op: &'static str, index: &TensorArg) -> Result<()> {
    if index.dtype.is_index() {
        return Ok(());
    }
    Err(Error::WrongDType {
        op,
        dtype: index.dtype,
        expected: "indices must be i32 or i64 (integers, on every device); convert with `.to_dtype(DType::I64)`",
    })
}

fn gather(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    index_dtype("gather", index)?;
    let rank = input.layout.rank();
    dim_in_range("gather", dim, rank)?;
    same_dtype("gather", input, out)?;
    same_shape("gather", index, out)?;
    let (i, x) = (index.layout.shape(), input.layout.shape());
    if i.len() != rank || (0..rank).any(|d| d != dim && i[d] > x[d]) {
        return Err(mismatch(
            "gather",
            input,
            index,
            format!("the index must have the input's rank and fit inside it except along dim {dim}"),
        ));
    }
    Ok(())
}

fn index_select(input: &TensorArg, index: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    index_dtype("index_select", index)?;
    let rank = input.layout.rank();
    dim_in_range("index_select", dim, rank)?;
    same_dtype("index_select", input, out)?;
    if index.layout.rank() != 1 {
        return Err(mismatch(
            "index_select",
            input,
            index,
            "the index must be one-dimensional",
        ));
    }
    let mut expected = input.layout.shape().to_vec();
    expected[dim] = index.layout.shape()[0];
    if out.layout.shape() != expected.as_slice() {
        return Err(mismatch(
            "index_select",
            input,
            out,
            format!("the output must have shape {expected:?}"),
        ));
    }
    Ok(())
}
