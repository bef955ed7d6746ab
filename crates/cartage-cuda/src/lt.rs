//! The raw cuBLASLt calls: a handle, the descriptors of one product (operation, three matrix
//! layouts with batch strides, the epilogue), the heuristic's ranked candidate algorithms and
//! `cublasLtMatmul` on a stream. Everything that touches `cudarc::cublaslt::sys` lives here;
//! The `lt_route` module decides which product runs where.
//!
//! A [`LtPlan`] is built once per problem ([`LtProblem`]: sizes, layouts, dtype and precision,
//! epilogue, operand alignments) and cached by the caller, so the per-call cost is one
//! `cublasLtMatmul` (plus the bias pointer, set on the descriptor before each call).

use std::ffi::c_void;
use std::mem::{MaybeUninit, size_of};

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys::{
    self, cublasLtEpilogue_t, cublasLtMatmulDescAttributes_t as DescAttr, cublasLtMatmulHeuristicResult_t,
    cublasLtMatmulPreferenceAttributes_t as PrefAttr, cublasLtMatrixLayoutAttribute_t as LayoutAttr, cublasStatus_t,
};
use cudarc::driver::CudaStream;

use crate::blas::{Gemm, GemmKind};

/// What runs after the product, on the output (column-major rows are cartage's columns, so a
/// bias vector of the GEMM's `m` rows is a per-column bias of cartage's row-major output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Epilogue {
    /// The product only.
    None,
    /// `+ bias`.
    Bias,
    /// `max(·, 0)`, with or without the bias.
    Relu { bias: bool },
    /// The tanh-approximated GELU, with or without the bias.
    GeluTanh { bias: bool },
}

impl Epilogue {
    fn sys(self) -> cublasLtEpilogue_t {
        match self {
            Epilogue::None => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::Relu { bias: false } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Relu { bias: true } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::GeluTanh { bias: false } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            Epilogue::GeluTanh { bias: true } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        }
    }

    /// True when the epilogue reads a bias vector.
    pub(crate) fn has_bias(self) -> bool {
        matches!(
            self,
            Epilogue::Bias | Epilogue::Relu { bias: true } | Epilogue::GeluTanh { bias: true }
        )
    }
}

/// Everything a plan depends on: the GEMM's sizes, transposes, leading dimensions and batch
/// strides (not its addresses), the epilogue, and the alignment in bytes (capped at 256) of
/// each of A, B, C/D and the bias, since the heuristic excludes algorithms that need more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LtProblem {
    pub kind: GemmKind,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub transpose: [bool; 2],
    pub ld: [i32; 3],
    pub batch_stride: [i64; 3],
    pub batch: i32,
    pub epilogue: Epilogue,
    pub align: [u32; 3],
}

/// The largest power of two (at most 256) dividing `addr`.
pub(crate) fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        256
    } else {
        (1u64 << addr.trailing_zeros().min(8)) as u32
    }
}

impl LtProblem {
    /// The problem of `gemm` with `epilogue`.
    pub(crate) fn of(gemm: &Gemm, epilogue: Epilogue) -> Self {
        LtProblem {
            kind: gemm.kind,
            m: gemm.m,
            n: gemm.n,
            k: gemm.k,
            transpose: [gemm.a.transpose, gemm.b.transpose],
            ld: [gemm.a.ld, gemm.b.ld, gemm.ldc],
            batch_stride: [gemm.a.batch_stride, gemm.b.batch_stride, gemm.stride_c],
            batch: gemm.batch,
            epilogue,
            align: [alignment(gemm.a.addr), alignment(gemm.b.addr), alignment(gemm.c)],
        }
    }
}

/// A cuBLASLt handle (not for concurrent use: the backend locks it).
pub(crate) struct LtHandle(sys::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle may be used from any thread, one at a time; the backend keeps it
// behind a mutex.
unsafe impl Send for LtHandle {}

impl LtHandle {
    pub(crate) fn new() -> Result<Self, CublasError> {
        Ok(LtHandle(cudarc::cublaslt::result::create_handle()?))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create_handle` and is destroyed once, here.
        if let Err(e) = unsafe { cudarc::cublaslt::result::destroy_handle(self.0) } {
            tracing::error!(error = %e, "cublasLtDestroy failed");
        }
    }
}

/// A matrix layout descriptor, destroyed on drop.
struct MatrixLayout(sys::cublasLtMatrixLayout_t);

impl Drop for MatrixLayout {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatrixLayoutCreate`, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matrix_layout(self.0) };
    }
}

/// An operation descriptor, destroyed on drop.
struct OperationDesc(sys::cublasLtMatmulDesc_t);

impl Drop for OperationDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulDescCreate`, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matmul_desc(self.0) };
    }
}

/// A heuristic preference, destroyed on drop.
struct Preference(sys::cublasLtMatmulPreference_t);

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulPreferenceCreate`, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matmul_pref(self.0) };
    }
}

fn data_type(kind: GemmKind) -> sys::cudaDataType {
    match kind {
        GemmKind::F32 | GemmKind::F32Tf32 => sys::cudaDataType::CUDA_R_32F,
        GemmKind::F64 => sys::cudaDataType::CUDA_R_64F,
        GemmKind::F16 => sys::cudaDataType::CUDA_R_16F,
        GemmKind::BF16 => sys::cudaDataType::CUDA_R_16BF,
    }
}

fn compute_type(kind: GemmKind) -> (sys::cublasComputeType_t, sys::cudaDataType) {
    use sys::cublasComputeType_t as C;
    match kind {
        GemmKind::F32 | GemmKind::F16 | GemmKind::BF16 => (C::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F),
        GemmKind::F32Tf32 => (C::CUBLAS_COMPUTE_32F_FAST_TF32, sys::cudaDataType::CUDA_R_32F),
        GemmKind::F64 => (C::CUBLAS_COMPUTE_64F, sys::cudaDataType::CUDA_R_64F),
    }
}

fn matrix_layout(
    kind: GemmKind,
    rows: i32,
    cols: i32,
    ld: i32,
    batch: i32,
    stride: i64,
) -> Result<MatrixLayout, CublasError> {
    let layout = MatrixLayout(cudarc::cublaslt::result::create_matrix_layout(
        data_type(kind),
        rows as u64,
        cols as u64,
        ld as i64,
    )?);
    if batch > 1 {
        let handle = layout.0;
        let attr = |attr: LayoutAttr, value: *const c_void, size: usize| {
            // SAFETY: `handle` is the live layout above and `value` points to `size` bytes of
            // the attribute's type (i32 batch count, i64 stride).
            unsafe { cudarc::cublaslt::result::set_matrix_layout_attribute(handle, attr, value, size) }
        };
        attr(
            LayoutAttr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &batch as *const i32 as *const c_void,
            size_of::<i32>(),
        )?;
        attr(
            LayoutAttr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &stride as *const i64 as *const c_void,
            size_of::<i64>(),
        )?;
    }
    Ok(layout)
}

/// The descriptors of one problem and the heuristic's candidates, best first.
pub(crate) struct LtPlan {
    desc: OperationDesc,
    a: MatrixLayout,
    b: MatrixLayout,
    d: MatrixLayout,
    /// The heuristic's algorithms, best first (at least one).
    pub candidates: Vec<cublasLtMatmulHeuristicResult_t>,
}

// SAFETY: the descriptors are plain host objects of cuBLASLt, used by one thread at a time
// (the backend keeps plans behind its cuBLASLt mutex).
unsafe impl Send for LtPlan {}

/// `cublasOperation_t` as the descriptor stores it: `CUBLAS_OP_N` (0) or `CUBLAS_OP_T` (1).
fn op(transpose: bool) -> i32 {
    let op = if transpose {
        cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
    };
    op as i32
}

impl LtPlan {
    /// Describe `p` and ask the heuristic for up to `count` algorithms that fit in
    /// `max_workspace` bytes; `NOT_SUPPORTED` when it has none.
    pub(crate) fn new(
        handle: &LtHandle,
        p: &LtProblem,
        max_workspace: usize,
        count: usize,
    ) -> Result<Self, CublasError> {
        let (compute, scale) = compute_type(p.kind);
        let desc = OperationDesc(cudarc::cublaslt::result::create_matmul_desc(compute, scale)?);
        let d = desc.0;
        let desc_attr = |attr: DescAttr| {
            move |value: *const c_void, size: usize| {
                // SAFETY: `d` is the live descriptor above; callers pass the attribute's type.
                unsafe { cudarc::cublaslt::result::set_matmul_desc_attribute(d, attr, value, size) }
            }
        };
        // SAFETY: each setter is for a live descriptor and each value has its attribute's type
        // (i32 operations, u32 epilogue).
        unsafe {
            set_with(desc_attr(DescAttr::CUBLASLT_MATMUL_DESC_TRANSA), &op(p.transpose[0]))?;
            set_with(desc_attr(DescAttr::CUBLASLT_MATMUL_DESC_TRANSB), &op(p.transpose[1]))?;
            set_with(
                desc_attr(DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE),
                &(p.epilogue.sys() as u32),
            )?;
        }
        let (a_rows, a_cols) = if p.transpose[0] { (p.k, p.m) } else { (p.m, p.k) };
        let (b_rows, b_cols) = if p.transpose[1] { (p.n, p.k) } else { (p.k, p.n) };
        let a = matrix_layout(p.kind, a_rows, a_cols, p.ld[0], p.batch, p.batch_stride[0])?;
        let b = matrix_layout(p.kind, b_rows, b_cols, p.ld[1], p.batch, p.batch_stride[1])?;
        let dl = matrix_layout(p.kind, p.m, p.n, p.ld[2], p.batch, p.batch_stride[2])?;
        let pref = Preference(cudarc::cublaslt::result::create_matmul_pref()?);
        let pr = pref.0;
        let pref_attr = |attr: PrefAttr| {
            move |value: *const c_void, size: usize| {
                // SAFETY: `pr` is the live preference above; callers pass the attribute's type.
                unsafe { cudarc::cublaslt::result::set_matmul_pref_attribute(pr, attr, value, size) }
            }
        };
        // SAFETY: each setter is for the live preference and each value has its attribute's
        // type (usize workspace bytes, u32 alignments).
        unsafe {
            set_with(
                pref_attr(PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES),
                &max_workspace,
            )?;
            set_with(
                pref_attr(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES),
                &p.align[0],
            )?;
            set_with(
                pref_attr(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES),
                &p.align[1],
            )?;
            set_with(
                pref_attr(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES),
                &p.align[2],
            )?;
            set_with(
                pref_attr(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES),
                &p.align[2],
            )?;
        }
        let mut results = vec![MaybeUninit::<cublasLtMatmulHeuristicResult_t>::uninit(); count.max(1)];
        let mut returned = 0i32;
        // SAFETY: every descriptor is live; `results` holds `count` writable entries and
        // `returned` receives how many were written. C and D share one layout (beta is 0).
        unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                handle.0,
                desc.0,
                a.0,
                b.0,
                dl.0,
                dl.0,
                pref.0,
                results.len() as i32,
                results.as_mut_ptr() as *mut cublasLtMatmulHeuristicResult_t,
                &mut returned,
            )
        }
        .result()?;
        let candidates: Vec<_> = results[..returned.clamp(0, results.len() as i32) as usize]
            .iter()
            // SAFETY: the first `returned` entries were written by the call above.
            .map(|r| unsafe { r.assume_init() })
            .filter(|r| r.state == cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .collect();
        if candidates.is_empty() {
            return Err(CublasError(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
        }
        Ok(LtPlan {
            desc,
            a,
            b,
            d: dl,
            candidates,
        })
    }

    /// Queue `D = epilogue(op(A) · op(B))` with candidate `index` on `stream`.
    ///
    /// # Safety
    /// The addresses are device memory of the handle's context holding A, B and D for the
    /// plan's problem (D not read by queued work), `bias` (when the epilogue has one) holds the
    /// GEMM's `m` elements of the dtype, and `workspace` holds at least the candidate's
    /// `workspaceSize` bytes, all live until the queued work completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(
        &self,
        handle: &LtHandle,
        index: usize,
        gemm: &Gemm,
        bias: Option<u64>,
        workspace: u64,
        stream: &CudaStream,
    ) -> Result<(), CublasError> {
        let candidate = &self.candidates[index.min(self.candidates.len() - 1)];
        if let Some(bias) = bias {
            // SAFETY: the descriptor is live and the attribute is a device pointer.
            unsafe {
                cudarc::cublaslt::result::set_matmul_desc_attribute(
                    self.desc.0,
                    DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias as *const u64 as *const c_void,
                    size_of::<u64>(),
                )
            }?;
        }
        let (alpha64, beta64) = (1.0f64, 0.0f64);
        let (alpha32, beta32) = (1.0f32, 0.0f32);
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
        // SAFETY: the caller's contract covers every address and the workspace; alpha and beta
        // are host scalars of the scale type that outlive the call; C is D with beta 0.
        unsafe {
            cudarc::cublaslt::result::matmul(
                handle.0,
                self.desc.0,
                alpha,
                beta,
                gemm.a.addr as *const c_void,
                self.a.0,
                gemm.b.addr as *const c_void,
                self.b.0,
                gemm.c as *const c_void,
                self.d.0,
                gemm.c as *mut c_void,
                self.d.0,
                &candidate.algo,
                workspace as *mut c_void,
                candidate.workspaceSize,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
    }
}

/// Call an attribute setter with a plain value.
///
/// # Safety
/// `setter` sets an attribute of a live descriptor whose type is `T`.
unsafe fn set_with<T>(
    setter: impl Fn(*const c_void, usize) -> Result<(), CublasError>,
    value: &T,
) -> Result<(), CublasError> {
    setter(value as *const T as *const c_void, size_of::<T>())
}
