//! Structural checks of a [`Kernel`] before the cpu backend touches memory: operand shapes and
//! dtypes agree with what the variant promises, dimensions are in range, and every buffer is
//! aligned for its element type. Together with `Kernel::check_bounds` this makes a malformed
//! kernel an `Error`, never an out-of-bounds access or a panic.

use cartage_core::{DType, Error, Kernel, ReduceOp, Result, TensorArg};

/// Check everything `launch` relies on besides bounds and capabilities.
#[inline]
pub fn check(kernel: &Kernel) -> Result<()> {
    match kernel {
        Kernel::Fill { out, .. } => aligned("fill", out),
        Kernel::Arange { out, .. } => aligned("arange", out),
        Kernel::Random { out, .. } => aligned("rand", out),
        Kernel::Cast { input, out } => {
            same_shape("cast", input, out)?;
            aligned("cast", input)?;
            aligned("cast", out)
        }
        Kernel::Copy { input, out } => {
            same_shape("copy", input, out)?;
            same_dtype("copy", input, out)?;
            aligned("copy", input)?;
            aligned("copy", out)
        }
        Kernel::Unary { op, input, out } => {
            same_shape(op.name(), input, out)?;
            same_dtype(op.name(), input, out)?;
            aligned(op.name(), input)?;
            aligned(op.name(), out)
        }
        Kernel::Binary { op, lhs, rhs, out } => {
            let name = op.name();
            same_shape(name, lhs, out)?;
            same_shape(name, rhs, out)?;
            same_dtype(name, lhs, out)?;
            same_dtype(name, rhs, out)?;
            aligned(name, lhs)?;
            aligned(name, rhs)?;
            aligned(name, out)
        }
        Kernel::Compare { op, lhs, rhs, out } => {
            let name = op.name();
            same_shape(name, lhs, out)?;
            same_shape(name, rhs, out)?;
            same_dtype(name, lhs, rhs)?;
            dtype_is(name, out, DType::Bool, "a comparison writes a bool output")?;
            aligned(name, lhs)?;
            aligned(name, rhs)
        }
        Kernel::Where {
            cond,
            on_true,
            on_false,
            out,
        } => {
            for arg in [cond, on_true, on_false] {
                same_shape("where", arg, out)?;
                aligned("where", arg)?;
            }
            aligned("where", out)?;
            dtype_is("where", cond, DType::Bool, "the condition of `where` must be bool")?;
            same_dtype("where", on_true, out)?;
            same_dtype("where", on_false, out)
        }
        Kernel::Reduce { op, input, dims, out } => reduce(*op, input, dims, out),
        Kernel::Softmax { input, dim, out, .. } => {
            same_shape("softmax", input, out)?;
            same_dtype("softmax", input, out)?;
            dim_in_range("softmax", *dim, input.layout.rank())?;
            aligned("softmax", input)?;
            aligned("softmax", out)
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

/// Element-wise comparison of two short shapes (cheaper than a `memcmp` call for small ranks).
#[inline(always)]
fn shapes_equal(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[inline(always)]
fn same_shape(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if shapes_equal(a.layout.shape(), b.layout.shape()) {
        Ok(())
    } else {
        Err(shape_error(op, a, b))
    }
}

#[cold]
fn shape_error(op: &'static str, a: &TensorArg, b: &TensorArg) -> Error {
    mismatch(
        op,
        a,
        b,
        "the kernel's operands must have the output's shape (broadcast before launch)",
    )
}

#[inline(always)]
fn same_dtype(op: &'static str, a: &TensorArg, b: &TensorArg) -> Result<()> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(dtype_error(op, a, b))
    }
}

#[cold]
fn dtype_error(op: &'static str, a: &TensorArg, b: &TensorArg) -> Error {
    Error::invalid(
        op,
        format!(
            "operands of dtypes {} and {} in one kernel; they must match",
            a.dtype, b.dtype
        ),
    )
}

fn dtype_is(op: &'static str, arg: &TensorArg, dtype: DType, expected: &'static str) -> Result<()> {
    if arg.dtype == dtype {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype: arg.dtype,
            expected,
        })
    }
}

#[inline(always)]
fn aligned(op: &'static str, arg: &TensorArg) -> Result<()> {
    let size = arg.dtype.size_in_bytes() as u64;
    if arg.buffer.addr() & (size - 1) == 0 {
        Ok(())
    } else {
        Err(alignment_error(op, arg))
    }
}

#[cold]
fn alignment_error(op: &'static str, arg: &TensorArg) -> Error {
    Error::invalid(
        op,
        format!(
            "a {} buffer at byte offset {} is not aligned to its {}-byte elements",
            arg.dtype,
            arg.buffer.offset,
            arg.dtype.size_in_bytes()
        ),
    )
}

fn dim_in_range(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim < rank {
        Ok(())
    } else {
        Err(Error::DimOutOfRange {
            op,
            dim: dim as isize,
            rank,
        })
    }
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
    if out.layout.rank() != rank
        || (0..rank).any(|d| out.layout.shape()[d] != if dims.contains(&d) { 1 } else { input.layout.shape()[d] })
    {
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
    let reduced: usize = dims.iter().map(|&d| input.layout.shape()[d]).product();
    if reduced == 0
        && out.layout.numel() > 0
        && matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
    {
        return Err(Error::invalid(name, "the reduction of zero elements has no value"));
    }
    aligned(name, input)?;
    aligned(name, out)
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
    if !crate::strided::is_non_overlapping(o, out.layout.strides()) {
        return Err(Error::invalid("matmul", "the output's elements overlap in memory"));
    }
    if overlaps(out, lhs) || overlaps(out, rhs) {
        return Err(Error::invalid(
            "matmul",
            "the output shares memory with an operand; write into a new tensor",
        ));
    }
    aligned("matmul", lhs)?;
    aligned("matmul", rhs)?;
    aligned("matmul", out)
}

/// True when the memory the two views can touch intersects.
fn overlaps(a: &TensorArg, b: &TensorArg) -> bool {
    let span = |t: &TensorArg| {
        let size = t.dtype.size_in_bytes() as u64;
        let first = t.buffer.addr() + t.layout.offset() as u64 * size;
        let extent = t.layout.extent().saturating_sub(t.layout.offset()) as u64;
        (first, first + extent * size)
    };
    let ((a0, a1), (b0, b1)) = (span(a), span(b));
    a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
}

fn index_dtype(op: &'static str, index: &TensorArg) -> Result<()> {
    if index.dtype.is_index() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype: index.dtype,
            expected: "indices must be i32 or i64 (convert float indices with `.to_dtype(DType::I64)`)",
        })
    }
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
    for arg in [input, index, out] {
        aligned("gather", arg)?;
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
    for arg in [input, index, out] {
        aligned("index_select", arg)?;
    }
    Ok(())
}
