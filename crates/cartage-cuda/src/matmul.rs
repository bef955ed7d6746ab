//! Matmul through cuBLAS: row-major strided operands mapped onto column-major GEMM without copies
//! wherever BLAS can address them, run by cuBLASLt or `cublasGemmEx` (the `lt_route` module says
//! which, per shape).
//!
//! cartage computes `out[b] = lhs[b] · rhs[b]` with `lhs` [B, M, K], `rhs` [B, K, N], `out`
//! [B, M, N] contiguous. Read column-major, a contiguous row-major `out` is `outᵀ` (N × M, ld N),
//! so cuBLAS is asked for `outᵀ = rhsᵀ · lhsᵀ`. A row-major matrix [R, C] with strides (sr, sc)
//! is, column-major, its transpose with ld `sr` when `sc == 1`, or itself with ld `sc` when
//! `sr == 1` (a transposed view): either way no copy. Other layouts (both strides > 1) are copied
//! to a contiguous scratch first, and that copy is logged with its size. A batch stride of 0
//! (broadcast) is passed to cuBLAS as is.
//!
//! f32 uses true f32 arithmetic unless the device's precision is `High` (TF32, R32); f16 and
//! bf16 accumulate in f32; f64 in f64.
//!
//! Shapes, dtypes, alignment and a contiguous, non-overlapping output are core's
//! [`cartage_core::Kernel::validate`]; this module checks only cuBLAS's limits: 32-bit sizes,
//! leading dimensions and batch counts, and float dtypes.

use cartage_core::raw::Allocation;
use cartage_core::{Backend, DType, Error, Layout, MatmulPrecision, Result, TensorArg};

use crate::backend::CudaBackend;
use crate::blas::{BlasOperand, Gemm, GemmKind};
use crate::launch::{device_ptr, launch};
use crate::lt::Epilogue;

/// How a [R, C] matrix with strides (sr, sc) is seen by BLAS, or `None` when it must be copied.
/// Returns (transpose flag in the `rhsᵀ · lhsᵀ` formulation, leading dimension).
pub fn blas_view(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> Option<(bool, usize)> {
    // Size-1 dimensions can take any stride: pick the one that makes the view valid.
    let sc = if cols == 1 { 1 } else { col_stride };
    let sr = if rows == 1 { cols.max(1) } else { row_stride };
    if sc == 1 && sr >= cols.max(1) {
        Some((false, sr))
    } else if sr == 1 && sc >= rows.max(1) {
        Some((true, sc))
    } else {
        None
    }
}

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::invalid(
            "matmul",
            format!("{what} = {v} is beyond cuBLAS's 32-bit limit; split the product"),
        )
    })
}

/// An operand ready for BLAS, keeping a scratch copy alive when one was needed.
struct Prepared {
    operand: BlasOperand,
    scratch: Option<Allocation>,
}

/// # Safety
/// `arg` is a validated operand in a live block of `backend`.
unsafe fn prepare(backend: &CudaBackend, arg: &TensorArg) -> Result<Prepared> {
    let (shape, strides) = (arg.layout.shape(), arg.layout.strides());
    let (batch, rows, cols) = (shape[0], shape[1], shape[2]);
    let batch_stride = if batch == 1 { 0 } else { strides[0] };
    if let Some((transpose, ld)) = blas_view(rows, cols, strides[1], strides[2]) {
        return Ok(Prepared {
            operand: BlasOperand {
                addr: device_ptr(arg),
                transpose,
                ld: to_i32("leading dimension", ld)?,
                batch_stride: batch_stride as i64,
            },
            scratch: None,
        });
    }
    let bytes = arg.layout.numel() * arg.dtype.size_in_bytes();
    tracing::debug!(
        device = %backend.device,
        bytes,
        shape = ?shape,
        strides = ?strides,
        "matmul: operand strides are not BLAS-compatible; copying it to a contiguous scratch"
    );
    let ld = to_i32("leading dimension", cols.max(1))?;
    let layout = Layout::contiguous(shape)?;
    let scratch = backend.allocator.alloc(bytes)?;
    let copy = cartage_core::Kernel::Copy {
        input: arg.clone(),
        out: TensorArg {
            buffer: scratch.slice(),
            layout,
            dtype: arg.dtype,
        },
    };
    // SAFETY: `arg` is a validated operand in a live block (this function's contract) and the
    // scratch a fresh dense block of its shape and dtype, apart from it.
    if let Err(e) = unsafe { launch(backend, &copy) } {
        backend.allocator.free(scratch);
        return Err(e);
    }
    Ok(Prepared {
        operand: BlasOperand {
            addr: scratch.slice().addr(),
            transpose: false,
            ld,
            batch_stride: (rows * cols) as i64,
        },
        scratch: Some(scratch),
    })
}

/// A product mapped onto one GEMM, with the scratch copies it reads (returned in stream order
/// by [`Product::release`] once the GEMM is queued).
pub(crate) struct Product {
    /// The GEMM in cuBLAS's column-major terms.
    pub gemm: Gemm,
    scratch: Vec<Allocation>,
}

impl Product {
    /// Every scratch block, for stream ordering.
    pub(crate) fn scratch_slices(&self) -> impl Iterator<Item = cartage_core::raw::BufferSlice> + '_ {
        self.scratch.iter().map(|s| s.slice())
    }

    /// Return the scratch copies: later users are queued after the product.
    pub(crate) fn release(self, backend: &CudaBackend) {
        for scratch in self.scratch {
            backend.allocator.free(scratch);
        }
    }
}

/// The GEMM kind of `dtype` under the device's precision.
pub(crate) fn gemm_kind(backend: &CudaBackend, dtype: DType, op: &'static str) -> Result<GemmKind> {
    match (dtype, backend.matmul_precision()) {
        (DType::F32, MatmulPrecision::Highest) => Ok(GemmKind::F32),
        (DType::F32, MatmulPrecision::High) => Ok(GemmKind::F32Tf32),
        (DType::F64, _) => Ok(GemmKind::F64),
        (DType::F16, _) => Ok(GemmKind::F16),
        (DType::BF16, _) => Ok(GemmKind::BF16),
        (dtype, _) => Err(Error::unsupported(op, dtype, backend.device, "matmul is float-only")),
    }
}

/// Map `out[b] = lhs[b] · rhs[b]` (`lhs` [B, M, K], `rhs` [B, K, N], `out` dense [B, M, N], every
/// size above 0) onto one GEMM, copying an operand to a scratch block only where BLAS cannot
/// address its strides.
///
/// # Safety
/// Validated operands in live blocks of `backend`, freed only in stream order afterwards.
pub(crate) unsafe fn product(
    backend: &CudaBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
) -> Result<Product> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    let kind = gemm_kind(backend, out.dtype, "matmul")?;
    // cuBLAS takes 32-bit sizes: checked before any scratch memory is taken.
    let (m32, n32, k32, batch32) = (
        to_i32("M", m)?,
        to_i32("N", n)?,
        to_i32("K", k)?,
        to_i32("batch", batch)?,
    );
    // SAFETY: validated operands in live blocks (this function's contract).
    let a = unsafe { prepare(backend, rhs) }?;
    // SAFETY: as above.
    let b = match unsafe { prepare(backend, lhs) } {
        Ok(b) => b,
        Err(e) => {
            if let Some(s) = a.scratch {
                backend.allocator.free(s);
            }
            return Err(e);
        }
    };
    let gemm = Gemm {
        kind,
        m: n32,
        n: m32,
        k: k32,
        a: a.operand,
        b: b.operand,
        c: device_ptr(out),
        ldc: n32,
        stride_c: (m * n) as i64,
        batch: batch32,
    };
    Ok(Product {
        gemm,
        scratch: [a.scratch, b.scratch].into_iter().flatten().collect(),
    })
}

/// Run Kernel::Matmul.
///
/// # Safety
/// The kernel passed [`cartage_core::Kernel::validate`] and every operand lies in a live block of
/// `backend`, freed only in stream order afterwards.
pub(crate) unsafe fn matmul(backend: &CudaBackend, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        gemm_kind(backend, out.dtype, "matmul")?;
        let zero = cartage_core::Kernel::Fill {
            out: out.clone(),
            value: cartage_core::Scalar::Float(0.0),
        };
        // SAFETY: `out` is a validated operand in a live block (this function's contract).
        return unsafe { launch(backend, &zero) };
    }
    // SAFETY: validated operands in live blocks (this function's contract).
    let product = unsafe { product(backend, lhs, rhs, out) }?;
    let mut slices = vec![lhs.buffer, rhs.buffer, out.buffer];
    slices.extend(product.scratch_slices());
    let outcome = backend
        .bind()
        .and_then(|()| backend.order.before_compute(&backend.compute, &slices))
        .and_then(|()| {
            // SAFETY: every address is a live block of this device: `lhs`/`rhs` within their
            // validated buffers under the strides `blas_view` accepted (or a dense scratch
            // copy), `out` dense [B, M, N]; ordered on the compute stream above.
            unsafe { crate::lt_route::queue(backend, &product.gemm, Epilogue::None, None) }.map(drop)
        });
    product.release(backend);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_map_without_copies() {
        // Row-major [4, 3]: ld 3, no transpose.
        assert_eq!(blas_view(4, 3, 3, 1), Some((false, 3)));
        // Its transpose view [3, 4] with strides (1, 3): transpose flag, ld 3.
        assert_eq!(blas_view(3, 4, 1, 3), Some((true, 3)));
        // A narrowed row-major view keeps the parent's ld.
        assert_eq!(blas_view(4, 2, 3, 1), Some((false, 3)));
        // Vectors take whichever stride works.
        assert_eq!(blas_view(1, 5, 99, 1), Some((false, 5)));
        assert_eq!(blas_view(5, 1, 7, 42), Some((false, 7)));
        // Both strides above one: needs a copy.
        assert_eq!(blas_view(4, 3, 6, 2), None);
        // Overlapping rows (ld smaller than the row) are not BLAS-addressable either.
        assert_eq!(blas_view(4, 3, 2, 1), None);
    }
}
