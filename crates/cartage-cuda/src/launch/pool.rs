//! 2-D max and average pooling, forward ([`cartage_core::Kernel::Pool2d`]) and input gradient
//! ([`cartage_core::Kernel::Pool2dBackward`]), as direct kernels (pool.cu), not cuDNN: PyTorch's
//! own `max_pool2d`/`avg_pool2d` CUDA kernels are native too, and one pass over memory needs no
//! descriptors or workspace.
//!
//! - The forward runs one thread per output element over the input read through its strides;
//!   max pooling writes the i64 indices in the same pass when asked.
//! - The backward runs one thread per input element and gathers over the windows that contain
//!   it, in a fixed order: deterministic, with no atomics. Max pooling compares each window's
//!   index with the position (an index is never followed as an address), so a corrupt index
//!   adds nothing rather than faulting.
//! - Each kernel comes in an i32 and an i64 flavour of its position arithmetic; the i32 one
//!   (32-bit division) is taken when every size it computes with fits, memory offsets are i64
//!   in both.

use cartage_core::{DType, PoolMode, PoolWindow, Result, TensorArg};
use cudarc::driver::DeviceRepr;

use super::geometry::{KernelStrides, grid};
use super::{device_ptr, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The dtypes the pooling kernels are built for (`pool.cu`).
pub(crate) const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `struct PoolGeom` of pool.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PoolGeom {
    total: i64,
    channels: i64,
    height: i64,
    width: i64,
    out_height: i64,
    out_width: i64,
    a: KernelStrides,
    b: KernelStrides,
    kernel_h: i64,
    kernel_w: i64,
    stride_h: i64,
    stride_w: i64,
    pad_h: i64,
    pad_w: i64,
    dil_h: i64,
    dil_w: i64,
    include_pad: i32,
    pad: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for PoolGeom {}

impl PoolGeom {
    /// The geometry of `plane` `[N, C, H, W]` pooled to `[OH, OW]` by `window`, with `total`
    /// work items; `a` and `b` are the strides of the read operands.
    fn new(
        mode: PoolMode,
        window: PoolWindow,
        plane: &[usize],
        pooled: &[usize],
        total: usize,
        a: &TensorArg,
        b: Option<&TensorArg>,
    ) -> Self {
        let w = |v: usize| v as i64;
        PoolGeom {
            total: w(total),
            channels: w(plane[1]),
            height: w(plane[2]),
            width: w(plane[3]),
            out_height: w(pooled[2]),
            out_width: w(pooled[3]),
            a: KernelStrides::new(a.layout.strides()),
            b: b.map(|b| KernelStrides::new(b.layout.strides())).unwrap_or_default(),
            kernel_h: w(window.kernel[0]),
            kernel_w: w(window.kernel[1]),
            stride_h: w(window.stride[0]),
            stride_w: w(window.stride[1]),
            pad_h: w(window.padding[0]),
            pad_w: w(window.padding[1]),
            dil_h: w(window.dilation[0]),
            dil_w: w(window.dilation[1]),
            include_pad: matches!(
                mode,
                PoolMode::Avg {
                    count_include_pad: true
                }
            ) as i32,
            pad: 0,
        }
    }

    /// `i32` when every value the kernel computes with in its position type fits in an i32 with
    /// room to spare: the items, the plane's flat positions, and per axis the padded size plus
    /// the window's span plus the stride (the largest sum `window_range` forms); else `i64`.
    fn width(&self) -> &'static str {
        let limit = i32::MAX as i64 / 2;
        let axis = |size: i64, pad: i64, kernel: i64, dil: i64, stride: i64, out: i64| {
            let span = kernel.checked_mul(dil);
            let sum = span.and_then(|s| s.checked_add(size + 2 * pad + stride));
            let reach = out.checked_mul(stride);
            matches!((sum, reach), (Some(s), Some(r)) if s <= limit && r <= limit)
        };
        let small = self.total <= limit
            && self.height.checked_mul(self.width).is_some_and(|p| p <= limit)
            && axis(
                self.height,
                self.pad_h,
                self.kernel_h,
                self.dil_h,
                self.stride_h,
                self.out_height,
            )
            && axis(
                self.width,
                self.pad_w,
                self.kernel_w,
                self.dil_w,
                self.stride_w,
                self.out_width,
            );
        if small { "i32" } else { "i64" }
    }
}

/// The kernel for `mode` (forward, or its backward) over `dtype` at position width `width`.
fn kernel_name(mode: PoolMode, backward: bool, dtype: DType, width: &'static str) -> KernelName {
    let kind = mode.kind();
    let op = if backward { kind.backward_name() } else { kind.name() };
    KernelName::new(SourceFile::Pool, [op, dtype.name(), width, ""])
}

/// `Pool2d`: `input` [N, C, H, W] into `out` [N, C, OH, OW] (and, for max, `indices`).
pub(super) fn pool2d(
    backend: &CudaBackend,
    mode: PoolMode,
    window: PoolWindow,
    input: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) -> Result<()> {
    let total = out.layout.numel();
    if total == 0 {
        return Ok(());
    }
    let geom = PoolGeom::new(
        mode,
        window,
        input.layout.shape(),
        out.layout.shape(),
        total,
        input,
        None,
    );
    let kernel = backend
        .modules
        .kernel(kernel_name(mode, false, input.dtype, geom.width()))?;
    let cfg = grid(total as u64, max_blocks(backend, &kernel));
    let (po, pi) = (device_ptr(out), device_ptr(input));
    match mode {
        PoolMode::Max => {
            let px = indices.map_or(0, device_ptr);
            let mut slices = vec![input.buffer, out.buffer];
            slices.extend(indices.map(|i| i.buffer));
            launch_kernel!(backend, kernel, cfg, slices, &po, &px, &pi, &geom)
        }
        PoolMode::Avg { .. } => launch_kernel!(backend, kernel, cfg, [input.buffer, out.buffer], &po, &pi, &geom),
    }
}

/// `Pool2dBackward`: `grad` [N, C, OH, OW] (and, for max, the forward's `indices`) into the
/// input gradient `out` [N, C, H, W].
pub(super) fn pool2d_backward(
    backend: &CudaBackend,
    mode: PoolMode,
    window: PoolWindow,
    grad: &TensorArg,
    indices: Option<&TensorArg>,
    out: &TensorArg,
) -> Result<()> {
    let total = out.layout.numel();
    if total == 0 {
        return Ok(());
    }
    let geom = PoolGeom::new(
        mode,
        window,
        out.layout.shape(),
        grad.layout.shape(),
        total,
        grad,
        indices,
    );
    let kernel = backend
        .modules
        .kernel(kernel_name(mode, true, grad.dtype, geom.width()))?;
    let cfg = grid(total as u64, max_blocks(backend, &kernel));
    let (po, pg) = (device_ptr(out), device_ptr(grad));
    match (mode, indices) {
        (PoolMode::Max, Some(indices)) => {
            let px = device_ptr(indices);
            let slices = [grad.buffer, indices.buffer, out.buffer];
            launch_kernel!(backend, kernel, cfg, slices, &po, &pg, &px, &geom)
        }
        // Validation requires indices for max pooling's backward.
        (PoolMode::Max, None) => Err(cartage_core::Error::invalid(
            mode.kind().backward_name(),
            "max pooling's backward needs the forward's indices (run the forward with indices)",
        )),
        (PoolMode::Avg { .. }, _) => launch_kernel!(backend, kernel, cfg, [grad.buffer, out.buffer], &po, &pg, &geom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_built() {
        let entries = crate::precompiled::entry_names(SourceFile::Pool);
        for dtype in DTYPES {
            for mode in [
                PoolMode::Max,
                PoolMode::Avg {
                    count_include_pad: true,
                },
            ] {
                for backward in [false, true] {
                    for width in ["i32", "i64"] {
                        let symbol = kernel_name(mode, backward, dtype, width).symbol();
                        assert!(entries.contains(&symbol.as_str()), "{symbol} is not built");
                    }
                }
            }
        }
    }

    #[test]
    fn pool_geom_matches_the_c_layout() {
        // 6 × i64, 2 × Strides, 8 × i64, 2 × i32.
        let geom = std::mem::size_of::<PoolGeom>();
        assert_eq!(geom, 48 + 128 + 64 + 8);
        // (out, indices, input, geom), (out, input, geom), (out, grad, indices, geom),
        // (out, grad, geom), as the launches push them.
        let params = |mode, backward| {
            let name = kernel_name(mode, backward, DType::BF16, "i64");
            super::super::ptx_param_bytes(name.file, &name.symbol())
        };
        let avg = PoolMode::Avg {
            count_include_pad: false,
        };
        assert_eq!(params(PoolMode::Max, false), [8, 8, 8, geom]);
        assert_eq!(params(avg, false), [8, 8, geom]);
        assert_eq!(params(PoolMode::Max, true), [8, 8, 8, geom]);
        assert_eq!(params(avg, true), [8, 8, geom]);
    }

    #[test]
    fn the_position_width_follows_the_sizes() {
        let window = PoolWindow::new([3, 3], [2, 2], [1, 1]);
        let geom = |plane: [usize; 4], total| {
            let pooled = window.output_size([plane[2], plane[3]]).expect("a window fits");
            let mut g = PoolGeom {
                total,
                channels: plane[1] as i64,
                height: plane[2] as i64,
                width: plane[3] as i64,
                out_height: pooled[0] as i64,
                out_width: pooled[1] as i64,
                ..Default::default()
            };
            (g.kernel_h, g.kernel_w, g.stride_h, g.stride_w) = (3, 3, 2, 2);
            (g.pad_h, g.pad_w, g.dil_h, g.dil_w) = (1, 1, 1, 1);
            g
        };
        // ResNet's stem pooling: 32 × 64 × 112 × 112 → 56 × 56.
        assert_eq!(geom([32, 64, 112, 112], 32 * 64 * 56 * 56).width(), "i32");
        // More work items than an i32 holds.
        assert_eq!(geom([1024, 1024, 112, 112], 1024 * 1024 * 56 * 56).width(), "i64");
        // Few items over a plane whose flat positions pass 2^31 (a stride of 2^29 columns).
        let mut wide = geom([1, 1, 3, 1 << 31], 8);
        (wide.stride_w, wide.out_width) = (1 << 29, 4);
        assert_eq!(wide.width(), "i64");
        // One whose positions fit but whose window arithmetic does not.
        let mut reach = geom([1, 1, 3, 3], 2);
        (reach.stride_w, reach.out_width) = (1 << 30, 1);
        assert_eq!(reach.width(), "i64");
    }
}
