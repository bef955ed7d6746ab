//! Gather and IndexSelect. Indices are checked on the device: an index outside its dimension is
//! recorded in a small fault record instead of being followed, and the record is read back after
//! the launch — a host synchronisation on every gather/index_select, the price of returning
//! `Error::IndexOutOfRange` instead of garbage or a fault.

use cartage_core::{Error, Result, TensorArg};
use cudarc::driver::DeviceRepr;

use super::geometry::{KernelShape, KernelStrides, MAX_RANK, grid};
use super::{device_ptr, launch_kernel, max_blocks, size_name};
use crate::backend::CudaBackend;
use crate::driver;
use crate::modules::{KernelName, SourceFile};

/// `struct IndexGeom` of index.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct IndexGeom {
    out_shape: KernelShape,
    out_strides: KernelStrides,
    in_strides: KernelStrides,
    index_strides: KernelStrides,
    dim: i32,
    pad: i32,
    dim_size: u64,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for IndexGeom {}

/// `struct IndexFault` of index.cu: a hit flag and the first offending index.
const FAULT_BYTES: usize = 16;

/// The one CUDA limit of the index kernels: the geometry struct holds [`MAX_RANK`] dimensions
/// (uncoalesced, since the indexed dimension must stay whole).
fn check_rank(op: &'static str, input: &TensorArg) -> Result<()> {
    if input.layout.rank() > MAX_RANK {
        return Err(Error::invalid(
            op,
            format!(
                "the index kernels take at most {MAX_RANK} dimensions, not {}; reshape the tensor to fewer",
                input.layout.rank()
            ),
        ));
    }
    Ok(())
}

fn run(
    backend: &CudaBackend,
    op: &'static str,
    kernel: &'static str,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let geom = IndexGeom {
        out_shape: KernelShape::new(out.layout.shape()),
        out_strides: KernelStrides::new(out.layout.strides()),
        in_strides: KernelStrides::new(input.layout.strides()),
        index_strides: KernelStrides::new(index.layout.strides()),
        dim: dim as i32,
        pad: 0,
        dim_size: input.layout.shape()[dim] as u64,
    };
    let fault = backend.allocator.alloc(FAULT_BYTES)?;
    let slice = fault.slice();
    let outcome = (|| {
        backend.bind()?;
        backend.order.before_compute(&backend.compute, &[slice])?;
        // SAFETY: `slice` is a live block of this device of FAULT_BYTES bytes, cleared in
        // stream order before the kernel that writes it.
        unsafe { driver::memset_async(slice.addr(), 0, FAULT_BYTES, backend.compute.cu_stream()) }
            .map_err(driver::error(backend.device, "clear index fault"))?;
        let name = backend.modules.kernel(KernelName::new(
            SourceFile::Index,
            [kernel, size_name(input.dtype), index.dtype.name(), ""],
        ))?;
        let (po, pi, px, pf) = (device_ptr(out), device_ptr(input), device_ptr(index), slice.addr());
        let cfg = grid(n as u64, max_blocks(backend, &name));
        launch_kernel!(
            backend,
            name,
            cfg,
            [input.buffer, index.buffer, out.buffer, slice],
            &po,
            &pi,
            &px,
            &pf,
            &geom
        )?;
        let mut record = [0u8; FAULT_BYTES];
        // SAFETY: `slice` is the live fault block allocated above, freed only after this read.
        unsafe { crate::copies::read(backend, slice, &mut record) }?;
        Ok(record)
    })();
    backend.allocator.free(fault);
    let record = outcome?;
    if u32::from_le_bytes([record[0], record[1], record[2], record[3]]) != 0 {
        let mut value = [0u8; 8];
        value.copy_from_slice(&record[8..16]);
        return Err(Error::IndexOutOfRange {
            op,
            index: i64::from_le_bytes(value),
            dim,
            size: input.layout.shape()[dim],
            device: backend.device,
        });
    }
    Ok(())
}

pub(super) fn gather(
    backend: &CudaBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    check_rank("gather", input)?;
    run(backend, "gather", "gather", input, index, dim, out)
}

pub(super) fn index_select(
    backend: &CudaBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    check_rank("index_select", input)?;
    run(backend, "index_select", "index_select", input, index, dim, out)
}
