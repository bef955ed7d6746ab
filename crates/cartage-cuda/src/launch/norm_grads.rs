//! The norms' backward with the weight and bias gradients ([`cartage_core::Kernel::NormBackward`]
//! with `grad_weight` or `grad_bias`): two launches.
//!
//! `norm_grads_<kind>_<dtype>_<path>` writes the input gradient as the input-gradient kernels of
//! [`super::backward`] do (the same paths: rows held in registers, streamed, or strided) and adds
//! each row's `g·x̂` and `g` into partial sums of the compute type, one row of `cols` per *unit*:
//! a block on the register path (its groups combined in a fixed order), a group (a warp or the
//! block) on the others. The grid is a fixed number of units, a few per multiprocessor, so the
//! partials stay small (at most [`MAX_PARTIALS`] values per gradient unless one row is longer)
//! while every multiprocessor streams rows. The scratch comes from the caching allocator and goes
//! back once both launches are queued. `norm_grads_reduce_<dtype>` then sums the units' rows per
//! column in a fixed order into each gradient (any stride), rounded once: no atomics, so the
//! result depends on the shape and the device's multiprocessor count, never on timing.

use cartage_core::{DType, Error, NormBackwardArgs, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::backward::{Path, Rows, norm_op};
use super::geometry::THREADS;
use super::rows::{LONG_BLOCK, vector_name};
use super::{device_ptr, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The most partial sums per gradient the grid is cut down to (16 MiB of f32).
pub(super) const MAX_PARTIALS: u64 = 1 << 22;

/// The most threads per multiprocessor the kernels run with when summing partials (half the
/// hardware's maximum): few enough units that each streams several rows before its partials
/// are written, enough to keep the memory busy.
const THREADS_PER_SM: u64 = 1024;

/// Columns a register kernel's block combines in shared memory (`RedCap` in backward.cu): 2048
/// bytes of compute values.
pub(super) fn shared_columns(dtype: DType) -> usize {
    2048 / if dtype == DType::F64 { 8 } else { 4 }
}

/// `struct NormReduceGeom` of backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct NormReduceGeom {
    cols: u64,
    units: u64,
    out_stride: i64,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernel declares.
unsafe impl DeviceRepr for NormReduceGeom {}

/// `norm_grads_<layer|rms>_<dtype>_<v1|v2|v4|long|strided>`.
pub(super) fn grads_name(kind: cartage_core::NormKind, dtype: DType, suffix: &'static str) -> KernelName {
    let kind = match kind {
        cartage_core::NormKind::Layer => "layer",
        cartage_core::NormKind::Rms => "rms",
    };
    KernelName::new(SourceFile::Backward, ["norm_grads", kind, dtype.name(), suffix])
}

/// `norm_grads_reduce_<dtype>`.
pub(super) fn reduce_name(dtype: DType) -> KernelName {
    KernelName::new(SourceFile::Backward, ["norm_grads_reduce", dtype.name(), "", ""])
}

/// The kernel-name suffix of `path`.
fn suffix(path: Path) -> &'static str {
    match path {
        Path::Held(p) => vector_name(p.vectors),
        Path::Long => "long",
        Path::Strided => "strided",
    }
}

/// The launch of the first kernel: group, block, grid, and the number of units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shape {
    pub group: u32,
    pub block: u32,
    pub blocks: u32,
    pub units: u64,
}

/// The grid of `path` over `rows` rows of `cols` on `sm_count` multiprocessors that each hold
/// `threads_per_sm` threads of the kernel at once: one wave at most (each unit then streams
/// rows until they run out), and no more than [`THREADS_PER_SM`] per multiprocessor.
pub(super) fn grads_shape(path: Path, rows: u64, cols: u64, sm_count: u64, threads_per_sm: u64) -> Shape {
    let threads = threads_per_sm.clamp(1, THREADS_PER_SM);
    // Blocks for `per_block` units each: at most a wave, no more than the rows need, and few
    // enough that the partials stay within MAX_PARTIALS (but at least one).
    let blocks = |needed: u64, block: u32, per_block: u64| {
        let cap = sm_count * (threads / u64::from(block)).max(1);
        let fit = (MAX_PARTIALS / (cols * per_block).max(1)).max(1);
        needed.clamp(1, cap.max(1)).min(fit)
    };
    match path {
        Path::Held(p) => {
            let per_block = u64::from(p.block / p.group);
            let b = blocks(rows.div_ceil(per_block), p.block, 1);
            Shape {
                group: p.group,
                block: p.block,
                blocks: b as u32,
                units: b,
            }
        }
        Path::Long => {
            let b = blocks(rows, LONG_BLOCK, 1);
            Shape {
                group: LONG_BLOCK,
                block: LONG_BLOCK,
                blocks: b as u32,
                units: b,
            }
        }
        Path::Strided => {
            let group = if cols >= 1024 { THREADS } else { 32 };
            let per_block = u64::from(THREADS / group);
            let b = blocks(rows.div_ceil(per_block), THREADS, per_block);
            Shape {
                group,
                block: THREADS,
                blocks: b as u32,
                units: b * per_block,
            }
        }
    }
}

/// The input gradient and the wanted parameter gradients of a norm (validated operands).
pub(super) fn norm_grads(backend: &CudaBackend, a: &NormBackwardArgs) -> Result<()> {
    let (input, grad, out, weight) = (&a.input, &a.grad, &a.grad_input, a.weight.as_ref());
    let dtype = input.dtype;
    let dim = input.layout.rank() - 1;
    let rows = Rows {
        a: input,
        g: grad,
        weight,
        out,
        dim,
    };
    let (rows_c, count) = rows.geometry(norm_op(a.kind))?;
    let cols = input.layout.shape()[dim] as u64;
    if cols == 0 {
        return Ok(());
    }
    let columns = [a.grad_weight.as_ref(), a.grad_bias.as_ref()];
    if count == 0 {
        // Sums over no rows: the second kernel over no units writes zeros.
        for column in columns.into_iter().flatten() {
            reduce(backend, column, 0, 0, None)?;
        }
        return Ok(());
    }
    let path = match rows.path(&rows_c) {
        // A block of small groups combines them in a shared row of `shared_columns` (always
        // enough for what such a group holds; streamed otherwise).
        Path::Held(p) if p.group <= 32 && cols as usize > shared_columns(dtype) => Path::Long,
        path => path,
    };
    let kernel = backend.modules.kernel(grads_name(a.kind, dtype, suffix(path)))?;
    let resident = u64::from(kernel.blocks_per_sm) * 256;
    let shape = grads_shape(path, count, cols, u64::from(backend.sm_count), resident);
    let mut geom = rows.geom(&rows_c, count, a.eps, weight.is_some() as i32);
    geom.group = shape.group as i32;
    let compute = if dtype == DType::F64 { 8u64 } else { 4 };
    let per = shape.units * cols * compute;
    let wanted = columns.iter().flatten().count() as u64;
    let bytes = usize::try_from(per * wanted).map_err(|_| {
        Error::unsupported(
            norm_op(a.kind),
            dtype,
            backend.device,
            "the partial sums of the weight and bias gradients do not fit this host's address space",
        )
    })?;
    let scratch = backend.allocator.alloc(bytes)?;
    let slice = scratch.slice();
    let part_w = if a.grad_weight.is_some() { slice.addr() } else { 0 };
    let part_b = match (a.grad_weight.is_some(), a.grad_bias.is_some()) {
        (_, false) => 0,
        (true, true) => slice.addr() + per,
        (false, true) => slice.addr(),
    };
    let queued = (|| {
        let cfg = LaunchConfig {
            grid_dim: (shape.blocks, 1, 1),
            block_dim: (shape.block, 1, 1),
            shared_mem_bytes: 0,
        };
        let (px, pw, pg, po) = (
            device_ptr(input),
            weight.map_or(0, device_ptr),
            device_ptr(grad),
            device_ptr(out),
        );
        let mut slices = vec![input.buffer, grad.buffer, out.buffer, slice];
        slices.extend(weight.map(|w| w.buffer));
        launch_kernel!(
            backend, kernel, cfg, slices, &px, &pw, &pg, &po, &part_w, &part_b, &geom
        )?;
        if let Some(column) = a.grad_weight.as_ref() {
            reduce(backend, column, part_w, shape.units, Some(slice))?;
        }
        if let Some(column) = a.grad_bias.as_ref() {
            reduce(backend, column, part_b, shape.units, Some(slice))?;
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the block are queued after these launches.
    backend.allocator.free(scratch);
    queued
}

/// `column[c] = Σ_u part[u·cols + c]` over `units` rows of partial sums at `part` (in `scratch`).
fn reduce(
    backend: &CudaBackend,
    column: &TensorArg,
    part: u64,
    units: u64,
    scratch: Option<cartage_core::raw::BufferSlice>,
) -> Result<()> {
    let cols = column.layout.shape()[0] as u64;
    let blocks = u32::try_from(cols.div_ceil(32)).map_err(|_| {
        Error::unsupported(
            "norm_backward",
            column.dtype,
            backend.device,
            format!("{cols} columns need more than 2^32 blocks of 32"),
        )
    })?;
    let geom = NormReduceGeom {
        cols,
        units,
        out_stride: column.layout.strides()[0] as i64,
    };
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = backend.modules.kernel(reduce_name(column.dtype))?;
    let po = device_ptr(column);
    let mut slices = vec![column.buffer];
    slices.extend(scratch);
    launch_kernel!(backend, kernel, cfg, slices, &part, &po, &geom)
}

#[cfg(test)]
mod tests {
    use cartage_core::NormKind;

    use super::*;
    use crate::launch::backward::{DTYPES, held_plan};

    /// A block that combines its groups in shared memory (a group of a warp or less) never holds
    /// more columns than the shared row has.
    #[test]
    fn shared_rows_hold_every_column_of_a_small_group() {
        for dtype in DTYPES {
            for cols in 1..=20_000 {
                let Some(p) = held_plan(cols, dtype) else { continue };
                if p.group <= 32 {
                    assert!(cols <= shared_columns(dtype), "{cols} {dtype}: {p:?}");
                }
            }
        }
    }

    /// The grid never has more units than rows need, at least one, and partials within the cap
    /// unless a single unit's row is longer.
    #[test]
    fn grids_bound_the_partial_sums() {
        for dtype in DTYPES {
            for &cols in &[1u64, 3, 64, 1000, 4096, 4097, 8192, 40_000, 1 << 23] {
                for &rows in &[1u64, 7, 3000, 8192, 1 << 20] {
                    let paths = [
                        held_plan(cols as usize, dtype).map_or(Path::Long, Path::Held),
                        Path::Long,
                        Path::Strided,
                    ];
                    for path in paths {
                        let s = grads_shape(path, rows, cols, 132, 2048);
                        let per_block = u64::from(s.block / s.group);
                        let needed = rows.div_ceil(per_block);
                        assert!(
                            s.blocks >= 1 && u64::from(s.blocks) <= needed && s.units >= 1,
                            "{path:?} {rows}×{cols}: {s:?}"
                        );
                        assert!(
                            s.units * cols <= MAX_PARTIALS.max(cols * per_block),
                            "{path:?} {rows}×{cols}: {s:?}"
                        );
                    }
                }
            }
        }
    }

    /// Every kernel the launches can pick is in the committed PTX, with the parameters the host
    /// pushes: (x, w, g, out, part_w, part_b, geom) and (part, out, geom).
    #[test]
    fn every_grads_kernel_exists_with_its_parameters() {
        let entries = crate::precompiled::entry_names(SourceFile::Backward);
        let geom = std::mem::size_of::<super::super::backward::GradGeom>();
        for dtype in DTYPES {
            let mut suffixes: Vec<&'static str> = (1..=20_000)
                .filter_map(|cols| held_plan(cols, dtype))
                .map(|p| vector_name(p.vectors))
                .collect();
            suffixes.sort_unstable();
            suffixes.dedup();
            suffixes.extend(["long", "strided"]);
            for suffix in suffixes {
                for kind in [NormKind::Layer, NormKind::Rms] {
                    let name = grads_name(kind, dtype, suffix);
                    assert!(
                        entries.contains(&name.symbol().as_str()),
                        "{} is not built",
                        name.symbol()
                    );
                    let params = super::super::ptx_param_bytes(name.file, &name.symbol());
                    assert_eq!(params, [8, 8, 8, 8, 8, 8, geom], "{}", name.symbol());
                }
            }
            let name = reduce_name(dtype);
            let params = super::super::ptx_param_bytes(name.file, &name.symbol());
            assert_eq!(
                params,
                [8, 8, std::mem::size_of::<NormReduceGeom>()],
                "{}",
                name.symbol()
            );
        }
    }
}
