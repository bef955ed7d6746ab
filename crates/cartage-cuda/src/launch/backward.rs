//! The fused backward kernels of softmax and the norms ([`cartage_core::Kernel::SoftmaxBackward`],
//! [`cartage_core::Kernel::NormBackward`]) with the row machinery of [`super::rows`], over a
//! pair of rows: the forward's values and the incoming gradient.
//!
//! Rows that are dense and 16-byte aligned in all three operands (and the weight) are held in
//! registers ([`held_plan`]: the layouts of the forward's [`super::rows`] plan, with half its
//! register budget per row since two rows are held); longer dense rows are streamed in 16-byte
//! vectors by a block per row; any other rows take the strided kernels (a warp per row below 1024
//! elements, else a block), which read their operands in place.

use cartage_core::{DType, NormBackwardArgs, NormKind, Result, TensorArg};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::geometry::{Coalesced, KernelShape, KernelStrides, THREADS};
use super::rows::{LONG_BLOCK, Plan, plan_config, vector_name};
use super::{aligned16, device_ptr, lanes, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The dtypes the fused backward kernels are built for (`backward.cu`).
pub(crate) const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `struct GradGeom` of backward.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GradGeom {
    rows: u64,
    cols: u64,
    rows_shape: KernelShape,
    rows_a: KernelStrides,
    rows_g: KernelStrides,
    rows_out: KernelStrides,
    a_stride: i64,
    g_stride: i64,
    out_stride: i64,
    w_stride: i64,
    eps: f64,
    pub group: i32,
    flag: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for GradGeom {}

/// The register layout of a pair of dense rows of `cols` elements of `dtype`, or `None` when a
/// row is not a whole number of 16-byte vectors or too long to hold.
///
/// As the forward's plan, but each thread holds at most 64 bytes of compute values of each row
/// (16 f32, 8 f64), 128 in all: V ≤ 4 vectors of f32 or f64, V ≤ 2 of f16 or bf16. A group of a
/// warp or less shares a 256-thread block; a larger group (up to 512) is the block. Rows of up to
/// 8192 elements are held.
pub(super) fn held_plan(cols: usize, dtype: DType) -> Option<Plan> {
    let n = lanes(dtype) as usize;
    if cols == 0 || !cols.is_multiple_of(n) {
        return None;
    }
    let nv = cols / n;
    let compute_bytes = if dtype == DType::F64 { 8 } else { 4 };
    let most = (64 / (n * compute_bytes)).clamp(1, 4);
    let group = nv.div_ceil(most).next_power_of_two().clamp(2, 512);
    let vectors = nv.div_ceil(group).next_power_of_two();
    let block = if group <= 32 { 256 } else { group };
    // The kernels' launch bounds (backward.cu): V1 256 threads, V2 and V4 512.
    let bound = if vectors == 1 { 256 } else { 512 };
    (vectors <= most && block <= bound).then_some(Plan {
        group: group as u32,
        block: block as u32,
        vectors: vectors as u32,
    })
}

/// How a row pair is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// Held in registers with this layout (`_v<V>` kernels).
    Held(Plan),
    /// Dense but too long to hold: a block per row, 16-byte vectors (`_long`).
    Long,
    /// Any strides (`_strided`).
    Strided,
}

/// The operands of one backward launch: the forward's values `a`, the incoming gradient `g`, the
/// optional 1-D weight and the output, with the reduced dimension `dim`.
pub(super) struct Rows<'a> {
    pub a: &'a TensorArg,
    pub g: &'a TensorArg,
    pub weight: Option<&'a TensorArg>,
    pub out: &'a TensorArg,
    pub dim: usize,
}

impl Rows<'_> {
    /// The rows of the three row operands, coalesced, and their number.
    pub(super) fn geometry(&self, op: &'static str) -> Result<(Coalesced, u64)> {
        let kept: Vec<usize> = (0..self.a.layout.rank()).filter(|&d| d != self.dim).collect();
        let pick = |v: &[usize]| kept.iter().map(|&d| v[d]).collect::<Vec<_>>();
        let rows_c = Coalesced::new(
            &pick(self.a.layout.shape()),
            &[
                &pick(self.a.layout.strides()),
                &pick(self.g.layout.strides()),
                &pick(self.out.layout.strides()),
            ],
        );
        rows_c.check_rank(op)?;
        let rows = kept.iter().map(|&d| self.a.layout.shape()[d] as u64).product();
        Ok((rows_c, rows))
    }

    /// Registers when every row is a whole number of 16-byte vectors, dense and aligned in every
    /// operand (the weight too) and short enough to hold; the streaming kernel when it is too
    /// long; else the strided kernel.
    pub(super) fn path(&self, rows_c: &Coalesced) -> Path {
        let dtype = self.a.dtype;
        let (n, cols) = (lanes(dtype) as usize, self.a.layout.shape()[self.dim]);
        let mut all = vec![self.a, self.g, self.out];
        all.extend(self.weight);
        let dense = cols > 0
            && cols.is_multiple_of(n)
            && [self.a, self.g, self.out]
                .iter()
                .all(|arg| arg.layout.strides()[self.dim] == 1)
            && self.weight.is_none_or(|w| w.layout.strides()[0] == 1)
            && rows_c.strides.iter().flatten().all(|s| s.is_multiple_of(n))
            && aligned16(&all);
        if !dense {
            return Path::Strided;
        }
        held_plan(cols, dtype).map_or(Path::Long, Path::Held)
    }

    /// The geometry the kernels take (`group` and `flag` are the caller's).
    pub(super) fn geom(&self, rows_c: &Coalesced, rows: u64, eps: f64, flag: i32) -> GradGeom {
        GradGeom {
            rows,
            cols: self.a.layout.shape()[self.dim] as u64,
            rows_shape: rows_c.shape(),
            rows_a: rows_c.strides(0),
            rows_g: rows_c.strides(1),
            rows_out: rows_c.strides(2),
            a_stride: self.a.layout.strides()[self.dim] as i64,
            g_stride: self.g.layout.strides()[self.dim] as i64,
            out_stride: self.out.layout.strides()[self.dim] as i64,
            w_stride: self.weight.map_or(0, |w| w.layout.strides()[0] as i64),
            eps,
            group: 0,
            flag,
        }
    }
}

/// The kernel-name suffix, group and launch shape of `path` over `rows` rows of `cols`.
fn launch_shape(backend: &CudaBackend, path: Path, rows: u64, cols: u64) -> (&'static str, i32, LaunchConfig) {
    match path {
        Path::Held(p) => (vector_name(p.vectors), p.group as i32, plan_config(backend, rows, p)),
        Path::Long => {
            let cfg = LaunchConfig {
                grid_dim: (rows.clamp(1, backend.sm_count as u64 * 2) as u32, 1, 1),
                block_dim: (LONG_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            ("long", LONG_BLOCK as i32, cfg)
        }
        Path::Strided => {
            let group = if cols >= 1024 { THREADS } else { 32 };
            let p = Plan {
                group,
                block: THREADS,
                vectors: 1,
            };
            ("strided", group as i32, plan_config(backend, rows, p))
        }
    }
}

/// `softmax_backward_<dtype>_<v1|v2|v4|long|strided>`.
fn softmax_name(dtype: DType, suffix: &'static str) -> KernelName {
    KernelName::new(SourceFile::Backward, ["softmax_backward", dtype.name(), suffix, ""])
}

/// `norm_backward_<layer|rms>_<dtype>_<v1|v2|v4|long|strided>`.
fn norm_name(kind: NormKind, dtype: DType, suffix: &'static str) -> KernelName {
    let kind = match kind {
        NormKind::Layer => "layer",
        NormKind::Rms => "rms",
    };
    KernelName::new(SourceFile::Backward, ["norm_backward", kind, dtype.name(), suffix])
}

/// The input gradient of softmax (`log`: log-softmax) along `dim` from the forward's `output`.
pub(super) fn softmax_backward(
    backend: &CudaBackend,
    output: &TensorArg,
    grad: &TensorArg,
    dim: usize,
    log: bool,
    out: &TensorArg,
) -> Result<()> {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let rows = Rows {
        a: output,
        g: grad,
        weight: None,
        out,
        dim,
    };
    let (rows_c, count) = rows.geometry(op)?;
    let cols = output.layout.shape()[dim] as u64;
    if count == 0 || cols == 0 {
        return Ok(());
    }
    let path = rows.path(&rows_c);
    let (suffix, group, cfg) = launch_shape(backend, path, count, cols);
    let mut geom = rows.geom(&rows_c, count, 0.0, log as i32);
    geom.group = group;
    let kernel = backend.modules.kernel(softmax_name(output.dtype, suffix))?;
    let (py, pg, po) = (device_ptr(output), device_ptr(grad), device_ptr(out));
    launch_kernel!(
        backend,
        kernel,
        cfg,
        [output.buffer, grad.buffer, out.buffer],
        &py,
        &pg,
        &po,
        &geom
    )
}

/// The gradients of layer or RMS norm over the last dimension: the input's alone here, with the
/// weight's or bias's too in [`super::norm_grads`].
pub(super) fn norm_backward(backend: &CudaBackend, a: &NormBackwardArgs) -> Result<()> {
    if a.grad_weight.is_some() || a.grad_bias.is_some() {
        return super::norm_grads::norm_grads(backend, a);
    }
    let (kind, input, weight, grad, out) = (a.kind, &a.input, a.weight.as_ref(), &a.grad, &a.grad_input);
    let dim = input.layout.rank() - 1;
    let rows = Rows {
        a: input,
        g: grad,
        weight,
        out,
        dim,
    };
    let (rows_c, count) = rows.geometry(norm_op(kind))?;
    let cols = input.layout.shape()[dim] as u64;
    if count == 0 || cols == 0 {
        return Ok(());
    }
    let path = rows.path(&rows_c);
    let (suffix, group, cfg) = launch_shape(backend, path, count, cols);
    let mut geom = rows.geom(&rows_c, count, a.eps, weight.is_some() as i32);
    geom.group = group;
    let kernel = backend.modules.kernel(norm_name(kind, input.dtype, suffix))?;
    let (px, pw, pg, po) = (
        device_ptr(input),
        weight.map_or(0, device_ptr),
        device_ptr(grad),
        device_ptr(out),
    );
    let mut slices = vec![input.buffer, grad.buffer, out.buffer];
    slices.extend(weight.map(|w| w.buffer));
    launch_kernel!(backend, kernel, cfg, slices, &px, &pw, &pg, &po, &geom)
}

/// The op's name for errors.
pub(super) fn norm_op(kind: NormKind) -> &'static str {
    match kind {
        NormKind::Layer => "layer_norm_backward",
        NormKind::Rms => "rms_norm_backward",
    }
}

#[cfg(test)]
mod tests {
    use cartage_core::allocator::testing::MockSource;
    use cartage_core::{AllocatorConfig, CachingAllocator, Device, Layout};

    use super::*;

    #[test]
    fn held_plans_cover_their_rows_within_the_launch_bounds() {
        let layout = |cols, dtype| held_plan(cols, dtype).map(|p| (p.group, p.block, p.vectors));
        // f32 and f64 rows as the forward holds them; 16-bit rows with twice the lanes.
        assert_eq!(layout(4096, DType::F32), Some((256, 256, 4)));
        assert_eq!(layout(4096, DType::BF16), Some((256, 256, 2)));
        assert_eq!(layout(1024, DType::F64), Some((128, 128, 4)));
        assert_eq!(layout(64, DType::F32), Some((4, 256, 4)));
        assert_eq!(layout(8, DType::BF16), Some((2, 256, 1)));
        assert_eq!(layout(8192, DType::F16), Some((512, 512, 2)));
        assert_eq!(layout(16384, DType::BF16), None);
        assert_eq!(layout(16384, DType::F32), None);
        assert_eq!(layout(4097, DType::F32), None);
        assert_eq!(layout(0, DType::F32), None);
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let n = lanes(dtype) as usize;
            let compute = if dtype == DType::F64 { 8 } else { 4 };
            for nv in 1..=2048 {
                let cols = nv * n;
                let Some(p) = held_plan(cols, dtype) else {
                    assert!(cols > 4096, "{cols} {dtype} not held");
                    continue;
                };
                let held = p.group as usize * p.vectors as usize * n;
                let bytes = p.vectors as usize * n * compute;
                let bound = if p.vectors == 1 { 256 } else { 512 };
                assert!(held >= cols && held < 2 * cols.max(2 * n), "{cols} {dtype}: {p:?}");
                assert!(bytes <= 64 && p.block <= bound, "{cols} {dtype}: {p:?}");
                let block = if p.group <= 32 { 256 } else { p.group };
                assert!(p.group.is_power_of_two() && p.block == block, "{cols} {dtype}: {p:?}");
            }
        }
    }

    /// Every kernel a plan can pick is in the committed PTX (and so in the source).
    #[test]
    fn every_planned_kernel_exists() {
        let entries = crate::precompiled::entry_names(SourceFile::Backward);
        for dtype in DTYPES {
            let mut suffixes: Vec<&'static str> = (1..=20_000)
                .filter_map(|cols| held_plan(cols, dtype))
                .map(|p| vector_name(p.vectors))
                .collect();
            suffixes.sort_unstable();
            suffixes.dedup();
            assert!(suffixes.len() >= 2, "{dtype}: {suffixes:?}");
            suffixes.extend(["long", "strided"]);
            for suffix in suffixes {
                let names = [
                    softmax_name(dtype, suffix),
                    norm_name(NormKind::Layer, dtype, suffix),
                    norm_name(NormKind::Rms, dtype, suffix),
                ];
                for name in names {
                    assert!(
                        entries.contains(&name.symbol().as_str()),
                        "{} is not built",
                        name.symbol()
                    );
                }
            }
        }
    }

    #[test]
    fn grad_geom_matches_the_c_layout() {
        // 2 × u64, Shape (80), 3 × Strides (64), 4 × i64, f64, 2 × i32.
        let geom = std::mem::size_of::<GradGeom>();
        assert_eq!(geom, 16 + 80 + 3 * 64 + 32 + 8 + 8);
        // The kernels take what the launches push: (y, g, out, geom) and (x, w, g, out, geom).
        let params = |name: KernelName| super::super::ptx_param_bytes(name.file, &name.symbol());
        assert_eq!(params(softmax_name(DType::F32, "v4")), [8, 8, 8, geom]);
        assert_eq!(params(softmax_name(DType::BF16, "strided")), [8, 8, 8, geom]);
        assert_eq!(params(norm_name(NormKind::Rms, DType::F16, "long")), [8, 8, 8, 8, geom]);
        assert_eq!(params(norm_name(NormKind::Layer, DType::F64, "v4")), [8, 8, 8, 8, geom]);
    }

    /// A view of `shape` with `strides` at element `offset`, in a block of the pretend device
    /// (blocks start 512-byte aligned, as on a real one).
    fn arg(memory: &CachingAllocator, shape: &[usize], strides: &[usize], offset: usize, dtype: DType) -> TensorArg {
        let layout = Layout::from_parts(shape, strides, offset).expect("layout");
        let bytes = layout.checked_extent().expect("extent") * dtype.size_in_bytes();
        TensorArg {
            buffer: memory.alloc(bytes).expect("a block").slice(),
            layout,
            dtype,
        }
    }

    fn path_of(a: &TensorArg, g: &TensorArg, out: &TensorArg, weight: Option<&TensorArg>, dim: usize) -> Path {
        let rows = Rows { a, g, weight, out, dim };
        let (rows_c, _) = rows.geometry("test").expect("geometry");
        rows.path(&rows_c)
    }

    #[test]
    fn rows_take_registers_streaming_or_strides() {
        let memory = CachingAllocator::new(
            Device::cuda(0),
            Box::new(MockSource::new(1 << 30)),
            AllocatorConfig::default(),
        );
        let dense = |cols| arg(&memory, &[3, cols], &[cols, 1], 0, DType::F32);
        let held = |cols: usize| {
            let d = dense(cols);
            path_of(&d, &d, &d, None, 1)
        };
        assert!(matches!(held(4096), Path::Held(p) if (p.group, p.block, p.vectors) == (256, 256, 4)));
        assert!(matches!(held(64), Path::Held(p) if p.group == 4 && p.vectors == 4));
        // Longer than 512 threads × 4 vectors: streamed.
        assert_eq!(held(16384), Path::Long);
        // Not a whole number of vectors, a transposed gradient, an unaligned output.
        assert_eq!(held(4097), Path::Strided);
        let d = dense(64);
        let t = arg(&memory, &[3, 64], &[1, 3], 0, DType::F32);
        assert_eq!(path_of(&d, &t, &d, None, 1), Path::Strided);
        let shifted = arg(&memory, &[3, 64], &[64, 1], 1, DType::F32);
        assert_eq!(path_of(&d, &d, &shifted, None, 1), Path::Strided);
        // Rows padded to a whole number of vectors stay in registers; padded otherwise do not.
        let padded = arg(&memory, &[3, 64], &[68, 1], 0, DType::F32);
        assert!(matches!(path_of(&d, &d, &padded, None, 1), Path::Held(_)));
        let odd = arg(&memory, &[3, 64], &[65, 1], 0, DType::F32);
        assert_eq!(path_of(&d, &d, &odd, None, 1), Path::Strided);
        // Along dim 0 the rows are strided.
        assert_eq!(path_of(&d, &d, &d, None, 0), Path::Strided);
        // A strided weight sends the norm to the strided kernel; a dense one keeps registers.
        let w = arg(&memory, &[64], &[2], 0, DType::F32);
        assert_eq!(path_of(&d, &d, &d, Some(&w), 1), Path::Strided);
        let w = arg(&memory, &[64], &[1], 0, DType::F32);
        assert!(matches!(path_of(&d, &d, &d, Some(&w), 1), Path::Held(_)));
    }
}
