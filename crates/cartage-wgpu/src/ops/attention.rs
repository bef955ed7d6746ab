//! Fused scaled dot-product attention (`Kernel::Attention`, `shaders/attention.wgsl`): a
//! FlashAttention-2-style forward, one workgroup per batch entry and tile of query rows, the
//! key and value tiles staged in workgroup memory and an online softmax in f32, the output
//! written once and, when asked, each row's log-sum-exp (what the fused backward,
//! [`super::attention_backward`], recomputes the probabilities from).
//!
//! f32, f16 and bf16 (the half types unpacked to f32 on load, computed in f32 and rounded once
//! on store, as every kernel of this backend), head dims 1 to [`MAX_HEAD_DIM`] for keys and
//! values independently, q, k and v read in place through any strides. Tile sizes are picked
//! per head dim from the adapter's workgroup-memory and invocation limits ([`Tiles`]); anything
//! else (f64, wider heads, an adapter too small for the smallest tiling) is refused with
//! [`Error::Unsupported`], so that the frontend composes the result instead.
//!
//! With an additive mask ([`AttentionMask`], [`super::attention_mask`]) a variant of the kernel
//! adds `mask[b / inner, b % inner, i, j]` to each score it keeps after the causal cut, read in
//! place through the mask's strides (0 for a broadcast dimension) and offset; −inf removes a
//! key. A row whose keys are all removed is written as 0 with a log-sum-exp of −inf (unmasked,
//! a row that sees no key, S = 0, stays 0 / 0 = NaN). The unmasked kernel reads no mask and is
//! built without one; the masked one binds one more storage buffer, refused with
//! [`Error::Unsupported`] on an adapter that allows too few.

use cartage_core::kernel::AttentionMask;
use cartage_core::{DType, Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::attention_mask::{self, MaskSlot};
use crate::ops::geometry::grid;
use crate::wgsl;

const ATTENTION: &str = include_str!("../../shaders/attention.wgsl");
/// The parameter block and operand addressing shared by the attention kernels.
pub(crate) const PARAMS: &str = include_str!("../../shaders/attention_params.wgsl");

/// The widest head dim (E or Ev) the kernels take: their per-invocation accumulators live in
/// registers, a chunk of four columns per invocation and `TPR` invocations per row.
pub(crate) const MAX_HEAD_DIM: usize = 128;

/// The dtypes the kernels are built for (f64 is refused: Vulkan has no f64 `exp`).
pub(crate) const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The sizes of one attention call: q [batch, l, e], k [batch, s, e], v [batch, s, ev].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub batch: usize,
    pub l: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
}

impl Dims {
    /// The sizes of `q`, `k` and `v` (validated, rank 3).
    pub fn of(q: &TensorArg, k: &TensorArg, v: &TensorArg) -> Dims {
        let (qs, ks, vs) = (q.layout.shape(), k.layout.shape(), v.layout.shape());
        Dims {
            batch: qs[0],
            l: qs[1],
            s: ks[1],
            e: qs[2],
            ev: vs[2],
        }
    }

    /// Four-column chunks of E and of Ev.
    fn chunks(&self) -> (u32, u32) {
        (self.e.div_ceil(4) as u32, self.ev.div_ceil(4) as u32)
    }
}

/// One operand as a kernel addresses it: its binding window, the element offset of its
/// `[0, 0, 0]` inside it, and its batch, row and column strides in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub window: Window,
    pub offset: usize,
    pub strides: [usize; 3],
}

impl Slot {
    /// `arg` bound for `op`.
    pub fn bind(backend: &WgpuBackend, arg: &TensorArg, op: &str) -> Result<Slot> {
        let bound = bind_operand(&backend.ctx, &backend.table, arg, op, None)?;
        let st = arg.layout.strides();
        let strides = match st.len() {
            3 => [st[0], st[1], st[2]],
            // The [B, L] log-sum-exp rows: one row per batch entry.
            2 => [st[0], st[1], 0],
            // No other rank reaches here (the kernels' operands are validated).
            _ => [0, 0, 0],
        };
        Ok(Slot {
            window: bound.window,
            offset: bound.element_offset as usize,
            strides,
        })
    }

    /// A contiguous `[batch, rows, cols]` block at the start of `window`.
    pub fn dense(window: Window, rows: usize, cols: usize) -> Slot {
        Slot {
            window,
            offset: 0,
            strides: [rows * cols, cols, 1],
        }
    }
}

/// The window of a scratch allocation (whole, rounded up to 16 bytes), refused with
/// [`Error::Unsupported`] where it is larger than one storage binding may be.
pub(crate) fn scratch_window(
    backend: &WgpuBackend,
    op: &str,
    slice: &cartage_core::raw::BufferSlice,
) -> Result<Window> {
    let size = (slice.len() as u64).div_ceil(16) * 16;
    if size > backend.ctx.max_binding() {
        return Err(Error::unsupported_feature(
            op,
            backend.ctx.cartage_device,
            format!(
                "the fused attention backward needs a scratch of {} in one binding, and this adapter binds at \
                 most {} (max_storage_buffer_binding_size); the frontend composes it",
                cartage_core::format_bytes(size),
                cartage_core::format_bytes(backend.ctx.max_binding())
            ),
        ));
    }
    Ok(Window {
        segment: slice.segment().id,
        offset: slice.offset() as u64,
        size,
    })
}

/// A kernel's tiling: `outer` rows (query rows, or keys for the backward's key kernel) per
/// workgroup, `inner` rows of the other operand per streamed tile, `per` invocations per outer
/// row (so `outer · per` per workgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiles {
    pub outer: u32,
    pub inner: u32,
    pub per: u32,
}

impl Tiles {
    /// `outer` rows per workgroup, `inner` per streamed tile, `per` invocations per outer row.
    pub(crate) const fn new(outer: u32, inner: u32, per: u32) -> Tiles {
        Tiles { outer, inner, per }
    }

    /// Invocations per workgroup.
    pub fn threads(&self) -> u32 {
        self.outer * self.per
    }

    /// The first of `candidates` whose workgroup memory (`bytes`) and invocations fit `limits`.
    pub fn pick(candidates: &[Tiles], limits: &wgpu::Limits, bytes: impl Fn(Tiles) -> u32) -> Option<Tiles> {
        candidates.iter().copied().find(|t| {
            t.threads() <= limits.max_compute_invocations_per_workgroup
                && t.threads() <= limits.max_compute_workgroup_size_x
                && bytes(*t) <= limits.max_compute_workgroup_storage_size
        })
    }
}

/// Forward tilings, largest first: query rows per workgroup, keys per tile, invocations per
/// row (keys per tile a multiple of it).
const FORWARD_TILES: [Tiles; 7] = [
    Tiles::new(32, 32, 4),
    Tiles::new(32, 16, 4),
    Tiles::new(16, 16, 4),
    Tiles::new(16, 8, 4),
    Tiles::new(8, 8, 4),
    Tiles::new(8, 4, 4),
    Tiles::new(4, 4, 4),
];

/// The row stride in workgroup memory of a tile `chunks` four-column chunks wide: odd, so that
/// rows read at once by the invocations of a warp fall in different banks.
pub(crate) fn padded(chunks: u32) -> u32 {
    chunks | 1
}

/// Workgroup memory of the forward: the query tile, one key-or-value tile, the probabilities
/// (rows of `inner + 1`) and one value per invocation.
fn forward_bytes(t: Tiles, e4: u32, ev4: u32) -> u32 {
    16 * (t.outer * padded(e4) + t.inner * padded(e4.max(ev4))) + 4 * (t.outer * (t.inner + 1) + t.threads())
}

/// The forward's tiling for these head dims on this adapter.
pub(crate) fn forward_tiles(limits: &wgpu::Limits, d: &Dims) -> Option<Tiles> {
    let (e4, ev4) = d.chunks();
    Tiles::pick(&FORWARD_TILES, limits, |t| forward_bytes(t, e4, ev4))
}

/// Refuse what the kernels do not take: dtypes other than [`DTYPES`], head dims of 0 or past
/// [`MAX_HEAD_DIM`].
pub(crate) fn check_supported(backend: &WgpuBackend, op: &str, dtype: DType, d: &Dims) -> Result<()> {
    let refuse = |reason: String| Error::unsupported(op, dtype, backend.ctx.cartage_device, reason);
    if !DTYPES.contains(&dtype) {
        return Err(refuse(format!(
            "the fused attention kernels take f32, f16 and bf16, not {dtype}; the frontend composes it"
        )));
    }
    if d.e == 0 || d.ev == 0 || d.e > MAX_HEAD_DIM || d.ev > MAX_HEAD_DIM {
        return Err(refuse(format!(
            "the fused attention kernels take head dims 1 to {MAX_HEAD_DIM}, got E = {}, Ev = {}; \
             the frontend composes it",
            d.e, d.ev
        )));
    }
    Ok(())
}

/// Refuse operands with two batch dimensions ([B1, B2, rows, E], `Kernel::Attention`'s contract
/// allows them): the shaders read one batch stride, so the frontend copies them into [B, L, E].
pub(crate) fn check_one_batch_dim(backend: &WgpuBackend, op: &str, q: &TensorArg) -> Result<()> {
    if q.layout.rank() == 3 {
        return Ok(());
    }
    Err(Error::unsupported(
        op,
        q.dtype,
        backend.ctx.cartage_device,
        format!(
            "the fused attention shaders read one batch stride, [B, L, E]; got q {:?} with two batch \
             dimensions (the frontend copies it into [B, L, E])",
            q.layout.shape()
        ),
    ))
}

/// The refusal for an adapter whose limits fit no tiling.
pub(crate) fn no_tiling(backend: &WgpuBackend, op: &str, dtype: DType, d: &Dims) -> Error {
    let limits = &backend.ctx.limits;
    Error::unsupported(
        op,
        dtype,
        backend.ctx.cartage_device,
        format!(
            "no attention tiling for head dims E = {}, Ev = {} fits this adapter's {} bytes of \
             workgroup memory and {} invocations per workgroup; the frontend composes it",
            d.e, d.ev, limits.max_compute_workgroup_storage_size, limits.max_compute_invocations_per_workgroup
        ),
    )
}

/// The parameter block: sizes, causal flag and scale, then each slot's offset and strides, and
/// the additive mask's addressing when there is one.
pub(crate) fn params(
    d: &Dims,
    tiles: usize,
    causal: bool,
    scale: f64,
    slots: &[Slot],
    mask: Option<&MaskSlot>,
) -> Result<ParamBlock> {
    let mut p = ParamBlock::default();
    p.put_sizes(0, &[d.batch, d.l, d.s, tiles], "attention size")?;
    let rows = d.batch.saturating_mul(d.l);
    p.put_sizes(7, &[rows], "attention rows")?;
    let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
    p.put(4, &[u32::from(causal), scale_log2.to_bits(), (scale as f32).to_bits()]);
    for (k, s) in slots.iter().enumerate() {
        p.put_sizes(
            8 + 4 * k,
            &[s.offset, s.strides[0], s.strides[1], s.strides[2]],
            "attention stride",
        )?;
    }
    if let Some(mask) = mask {
        mask.put(&mut p)?;
    }
    Ok(p)
}

/// Check that `groups` workgroups fit the kernels' 32-bit workgroup index.
pub(crate) fn check_groups(groups: usize) -> Result<()> {
    crate::ops::geometry::word(groups, "attention workgroup count").map(|_| ())
}

/// `fn chunk_NAME(b, row, c) -> vec4<f32>`: columns 4c..4c+3 (zero past `width`) of row `row`
/// of batch entry `b` of the operand in `slot`, loaded with `ld_NAME`.
pub(crate) fn chunk_fn(name: &str, slot: u32, width: &str) -> String {
    format!(
        "fn chunk_{name}(b: u32, row: u32, c: u32) -> vec4<f32> {{
    var v = vec4<f32>();
    let base = at({slot}u, b, row, 0u);
    let step = P.ops[{slot}u].w;
    for (var x = 0u; x < 4u; x = x + 1u) {{
        let col = 4u * c + x;
        if col < {width} {{
            v[x] = ld_{name}(base + col * step);
        }}
    }}
    return v;
}}
"
    )
}

/// The binding declaration of an output of `dtype` (packed half types as atomic words).
pub(crate) fn out_binding(binding: u32, name: &str, dtype: DType) -> String {
    let element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    wgsl::binding(binding, name, element)
}

/// `fn st_NAME(e: u32, v: f32)` storing element `e` of an output of `dtype` in `buf`, and
/// `fn st4_NAME(e: u32, y: vec4<f32>, n: u32)` storing the first `n` of four consecutive
/// elements from `e` (outputs are contiguous). A packed half type takes whole words where the
/// invocation owns both halves (an even `e`, four elements), and an atomic replacement of its
/// half elsewhere (the neighbour may belong to another invocation).
pub(crate) fn store_fns(name: &str, buf: &str, dtype: DType) -> String {
    if !wgsl::packed(dtype) {
        return format!(
            "{single}fn st4_{name}(e: u32, y: vec4<f32>, n: u32) {{
    for (var x = 0u; x < n; x = x + 1u) {{
        {buf}[e + x] = y[x];
    }}
}}
",
            single = wgsl::store_fn(&format!("st_{name}"), buf, dtype)
        );
    }
    format!(
        "{enc}fn st_{name}(e: u32, v: f32) {{
    let w = e >> 1u;
    let shift = (e & 1u) * 16u;
    atomicAnd(&{buf}[w], ~(0xffffu << shift));
    atomicOr(&{buf}[w], enc_{name}(v) << shift);
}}
fn st4_{name}(e: u32, y: vec4<f32>, n: u32) {{
    if (e & 1u) == 0u && n == 4u {{
        atomicStore(&{buf}[e >> 1u], enc_{name}(y.x) | (enc_{name}(y.y) << 16u));
        atomicStore(&{buf}[(e >> 1u) + 1u], enc_{name}(y.z) | (enc_{name}(y.w) << 16u));
        return;
    }}
    for (var x = 0u; x < n; x = x + 1u) {{
        st_{name}(e + x, y[x]);
    }}
}}
",
        enc = wgsl::encode_fn(&format!("enc_{name}"), dtype)
    )
}

/// The `const` declarations of a kernel's sizes.
pub(crate) fn consts(values: &[(&str, u32)]) -> String {
    values
        .iter()
        .map(|(n, v)| format!("const {n}: u32 = {v}u;\n"))
        .collect()
}

/// Queue `out = softmax(scale · q kᵀ + mask) v` (validated operands), and each row's
/// log-sum-exp into `lse` when given.
pub(crate) fn attention(
    backend: &WgpuBackend,
    [q, k, v]: [&TensorArg; 3],
    scale: f64,
    causal: bool,
    mask: Option<&AttentionMask>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
) -> Result<()> {
    const OP: &str = "attention";
    check_one_batch_dim(backend, OP, q)?;
    let d = Dims::of(q, k, v);
    check_supported(backend, OP, q.dtype, &d)?;
    let tiles = forward_tiles(&backend.ctx.limits, &d).ok_or_else(|| no_tiling(backend, OP, q.dtype, &d))?;
    if mask.is_some() {
        // q, k, v, out, the lse when asked, and the mask.
        attention_mask::check_bindings(backend, OP, q.dtype, 5 + usize::from(lse.is_some()))?;
    }
    if d.batch == 0 || d.l == 0 {
        return Ok(());
    }
    let mut slots = vec![
        Slot::bind(backend, q, OP)?,
        Slot::bind(backend, k, OP)?,
        Slot::bind(backend, v, OP)?,
        Slot::bind(backend, out, OP)?,
    ];
    if let Some(lse) = lse {
        slots.push(Slot::bind(backend, lse, OP)?);
    }
    let mask = mask.map(|m| MaskSlot::bind(backend, m, OP)).transpose()?;
    record_forward(
        backend,
        [q.dtype, out.dtype],
        &d,
        tiles,
        scale,
        causal,
        &slots,
        mask.as_ref(),
    )
}

/// Record the forward over `slots` (q, k, v, out and optionally lse) and the additive `mask`
/// when given, with `tiles`, for inputs of `dtype` and an output of `out_dtype` (the inputs'
/// dtype, or f32 for the backward's own forward).
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_forward(
    backend: &WgpuBackend,
    [dtype, out_dtype]: [DType; 2],
    d: &Dims,
    tiles: Tiles,
    scale: f64,
    causal: bool,
    slots: &[Slot],
    mask: Option<&MaskSlot>,
) -> Result<()> {
    let with_lse = slots.len() == 5;
    let row_tiles = d.l.div_ceil(tiles.outer as usize);
    let groups = d.batch.saturating_mul(row_tiles);
    check_groups(groups)?;
    let params = params(d, row_tiles, causal, scale, slots, mask)?;
    let key = format!(
        "attention|{dtype}|{out_dtype}|{}x{}|{}x{}x{}|{}|{}",
        d.e,
        d.ev,
        tiles.outer,
        tiles.inner,
        tiles.per,
        u8::from(with_lse),
        u8::from(mask.is_some())
    );
    let ctx = &backend.ctx;
    let mut windows: Vec<Window> = slots.iter().map(|s| s.window).collect();
    windows.extend(mask.map(|m| m.window));
    let pipeline = backend.pipelines.try_get(ctx, &key, windows.len(), || {
        forward_source([dtype, out_dtype], d, tiles, with_lse, mask.is_some())
    })?;
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &windows, &params, grid(groups as u64, 1, max_dim))
}

/// The forward's WGSL for the input and output dtypes, head dims and tiling, with or without
/// the log-sum-exp output and the additive mask (bound after every other operand).
fn forward_source(
    [dtype, out_dtype]: [DType; 2],
    d: &Dims,
    t: Tiles,
    with_lse: bool,
    with_mask: bool,
) -> Result<String> {
    let (e4, ev4) = d.chunks();
    let st = wgsl::storage_type(dtype);
    let mut bindings = wgsl::binding(1, "b1", st);
    bindings.push_str(&wgsl::binding(2, "b2", st));
    bindings.push_str(&wgsl::binding(3, "b3", st));
    bindings.push_str(&out_binding(4, "b4", out_dtype));
    let mut accessors = wgsl::load_fn("ld_q", "b1", dtype);
    accessors.push_str(&wgsl::load_fn("ld_k", "b2", dtype));
    accessors.push_str(&wgsl::load_fn("ld_v", "b3", dtype));
    accessors.push_str(&chunk_fn("q", 0, "E"));
    accessors.push_str(&chunk_fn("k", 1, "E"));
    accessors.push_str(&chunk_fn("v", 2, "EV"));
    accessors.push_str(&store_fns("out", "b4", out_dtype));
    let pieces = wgsl::Pieces::parse("shaders/attention.wgsl", ATTENTION);
    let lse = if with_lse {
        bindings.push_str(&wgsl::binding(5, "b5", "f32"));
        accessors.push_str(&wgsl::store_fn("st_lse", "b5", DType::F32));
        pieces.fill("lse", &[])?
    } else {
        String::new()
    };
    let (mask_base, mask_score, empty_row) = if with_mask {
        accessors.push_str(&attention_mask::accessors(5 + u32::from(with_lse), dtype));
        (pieces.fill("mask_base", &[])?, pieces.fill("mask_score", &[])?, "0.0")
    } else {
        (String::new(), String::new(), "nan_f32()")
    };
    let consts = consts(&[
        ("E", d.e as u32),
        ("EV", d.ev as u32),
        ("E4", e4),
        ("EV4", ev4),
        ("ES", padded(e4)),
        ("KVS", padded(e4.max(ev4))),
        ("PS", t.inner + 1),
        ("BR", t.outer),
        ("BC", t.inner),
        ("TPR", t.per),
        ("WG", t.threads()),
        ("KPT", t.inner / t.per),
        ("CPT", ev4.div_ceil(t.per)),
    ]);
    pieces.fill_head(&[
        ("PRELUDE", &wgsl::prelude(false)),
        ("PARAMS", PARAMS),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("CONSTS", &consts),
        ("LSE", &lse),
        ("MASK_BASE", &mask_base),
        ("MASK_SCORE", &mask_score),
        ("EMPTY_ROW", empty_row),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tiling fits the head dims it is picked for, the large ones are picked on an
    /// adapter with 48 KiB of workgroup memory, and downlevel limits (16 KiB) still get one.
    #[test]
    fn tilings_fit_the_limits() {
        let big = wgpu::Limits {
            max_compute_workgroup_storage_size: 49152,
            ..wgpu::Limits::default()
        };
        let small = wgpu::Limits::downlevel_defaults();
        for (e, ev) in [(32, 32), (64, 64), (80, 80), (128, 128), (64, 32), (1, 128)] {
            let d = Dims {
                batch: 1,
                l: 1,
                s: 1,
                e,
                ev,
            };
            let (e4, ev4) = d.chunks();
            for limits in [&big, &small] {
                let t = forward_tiles(limits, &d).expect("a forward tiling");
                assert!(forward_bytes(t, e4, ev4) <= limits.max_compute_workgroup_storage_size);
                assert_eq!(t.inner % t.per, 0, "{t:?}");
            }
        }
        let wide = Dims {
            batch: 1,
            l: 1,
            s: 1,
            e: 128,
            ev: 128,
        };
        assert_eq!(forward_tiles(&big, &wide), Some(Tiles::new(32, 32, 4)));
    }
}
