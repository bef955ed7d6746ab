//! `Kernel::Linear` on CUDA: `act(input · weightᵀ + bias)` as one cuBLASLt matmul with its
//! epilogue — `BIAS`, `RELU(_BIAS)` or `GELU(_BIAS)` (cuBLASLt's GELU is the tanh approximation,
//! [`Epilogue::GeluTanh`]). The exact GELU runs the bias epilogue, then the GELU kernel in
//! place; with neither a bias nor a fusable activation, it is the plain matmul kernel. Where the product runs on GemmEx instead (cuBLASLt refused the problem) or `K = 0`,
//! the bias and activation follow as in-place element-wise kernels; the tanh GELU has no
//! standalone kernel, so a `K = 0` product with it runs as the epilogue of a `K = 1` product of
//! zeros, and only where cuBLASLt refuses even that is it `Unsupported` (the frontend composes).

use cartage_core::{BinaryOp, Epilogue, Error, Kernel, Layout, Result, Scalar, TensorArg, UnaryOp};

use crate::backend::CudaBackend;
use crate::launch::{device_ptr, launch};
use crate::lt::Epilogue as LtEpilogue;
use crate::matmul::{gemm_kind, product};

/// The cuBLASLt epilogue that fuses what it can of `activation` and the bias.
fn epilogue(activation: Epilogue, bias: bool) -> LtEpilogue {
    match activation {
        Epilogue::Relu => LtEpilogue::Relu { bias },
        Epilogue::GeluTanh => LtEpilogue::GeluTanh { bias },
        Epilogue::Identity | Epilogue::Gelu if bias => LtEpilogue::Bias,
        Epilogue::Identity | Epilogue::Gelu => LtEpilogue::None,
    }
}

/// Run Kernel::Linear.
///
/// # Safety
/// The kernel passed [`cartage_core::Kernel::validate`] and every operand lies in a live block of
/// `backend`, freed only in stream order afterwards.
pub(crate) unsafe fn linear(
    backend: &CudaBackend,
    input: &TensorArg,
    weight: &TensorArg,
    bias: Option<&TensorArg>,
    activation: Epilogue,
    out: &TensorArg,
) -> Result<()> {
    let (m, k, n) = (
        input.layout.shape()[0],
        input.layout.shape()[1],
        weight.layout.shape()[0],
    );
    gemm_kind(backend, out.dtype, "linear")?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 && activation == Epilogue::GeluTanh {
        // The tanh GELU has no standalone kernel: run it as cuBLASLt's epilogue of a K = 1
        // product of zeros, which leaves exactly `gelu_tanh(bias)` (or 0) in every row.
        let size = out.dtype.size_in_bytes();
        let block = backend.allocator.alloc((m + n) * size)?;
        let zeros = |rows: usize, offset: usize| -> Result<TensorArg> {
            Ok(TensorArg {
                buffer: block.slice(),
                layout: Layout::from_parts(&[rows, 1], &[1, 1], offset)?,
                dtype: out.dtype,
            })
        };
        let outcome = (|| {
            let fill = Kernel::Fill {
                out: zeros(m + n, 0)?,
                value: Scalar::Float(0.0),
            };
            // SAFETY: a fresh dense block of m + n elements of this device.
            unsafe { launch(backend, &fill) }?;
            // SAFETY: the zero operands lie in that live block; the others are this call's.
            unsafe { linear(backend, &zeros(m, 0)?, &zeros(n, m)?, bias, activation, out) }
        })();
        // Safe to reuse at once: later users of the block are queued after these launches.
        backend.allocator.free(block);
        return outcome;
    }
    if bias.is_none() && matches!(activation, Epilogue::Identity | Epilogue::Gelu) {
        // Nothing for cuBLASLt to fuse: the plain matmul (its own routing), then the GELU in
        // place.
        let batch = |arg: &TensorArg, layout: Result<Layout>| -> Result<TensorArg> {
            Ok(TensorArg {
                layout: layout?,
                ..arg.clone()
            })
        };
        let product = Kernel::Matmul {
            lhs: batch(input, input.layout.unsqueeze(0))?,
            rhs: batch(weight, weight.layout.transpose(0, 1).and_then(|l| l.unsqueeze(0)))?,
            out: batch(out, out.layout.unsqueeze(0))?,
        };
        // SAFETY: validated operands in live blocks (this function's contract), viewed as the
        // batch of one the matmul kernel takes.
        unsafe { launch(backend, &product) }?;
        return match activation {
            // SAFETY: `out` holds the product in a live block of this device.
            Epilogue::Gelu => unsafe { unary_in_place(backend, UnaryOp::Gelu, out) },
            _ => Ok(()),
        };
    }
    if k == 0 {
        let zero = Kernel::Fill {
            out: out.clone(),
            value: Scalar::Float(0.0),
        };
        // SAFETY: `out` is a validated operand in a live block (this function's contract).
        unsafe { launch(backend, &zero) }?;
        // SAFETY: as above, for every operand.
        return unsafe { compose(backend, bias, activation, out) };
    }
    // cuBLASLt reads the bias as a dense vector: a strided, broadcast or unaligned one is
    // copied to a dense scratch block first.
    let dense_bias = match bias {
        Some(b) if (b.layout.strides()[0] != 1 && n > 1) || !device_ptr(b).is_multiple_of(16) => {
            let block = backend.allocator.alloc(n * b.dtype.size_in_bytes())?;
            let copy = Kernel::Copy {
                input: b.clone(),
                out: TensorArg {
                    buffer: block.slice(),
                    layout: Layout::contiguous(&[n])?,
                    dtype: b.dtype,
                },
            };
            // SAFETY: `b` is a validated operand and the block a fresh dense one apart from it.
            if let Err(e) = unsafe { launch(backend, &copy) } {
                backend.allocator.free(block);
                return Err(e);
            }
            Some(block)
        }
        _ => None,
    };
    let bias_addr = match (&dense_bias, bias) {
        (Some(block), _) => Some(block.slice().addr()),
        (None, Some(b)) => Some(device_ptr(b)),
        (None, None) => None,
    };
    let as_batch = |arg: &TensorArg, layout: Result<Layout>| -> Result<TensorArg> {
        Ok(TensorArg {
            layout: layout?,
            ..arg.clone()
        })
    };
    let lhs = as_batch(input, input.layout.unsqueeze(0));
    let rhs = as_batch(weight, weight.layout.transpose(0, 1).and_then(|l| l.unsqueeze(0)));
    let dst = as_batch(out, out.layout.unsqueeze(0));
    let outcome = (|| {
        let (lhs, rhs, dst) = (lhs?, rhs?, dst?);
        // SAFETY: validated operands in live blocks (this function's contract).
        let product = unsafe { product(backend, &lhs, &rhs, &dst) }?;
        let mut slices = vec![input.buffer, weight.buffer, out.buffer];
        slices.extend(bias.map(|b| b.buffer));
        slices.extend(dense_bias.as_ref().map(|b| b.slice()));
        slices.extend(product.scratch_slices());
        let queued = backend
            .bind()
            .and_then(|()| backend.order.before_compute(&backend.compute, &slices))
            .and_then(|()| {
                // SAFETY: every address is a live block of this device (the operands, their
                // scratch copies, the dense bias of `n` elements), ordered on the compute stream.
                unsafe {
                    crate::lt_route::queue(backend, &product.gemm, epilogue(activation, bias.is_some()), bias_addr)
                }
            });
        product.release(backend);
        queued
    })();
    if let Some(block) = dense_bias {
        backend.allocator.free(block);
    }
    match outcome? {
        // SAFETY: `out` holds the product (and bias) in a live block of this device.
        true if activation == Epilogue::Gelu => unsafe { unary_in_place(backend, UnaryOp::Gelu, out) },
        true => Ok(()),
        // SAFETY: `out` holds the product; every operand is live (this function's contract).
        false => unsafe { compose(backend, bias, activation, out) },
    }
}

/// `out = act(out + bias)` with in-place element-wise kernels.
///
/// # Safety
/// Validated operands in live blocks of `backend`.
unsafe fn compose(
    backend: &CudaBackend,
    bias: Option<&TensorArg>,
    activation: Epilogue,
    out: &TensorArg,
) -> Result<()> {
    if activation == Epilogue::GeluTanh {
        return Err(Error::unsupported(
            "linear",
            out.dtype,
            backend.device,
            "cuBLASLt did not run this product, and the tanh GELU has no standalone kernel; the frontend composes it",
        ));
    }
    if let Some(b) = bias {
        let (m, n) = (out.layout.shape()[0], out.layout.shape()[1]);
        let rows = TensorArg {
            layout: Layout::from_parts(&[m, n], &[0, b.layout.strides()[0]], b.layout.offset())?,
            ..b.clone()
        };
        let add = Kernel::Binary {
            op: BinaryOp::Add,
            lhs: out.clone(),
            rhs: rows,
            out: out.clone(),
        };
        // SAFETY: `out` is written exactly over itself (an element-wise kernel in place) and
        // the bias, broadcast over the rows, lies apart from it.
        unsafe { launch(backend, &add) }?;
    }
    match activation {
        // SAFETY: `out` is a live block of this device.
        Epilogue::Relu => unsafe { unary_in_place(backend, UnaryOp::Relu, out) },
        // SAFETY: as above.
        Epilogue::Gelu => unsafe { unary_in_place(backend, UnaryOp::Gelu, out) },
        Epilogue::Identity | Epilogue::GeluTanh => Ok(()),
    }
}

/// `out = op(out)`.
///
/// # Safety
/// `out` is a validated operand in a live block of `backend`.
unsafe fn unary_in_place(backend: &CudaBackend, op: UnaryOp, out: &TensorArg) -> Result<()> {
    let kernel = Kernel::Unary {
        op,
        input: out.clone(),
        out: out.clone(),
    };
    // SAFETY: an element-wise kernel writing exactly over its input (the function's contract).
    unsafe { launch(backend, &kernel) }
}
