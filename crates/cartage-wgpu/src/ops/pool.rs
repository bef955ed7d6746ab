//! 2-D max and average pooling and their input gradients (`shaders/pool.wgsl`): one invocation
//! per output element in the forward, one per input element in the backward (a gather over the
//! windows that contain it, so no two invocations add into one element); the input and the
//! incoming gradient read through any strides, the i64 indices stored as word pairs.

use cartage_core::{DType, PoolMode, PoolWindow, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Bound, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::{WORKGROUP, grid, word};
use crate::ops::reduce::store_source;
use crate::wgsl;

const POOL: &str = include_str!("../../shaders/pool.wgsl");

/// Parameter words (see `Params` in `shaders/pool.wgsl`).
mod fields {
    /// Invocations, C, OH, OW.
    pub const COUNT: usize = 0;
    /// H, W, then the kernel, stride, padding and dilation (height, width each).
    pub const PLANE: usize = 4;
    /// 1 when an average divides by the whole window.
    pub const WHOLE: usize = 14;
    /// Element offsets of b1, b2, b3.
    pub const OFFS: usize = 16;
    /// Strides of b1 over N, C, H, W.
    pub const S1: usize = 20;
    /// Strides of b3 over N, C, H, W (the backward's indices).
    pub const S3: usize = 24;
}

/// `Pool2d`: `input` [N, C, H, W] into `out` [N, C, OH, OW] and, for max pooling, `indices`.
pub(crate) fn pool2d(
    backend: &WgpuBackend,
    mode: PoolMode,
    window: PoolWindow,
    input: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) -> Result<()> {
    let name = mode.kind().name();
    if out.layout.numel() == 0 {
        return Ok(());
    }
    let bound = bind(backend, name, input, out, indices)?;
    let params = params(mode, window, input.layout.shape(), out, input, None, &bound)?;
    let body = Body::Forward {
        max: mode == PoolMode::Max,
        indices: indices.is_some(),
    };
    launch(backend, name, out.dtype, body, &bound, &params, out.layout.numel())
}

/// `Pool2dBackward`: `grad` [N, C, OH, OW] (and, for max pooling, the forward's `indices`)
/// into the input gradient `out` [N, C, H, W].
pub(crate) fn pool2d_backward(
    backend: &WgpuBackend,
    mode: PoolMode,
    window: PoolWindow,
    grad: &TensorArg,
    indices: Option<&TensorArg>,
    out: &TensorArg,
) -> Result<()> {
    let name = mode.kind().backward_name();
    if out.layout.numel() == 0 {
        return Ok(());
    }
    let bound = bind(backend, name, grad, out, indices)?;
    let params = params(mode, window, out.layout.shape(), out, grad, indices, &bound)?;
    let body = Body::Backward {
        max: mode == PoolMode::Max,
    };
    launch(backend, name, out.dtype, body, &bound, &params, out.layout.numel())
}

/// The bindings b1 (`read`), b2 (`out`) and, when given, b3 (`indices`); a typed error for an
/// operand past the adapter's binding size.
fn bind(
    backend: &WgpuBackend,
    name: &'static str,
    read: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) -> Result<Vec<Bound>> {
    let mut bound = vec![
        bind_operand(&backend.ctx, &backend.table, read, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
    ];
    if let Some(indices) = indices {
        bound.push(bind_operand(&backend.ctx, &backend.table, indices, name, None)?);
    }
    Ok(bound)
}

/// The parameter block: the input plane `plane` [N, C, H, W] and its window's output size,
/// `out`'s element count as the invocations (the pooled output in the forward, the plane in
/// the backward), the strides of `strided` (the input or the incoming gradient) and of the
/// backward's `indices`.
fn params(
    mode: PoolMode,
    window: PoolWindow,
    plane: &[usize],
    out: &TensorArg,
    strided: &TensorArg,
    indices: Option<&TensorArg>,
    bound: &[Bound],
) -> Result<ParamBlock> {
    // Validation checked that the window fits the plane.
    let [oh, ow] = window.output_size([plane[2], plane[3]]).unwrap_or([0, 0]);
    let PoolWindow {
        kernel,
        stride,
        padding,
        dilation,
    } = window;
    let mut p = ParamBlock::default();
    p.put_sizes(fields::COUNT, &[out.layout.numel(), plane[1], oh, ow], "pooling size")?;
    let sizes = [
        plane[2],
        plane[3],
        kernel[0],
        kernel[1],
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        dilation[0],
        dilation[1],
    ];
    p.put_sizes(fields::PLANE, &sizes, "pooling size")?;
    // Tap rows and columns are computed in the padded plane, the indices are flat in the plane
    // (their high word is 0), and an average may divide by the whole window: all fit 32 bits.
    for axis in 0..2 {
        let far = plane[2 + axis]
            .saturating_add(padding[axis].saturating_mul(2))
            .saturating_add(kernel[axis]);
        word(far, "padded pooling extent")?;
    }
    word(plane[2].saturating_mul(plane[3]), "pooling plane size H·W")?;
    word(kernel[0].saturating_mul(kernel[1]), "pooling window size kh·kw")?;
    let whole = mode
        == PoolMode::Avg {
            count_include_pad: true,
        };
    p.put(fields::WHOLE, &[u32::from(whole)]);
    let offsets: Vec<usize> = bound.iter().map(|b| b.element_offset as usize).collect();
    p.put_sizes(fields::OFFS, &offsets, "element offset")?;
    p.put_sizes(fields::S1, strided.layout.strides(), "stride")?;
    if let Some(indices) = indices {
        p.put_sizes(fields::S3, indices.layout.strides(), "stride")?;
    }
    Ok(p)
}

/// Which kernel of `shaders/pool.wgsl`.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// Max or average pooling, writing the indices or not.
    Forward { max: bool, indices: bool },
    /// The input gradient of max pooling (reading the indices) or of average pooling.
    Backward { max: bool },
}

/// Compile (once) and record the kernel `body` of `dtype` over `invocations` threads.
fn launch(
    backend: &WgpuBackend,
    name: &str,
    dtype: DType,
    body: Body,
    bound: &[Bound],
    params: &ParamBlock,
    invocations: usize,
) -> Result<()> {
    let key = format!("{name}|{dtype}|{body:?}");
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, bound.len(), || source(dtype, body))?;
    let windows: Vec<_> = bound.iter().map(|b| b.window).collect();
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(
        &pipeline,
        &windows,
        params,
        grid(invocations as u64, WORKGROUP, max_dim),
    )
}

/// The WGSL of kernel `body` for `dtype`.
fn source(dtype: DType, body: Body) -> Result<String> {
    let f64 = dtype == DType::F64;
    let t = wgsl::compute_type(dtype);
    let zero = if f64 { "0.0lf" } else { "0.0" };
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    let mut accessors = store_source(dtype);
    let pieces = wgsl::Pieces::parse("shaders/pool.wgsl", POOL);
    let with_indices = matches!(body, Body::Forward { indices: true, .. } | Body::Backward { max: true });
    if with_indices {
        bindings.push_str(&wgsl::binding(3, "b3", "u32"));
    }
    let text = match body {
        Body::Forward { max, indices } => {
            accessors.push_str(&wgsl::load_fn("ld_x", "b1", dtype));
            accessors.push_str(if indices {
                "fn store_index(o: u32, at: u32) { let e = 2u * (P.offs.z + o); b3[e] = at; b3[e + 1u] = 0u; }\n"
            } else {
                "fn store_index(o: u32, at: u32) {}\n"
            });
            if max {
                let is_nan = if f64 { "is_nan_f64" } else { "is_nan_f32" };
                pieces.fill("forward_max", &[("ZERO", zero), ("IS_NAN", is_nan)])?
            } else {
                pieces.fill("forward_avg", &[("ZERO", zero), ("T", t)])?
            }
        }
        Body::Backward { max } => {
            accessors.push_str(&wgsl::load_fn("ld_g", "b1", dtype));
            let term = if max {
                accessors.push_str(&wgsl::load_fn("ld_index", "b3", DType::I64));
                pieces.fill("term_max", &[("T", t), ("ZERO", zero)])?
            } else {
                pieces.fill("term_avg", &[("T", t)])?
            };
            pieces.fill("backward", &[("ZERO", zero), ("TERM", &term)])?
        }
    };
    pieces.fill_head(&[
        ("PRELUDE", &wgsl::prelude(f64)),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("BODY", &text),
    ])
}
