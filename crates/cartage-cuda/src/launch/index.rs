//! Gather, IndexSelect and Scatter. Indices are checked on the device: an index outside its dimension is
//! recorded in a small fault record instead of being followed, and the record is read back after
//! the launch — a host synchronisation on every gather/index_select, the price of returning
//! `Error::IndexOutOfRange` instead of garbage or a fault.
//!
//! `IndexSelect` of whole contiguous rows (an embedding lookup) and the `index_add` form of
//! `Scatter` take the row kernels of [`super::index_rows`]; everything else runs one thread per
//! element here.

use std::cell::Cell;

use cartage_core::{Error, Result, ScatterMode, TensorArg};
use cudarc::driver::DeviceRepr;

use super::geometry::{KernelShape, KernelStrides, MAX_RANK, grid};
use super::index_rows::{self, RowLaunch};
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

thread_local! {
    /// Set while this thread launches a kernel whose indices are known to be in range
    /// ([`indices_in_range`]).
    static INDICES_IN_RANGE: Cell<bool> = const { Cell::new(false) };
}

/// Run `launch` (a kernel launch on this thread) with every index of it known to lie in range
/// ([`cartage_core::Backend::launch_with_indices_in_range`]): [`with_fault`] then neither
/// clears nor reads back the fault record, so the host does not wait for the device.
pub(crate) fn indices_in_range<R>(launch: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            INDICES_IN_RANGE.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(INDICES_IN_RANGE.with(|flag| flag.replace(true)));
    launch()
}

/// Run `launch` with the device address of a cleared fault record, then read the record back:
/// `Some(index)` when a kernel recorded an out-of-range index. The host waits for the launch.
///
/// Inside [`indices_in_range`] no index can be out of range: the record is handed to the kernel
/// (which still checks every index and would skip a bad one) but neither cleared nor read, and
/// the host does not wait.
pub(super) fn with_fault(backend: &CudaBackend, launch: impl FnOnce(u64) -> Result<()>) -> Result<Option<i64>> {
    let fault = backend.allocator.alloc(FAULT_BYTES)?;
    let slice = fault.slice();
    if INDICES_IN_RANGE.with(Cell::get) {
        let launched = (|| {
            backend.bind()?;
            backend.order.before_compute(&backend.compute, &[slice])?;
            launch(slice.addr())
        })();
        backend.allocator.free(fault);
        return launched.map(|()| None);
    }
    let outcome = (|| {
        backend.bind()?;
        backend.order.before_compute(&backend.compute, &[slice])?;
        // SAFETY: `slice` is a live block of this device of FAULT_BYTES bytes, cleared in
        // stream order before the kernel that writes it.
        unsafe { driver::memset_async(slice.addr(), 0, FAULT_BYTES, backend.compute.cu_stream()) }
            .map_err(driver::error(backend.device, "clear index fault"))?;
        launch(slice.addr())?;
        if backend.capture.active() {
            // Inside a graph capture the record cannot be read back (a host wait): an
            // out-of-range index is still skipped by the kernel, so no memory outside the
            // tensors is touched, but it is not reported (the graph module's docs say so).
            return Ok([0u8; FAULT_BYTES]);
        }
        let mut record = [0u8; FAULT_BYTES];
        backend.launch_waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `slice` is the live fault block allocated above, freed only after this read.
        unsafe { crate::copies::read(backend, slice, &mut record) }?;
        Ok(record)
    })();
    backend.allocator.free(fault);
    let record = outcome?;
    if u32::from_le_bytes([record[0], record[1], record[2], record[3]]) == 0 {
        return Ok(None);
    }
    let mut value = [0u8; 8];
    value.copy_from_slice(&record[8..16]);
    Ok(Some(i64::from_le_bytes(value)))
}

/// One launch of an index kernel over `shape` (the output's for gather/index_select, the
/// index's for scatter), then its index check.
#[allow(clippy::too_many_arguments)]
fn run(
    backend: &CudaBackend,
    op: &'static str,
    name: KernelName,
    geom: IndexGeom,
    (input, index, out): (&TensorArg, &TensorArg, &TensorArg),
    dim: usize,
    size: usize,
) -> Result<()> {
    let n = geom.out_shape.numel;
    if n == 0 {
        return Ok(());
    }
    let kernel = backend.modules.kernel(name)?;
    let (po, pi, px) = (device_ptr(out), device_ptr(input), device_ptr(index));
    let cfg = grid(n, max_blocks(backend, &kernel));
    let fault = with_fault(backend, |pf| {
        launch_kernel!(
            backend,
            kernel,
            cfg,
            [input.buffer, index.buffer, out.buffer],
            &po,
            &pi,
            &px,
            &pf,
            &geom
        )
    })?;
    out_of_range(backend, op, fault, dim, size)
}

/// `Error::IndexOutOfRange` for a recorded index, naming the op, the dim and its size.
fn out_of_range(backend: &CudaBackend, op: &'static str, fault: Option<i64>, dim: usize, size: usize) -> Result<()> {
    match fault {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op,
            index,
            dim,
            size,
            device: backend.device,
        }),
    }
}

/// One launch of a row kernel (`src` read, `out` written), then its index check.
fn run_rows(
    backend: &CudaBackend,
    op: &'static str,
    plan: RowLaunch,
    (src, index, out): (&TensorArg, &TensorArg, &TensorArg),
    dim: usize,
    size: usize,
) -> Result<()> {
    if plan.geom.tasks() == 0 {
        return Ok(());
    }
    let kernel = backend.modules.kernel(plan.name)?;
    let (po, ps, px) = (device_ptr(out), device_ptr(src), device_ptr(index));
    let cfg = index_rows::config(backend, &kernel, &plan.geom);
    let geom = plan.geom;
    let fault = with_fault(backend, |pf| {
        launch_kernel!(
            backend,
            kernel,
            cfg,
            [src.buffer, index.buffer, out.buffer],
            &po,
            &ps,
            &px,
            &pf,
            &geom
        )
    })?;
    out_of_range(backend, op, fault, dim, size)
}

fn geometry(
    shape: &[usize],
    out: &TensorArg,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    size: usize,
) -> IndexGeom {
    IndexGeom {
        out_shape: KernelShape::new(shape),
        out_strides: KernelStrides::new(out.layout.strides()),
        in_strides: KernelStrides::new(input.layout.strides()),
        index_strides: KernelStrides::new(index.layout.strides()),
        dim: dim as i32,
        pad: 0,
        dim_size: size as u64,
    }
}

fn gather_like(
    backend: &CudaBackend,
    op: &'static str,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    check_rank(op, input)?;
    let size = input.layout.shape()[dim];
    let geom = geometry(out.layout.shape(), out, input, index, dim, size);
    let name = KernelName::new(SourceFile::Index, [op, size_name(input.dtype), index.dtype.name(), ""]);
    run(backend, op, name, geom, (input, index, out), dim, size)
}

pub(super) fn gather(
    backend: &CudaBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    gather_like(backend, "gather", input, index, dim, out)
}

pub(super) fn index_select(
    backend: &CudaBackend,
    input: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    if let Some(plan) = index_rows::select(input, index, dim, out) {
        let size = input.layout.shape()[dim];
        return run_rows(backend, "index_select", plan, (input, index, out), dim, size);
    }
    gather_like(backend, "index_select", input, index, dim, out)
}

/// Scatter `src` into `out` at `index` along `dim` (assign by size, add by dtype with atomics).
pub(super) fn scatter(
    backend: &CudaBackend,
    mode: ScatterMode,
    src: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let op = mode.name();
    check_rank(op, out)?;
    let size = out.layout.shape()[dim];
    if mode == ScatterMode::Add
        && let Some(plan) = index_rows::index_add(src, index, dim, out)
    {
        return run_rows(backend, op, plan, (src, index, out), dim, size);
    }
    // Positions run over the index's shape; the source is read there (its strides, its box).
    let geom = geometry(index.layout.shape(), out, src, index, dim, size);
    let name = match mode {
        ScatterMode::Assign => KernelName::new(
            SourceFile::Index,
            ["scatter", size_name(src.dtype), index.dtype.name(), ""],
        ),
        ScatterMode::Add => KernelName::new(
            SourceFile::Index,
            ["scatter_add", src.dtype.name(), index.dtype.name(), ""],
        ),
    };
    run(backend, op, name, geom, (src, index, out), dim, size)
}
