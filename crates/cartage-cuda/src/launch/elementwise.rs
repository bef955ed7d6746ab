//! Element-wise kernels: Fill, Arange, Random, Cast, Unary, Binary, Compare, Where (Copy lives in
//! [`super::copy`]).
//! Each picks the dense vectorised kernel (`*_contig`) when it can and the strided one otherwise.

use cartage_core::{BinaryOp, CompareOp, DType, Distribution, Result, Scalar, TensorArg, UnaryOp};

use super::geometry::{Coalesced, THREADS, grid};
use super::{dense, device_ptr, lanes, launch_kernel, max_blocks, size_name};
use crate::backend::CudaBackend;
use crate::driver;
use crate::modules::{KernelName, LoadedKernel, SourceFile};

/// The grid of a one-shot dense unary/binary kernel: a block per 256 × U vectors, U = 4 for float
/// dtypes and 1 otherwise (the rule of `unary_contig`/`binary_contig` in the .cu files).
fn contig_blocks(n: usize, dtype: DType) -> cudarc::driver::LaunchConfig {
    let unroll = if dtype.is_float() { 4 } else { 1 };
    let vectors = n as u64 / lanes(dtype);
    let blocks = vectors.div_ceil(THREADS as u64 * unroll).clamp(1, i32::MAX as u64) as u32;
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A dense grid-stride launch over `n` elements of `dtype` in 16-byte vectors.
fn vector_grid(backend: &CudaBackend, kernel: &LoadedKernel, n: usize, dtype: DType) -> cudarc::driver::LaunchConfig {
    grid((n as u64).div_ceil(lanes(dtype)), max_blocks(backend, kernel))
}

fn scalar_bits(value: Scalar, dtype: DType) -> u64 {
    let mut bytes = [0u8; 8];
    let value = value.to_bytes(dtype);
    bytes[..value.len()].copy_from_slice(&value);
    u64::from_le_bytes(bytes)
}

pub(super) fn fill(backend: &CudaBackend, out: &TensorArg, value: Scalar) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let bits = scalar_bits(value, out.dtype);
    let size = out.dtype.size_in_bytes();
    let ptr = device_ptr(out);
    if out.layout.is_contiguous() {
        let bytes = bits.to_le_bytes();
        if bytes[..size].iter().all(|&b| b == bytes[0]) {
            backend.bind()?;
            backend.order.before_compute(&backend.compute, &[out.buffer])?;
            // SAFETY: the view is dense, so it covers `n * size` bytes from `ptr`, inside its
            // buffer (`Kernel::validate`), a live block (the contract of `launch`); queued on the
            // compute stream after earlier users.
            return unsafe { driver::memset_async(ptr, bytes[0], n * size, backend.compute.cu_stream()) }
                .map_err(driver::error(backend.device, "fill"));
        }
        if ptr.is_multiple_of(16) {
            let name = backend.modules.kernel(KernelName::new(
                SourceFile::Construct,
                ["fill", size_name(out.dtype), "contig", ""],
            ))?;
            let n64 = n as u64;
            return launch_kernel!(
                backend,
                name,
                vector_grid(backend, &name, n, out.dtype),
                [out.buffer],
                &ptr,
                &n64,
                &bits
            );
        }
    }
    let geometry = Coalesced::of("fill", &[&out.layout])?;
    let (shape, strides) = (geometry.shape(), geometry.strides(0));
    let name = backend.modules.kernel(KernelName::new(
        SourceFile::Construct,
        ["fill", size_name(out.dtype), "strided", ""],
    ))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(backend, name, cfg, [out.buffer], &ptr, &shape, &strides, &bits)
}

pub(super) fn arange(backend: &CudaBackend, out: &TensorArg, start: f64, step: f64) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let geometry = Coalesced::of("arange", &[&out.layout])?;
    let (shape, strides, ptr) = (geometry.shape(), geometry.strides(0), device_ptr(out));
    let name = backend.modules.kernel(KernelName::new(
        SourceFile::Construct,
        ["arange", out.dtype.name(), "", ""],
    ))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(backend, name, cfg, [out.buffer], &ptr, &shape, &strides, &start, &step)
}

pub(super) fn random(
    backend: &CudaBackend,
    out: &TensorArg,
    distribution: Distribution,
    seed: u64,
    offset: u64,
) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let geometry = Coalesced::of("random", &[&out.layout])?;
    let (shape, strides, ptr) = (geometry.shape(), geometry.strides(0), device_ptr(out));
    let (kind, a, b) = match distribution {
        Distribution::Uniform { low, high } => ("rand", low, high),
        Distribution::Normal { mean, std } => ("randn", mean, std),
    };
    let name = backend
        .modules
        .kernel(KernelName::new(SourceFile::Construct, [kind, out.dtype.name(), "", ""]))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend,
        name,
        cfg,
        [out.buffer],
        &ptr,
        &shape,
        &strides,
        &seed,
        &offset,
        &a,
        &b
    )
}

pub(super) fn cast(backend: &CudaBackend, input: &TensorArg, out: &TensorArg) -> Result<()> {
    if input.dtype == out.dtype {
        return super::copy::copy(backend, input, out);
    }
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let geometry = Coalesced::of("cast", &[&out.layout, &input.layout])?;
    let (shape, so, si) = (geometry.shape(), geometry.strides(0), geometry.strides(1));
    let (po, pi) = (device_ptr(out), device_ptr(input));
    let name = backend.modules.kernel(KernelName::new(
        SourceFile::Cast,
        ["cast", input.dtype.name(), out.dtype.name(), ""],
    ))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend,
        name,
        cfg,
        [input.buffer, out.buffer],
        &po,
        &pi,
        &shape,
        &so,
        &si
    )
}

fn code<T: PartialEq>(all: &[T], op: T) -> i32 {
    all.iter().position(|o| *o == op).unwrap_or(0) as i32
}

pub(super) fn unary(backend: &CudaBackend, op: UnaryOp, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, pi) = (device_ptr(out), device_ptr(input));
    let dt = input.dtype.name();
    if dense(&[input, out]) {
        let name = backend
            .modules
            .kernel(KernelName::new(SourceFile::Unary, ["unary", op.name(), dt, "contig"]))?;
        let n64 = n as u64;
        let cfg = contig_blocks(n, input.dtype);
        return launch_kernel!(backend, name, cfg, [input.buffer, out.buffer], &po, &pi, &n64);
    }
    let geometry = Coalesced::of(op.name(), &[&out.layout, &input.layout])?;
    let (shape, so, si) = (geometry.shape(), geometry.strides(0), geometry.strides(1));
    let op_code = code(&UnaryOp::ALL, op);
    let name = backend
        .modules
        .kernel(KernelName::new(SourceFile::Unary, ["unary", dt, "strided", ""]))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend,
        name,
        cfg,
        [input.buffer, out.buffer],
        &po,
        &pi,
        &shape,
        &so,
        &si,
        &op_code
    )
}

pub(super) fn binary(
    backend: &CudaBackend,
    op: BinaryOp,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, pl, pr) = (device_ptr(out), device_ptr(lhs), device_ptr(rhs));
    let dt = lhs.dtype.name();
    let slices = [lhs.buffer, rhs.buffer, out.buffer];
    if dense(&[lhs, rhs, out]) {
        let name = backend
            .modules
            .kernel(KernelName::new(SourceFile::Binary, ["binary", op.name(), dt, "contig"]))?;
        let n64 = n as u64;
        let cfg = contig_blocks(n, lhs.dtype);
        return launch_kernel!(backend, name, cfg, slices, &po, &pl, &pr, &n64);
    }
    let geometry = Coalesced::of(op.name(), &[&out.layout, &lhs.layout, &rhs.layout])?;
    let (shape, so, sl, sr) = (
        geometry.shape(),
        geometry.strides(0),
        geometry.strides(1),
        geometry.strides(2),
    );
    let op_code = code(&BinaryOp::ALL, op);
    let name = backend
        .modules
        .kernel(KernelName::new(SourceFile::Binary, ["binary", dt, "strided", ""]))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend, name, cfg, slices, &po, &pl, &pr, &shape, &so, &sl, &sr, &op_code
    )
}

/// `Kernel::GeluBackward`: `out = grad·(Φ(input) + input·φ(input))`, vectorised where all three
/// operands are dense, else strided.
pub(super) fn gelu_backward(backend: &CudaBackend, input: &TensorArg, grad: &TensorArg, out: &TensorArg) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, px, pg) = (device_ptr(out), device_ptr(input), device_ptr(grad));
    let dt = input.dtype.name();
    let slices = [input.buffer, grad.buffer, out.buffer];
    if dense(&[input, grad, out]) {
        let name = backend
            .modules
            .kernel(KernelName::new(SourceFile::Binary, ["gelu_backward", dt, "contig", ""]))?;
        let n64 = n as u64;
        let cfg = contig_blocks(n, input.dtype);
        return launch_kernel!(backend, name, cfg, slices, &po, &px, &pg, &n64);
    }
    let geometry = Coalesced::of("gelu_backward", &[&out.layout, &input.layout, &grad.layout])?;
    let (shape, so, sx, sg) = (
        geometry.shape(),
        geometry.strides(0),
        geometry.strides(1),
        geometry.strides(2),
    );
    let name = backend.modules.kernel(KernelName::new(
        SourceFile::Binary,
        ["gelu_backward", dt, "strided", ""],
    ))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(backend, name, cfg, slices, &po, &px, &pg, &shape, &so, &sx, &sg)
}

pub(super) fn compare(
    backend: &CudaBackend,
    op: CompareOp,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, pl, pr) = (device_ptr(out), device_ptr(lhs), device_ptr(rhs));
    let dt = lhs.dtype.name();
    let slices = [lhs.buffer, rhs.buffer, out.buffer];
    if dense(&[lhs, rhs, out]) {
        let name = backend.modules.kernel(KernelName::new(
            SourceFile::Compare,
            ["compare", op.name(), dt, "contig"],
        ))?;
        let n64 = n as u64;
        let cfg = vector_grid(backend, &name, n, lhs.dtype);
        return launch_kernel!(backend, name, cfg, slices, &po, &pl, &pr, &n64);
    }
    let geometry = Coalesced::of(op.name(), &[&out.layout, &lhs.layout, &rhs.layout])?;
    let (shape, so, sl, sr) = (
        geometry.shape(),
        geometry.strides(0),
        geometry.strides(1),
        geometry.strides(2),
    );
    let op_code = code(&CompareOp::ALL, op);
    let name = backend
        .modules
        .kernel(KernelName::new(SourceFile::Compare, ["compare", dt, "strided", ""]))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend, name, cfg, slices, &po, &pl, &pr, &shape, &so, &sl, &sr, &op_code
    )
}

pub(super) fn select(
    backend: &CudaBackend,
    cond: &TensorArg,
    on_true: &TensorArg,
    on_false: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (po, pc, pt, pf) = (
        device_ptr(out),
        device_ptr(cond),
        device_ptr(on_true),
        device_ptr(on_false),
    );
    let size = size_name(out.dtype);
    let slices = [cond.buffer, on_true.buffer, on_false.buffer, out.buffer];
    if dense(&[cond, on_true, on_false, out]) {
        let name = backend
            .modules
            .kernel(KernelName::new(SourceFile::Compare, ["where", size, "contig", ""]))?;
        let n64 = n as u64;
        let cfg = vector_grid(backend, &name, n, out.dtype);
        return launch_kernel!(backend, name, cfg, slices, &po, &pc, &pt, &pf, &n64);
    }
    let geometry = Coalesced::of("where", &[&out.layout, &cond.layout, &on_true.layout, &on_false.layout])?;
    let shape = geometry.shape();
    let (so, sc, st, sf) = (
        geometry.strides(0),
        geometry.strides(1),
        geometry.strides(2),
        geometry.strides(3),
    );
    let name = backend
        .modules
        .kernel(KernelName::new(SourceFile::Compare, ["where", size, "strided", ""]))?;
    let cfg = grid(n as u64, max_blocks(backend, &name));
    launch_kernel!(
        backend, name, cfg, slices, &po, &pc, &pt, &pf, &shape, &so, &sc, &st, &sf
    )
}
