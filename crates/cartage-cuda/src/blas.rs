//! The raw cuBLAS call: one `cublasGemmEx` (or its strided-batched form) on the compute stream,
//! in cuBLAS's column-major terms. [`crate::matmul`] maps cartage's row-major strided operands
//! onto it.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::{self, cublasComputeType_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{CudaBlas, result};
use cudarc::driver::CudaStream;

/// Element type and arithmetic of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GemmKind {
    /// f32 in true f32 arithmetic.
    F32,
    /// f32 data, TF32 tensor-core products (`MatmulPrecision::High`).
    F32Tf32,
    /// f64.
    F64,
    /// f16 data, f32 accumulation.
    F16,
    /// bf16 data, f32 accumulation.
    BF16,
}

impl GemmKind {
    fn data_type(self) -> cudaDataType {
        match self {
            GemmKind::F32 | GemmKind::F32Tf32 => cudaDataType::CUDA_R_32F,
            GemmKind::F64 => cudaDataType::CUDA_R_64F,
            GemmKind::F16 => cudaDataType::CUDA_R_16F,
            GemmKind::BF16 => cudaDataType::CUDA_R_16BF,
        }
    }

    fn compute_type(self) -> cublasComputeType_t {
        match self {
            GemmKind::F32 | GemmKind::F16 | GemmKind::BF16 => cublasComputeType_t::CUBLAS_COMPUTE_32F,
            GemmKind::F32Tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            GemmKind::F64 => cublasComputeType_t::CUBLAS_COMPUTE_64F,
        }
    }
}

/// One operand in column-major terms: device address, transpose flag, leading dimension and
/// batch stride (elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasOperand {
    pub addr: u64,
    pub transpose: bool,
    pub ld: i32,
    pub batch_stride: i64,
}

/// `C[b] = op(A[b]) · op(B[b])` with `op(A)` m×k, `op(B)` k×n, C m×n (ld `ldc`, stride `stride_c`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub kind: GemmKind,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: BlasOperand,
    pub b: BlasOperand,
    pub c: u64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

/// A cuBLAS handle bound to the compute stream (not for concurrent use: the backend locks it).
pub(crate) struct Blas {
    handle: CudaBlas,
}

fn op(transpose: bool) -> cublasOperation_t {
    if transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

impl Blas {
    /// A handle whose work goes to `stream`.
    pub(crate) fn new(stream: Arc<CudaStream>) -> Result<Self, CublasError> {
        Ok(Blas {
            handle: CudaBlas::new(stream)?,
        })
    }

    /// Queue `gemm`.
    ///
    /// # Safety
    /// Every address is device memory of this handle's context holding the operand for the
    /// given sizes, leading dimensions and batch strides, and C is not read by queued work.
    pub(crate) unsafe fn gemm(&self, gemm: &Gemm) -> Result<(), CublasError> {
        let (alpha32, beta32) = (1.0f32, 0.0f32);
        let (alpha64, beta64) = (1.0f64, 0.0f64);
        let (alpha, beta) = if gemm.kind == GemmKind::F64 {
            (
                &alpha64 as *const f64 as *const c_void,
                &beta64 as *const f64 as *const c_void,
            )
        } else {
            (
                &alpha32 as *const f32 as *const c_void,
                &beta32 as *const f32 as *const c_void,
            )
        };
        let ty = gemm.kind.data_type();
        let handle = *self.handle.handle();
        let algo = sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        if gemm.batch == 1 {
            // SAFETY: the caller's contract covers the addresses and sizes; alpha/beta point to
            // host scalars of the compute type that outlive the call (host pointer mode).
            return unsafe {
                result::gemm_ex(
                    handle,
                    op(gemm.a.transpose),
                    op(gemm.b.transpose),
                    gemm.m,
                    gemm.n,
                    gemm.k,
                    alpha,
                    gemm.a.addr as *const c_void,
                    ty,
                    gemm.a.ld,
                    gemm.b.addr as *const c_void,
                    ty,
                    gemm.b.ld,
                    beta,
                    gemm.c as *mut c_void,
                    ty,
                    gemm.ldc,
                    gemm.kind.compute_type(),
                    algo,
                )
            };
        }
        // SAFETY: as above, for `batch` products at the given batch strides.
        unsafe {
            result::gemm_strided_batched_ex(
                handle,
                op(gemm.a.transpose),
                op(gemm.b.transpose),
                gemm.m,
                gemm.n,
                gemm.k,
                alpha,
                gemm.a.addr as *const c_void,
                ty,
                gemm.a.ld,
                gemm.a.batch_stride,
                gemm.b.addr as *const c_void,
                ty,
                gemm.b.ld,
                gemm.b.batch_stride,
                beta,
                gemm.c as *mut c_void,
                ty,
                gemm.ldc,
                gemm.stride_c,
                gemm.batch,
                gemm.kind.compute_type(),
                algo,
            )
        }
    }
}
