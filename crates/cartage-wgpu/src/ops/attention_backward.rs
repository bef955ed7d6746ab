//! The fused backward of scaled dot-product attention (`Kernel::AttentionBackward`,
//! `shaders/attention_backward.wgsl`), FlashAttention-2 style in three dispatches and no atomics:
//! a per-row pre-pass (`D_i = dO_i · O_i` and the log-sum-exp in base 2 into an f32 scratch of
//! `2·B·L`), a key-tile kernel recomputing the probabilities from q, k and the log-sum-exp and
//! accumulating dK and dV in registers, and a query-tile kernel doing the same for dQ. Nothing
//! of size L × S is stored.
//!
//! The forward's output and log-sum-exp come from [`AttentionBackwardArgs::saved`] when given;
//! otherwise the forward kernel ([`super::attention`]) runs first into scratch (the output in
//! f32, the log-sum-exp straight into the pre-pass's scratch). Dtypes, head dims and
//! adapters the kernels do not take are refused with [`Error::Unsupported`] (the frontend then
//! composes the gradients); so is an adapter with fewer than seven storage bindings per stage
//! (the key kernel binds q, k, v, dO, the scratch, dK and dV), or eight with a mask.
//!
//! With the forward's additive mask ([`AttentionBackwardArgs::mask`], [`super::attention_mask`])
//! the key and query kernels (and the forward when it runs here) are built in a variant that
//! adds the mask to each recomputed score, read in place through its strides and offset; the
//! mask's own gradient is not computed. A query row every key of which is removed (log-sum-exp
//! −inf) recomputes P = 0 for every key (the pre-pass stores its base-2 log-sum-exp as +inf)
//! and adds nothing to any gradient; its dQ row is 0. The unmasked kernels are unchanged.

use cartage_core::kernel::AttentionBackwardArgs;
use cartage_core::{Backend, DType, Error, Result};

use crate::backend::WgpuBackend;
use crate::bindings::Window;
use crate::ops::attention::{
    Dims, PARAMS, Slot, Tiles, check_groups, check_supported, chunk_fn, consts, forward_tiles, no_tiling, out_binding,
    padded, params, record_forward, scratch_window, store_fns,
};
use crate::ops::attention_mask::{self, MaskSlot};
use crate::ops::geometry::grid;
use crate::wgsl;

const ATTENTION_BACKWARD: &str = include_str!("../../shaders/attention_backward.wgsl");

const OP: &str = "attention_backward";

/// Storage bindings of the key kernel.
const KEY_BINDINGS: u32 = 7;

/// Key-kernel tilings, largest first: keys per workgroup, query rows per streamed tile,
/// invocations per key (query rows per tile a multiple of it).
const KEY_TILES: [Tiles; 6] = [
    Tiles::new(32, 32, 4),
    Tiles::new(16, 16, 8),
    Tiles::new(16, 16, 4),
    Tiles::new(8, 8, 4),
    Tiles::new(8, 4, 4),
    Tiles::new(4, 4, 4),
];

/// Query-kernel tilings, largest first: query rows per workgroup, keys per streamed tile,
/// invocations per row (keys per tile a multiple of it).
const QUERY_TILES: [Tiles; 7] = [
    Tiles::new(32, 32, 4),
    Tiles::new(32, 16, 4),
    Tiles::new(32, 8, 4),
    Tiles::new(16, 16, 8),
    Tiles::new(16, 8, 4),
    Tiles::new(8, 8, 4),
    Tiles::new(4, 4, 4),
];

/// Workgroup memory of the key kernel: key and value tiles, query and dO tiles (rows padded,
/// [`padded`]), P and dS (rows of `inner + 1`), lse₂ and D.
fn key_bytes(t: Tiles, e4: u32, ev4: u32) -> u32 {
    16 * (t.outer + t.inner) * (padded(e4) + padded(ev4)) + 4 * (2 * t.outer * (t.inner + 1) + 2 * t.inner)
}

/// Workgroup memory of the query kernel: query and dO tiles, key and value tiles (rows padded),
/// dS (rows of `inner + 1`).
fn query_bytes(t: Tiles, e4: u32, ev4: u32) -> u32 {
    16 * (t.outer + t.inner) * (padded(e4) + padded(ev4)) + 4 * t.outer * (t.inner + 1)
}

/// The tilings of the forward (when it must run), key and query kernels on this adapter.
fn tilings(limits: &wgpu::Limits, d: &Dims) -> Option<(Tiles, Tiles, Tiles)> {
    let (e4, ev4) = (d.e.div_ceil(4) as u32, d.ev.div_ceil(4) as u32);
    let keys = Tiles::pick(&KEY_TILES, limits, |t| key_bytes(t, e4, ev4))?;
    let queries = Tiles::pick(&QUERY_TILES, limits, |t| query_bytes(t, e4, ev4))?;
    Some((forward_tiles(limits, d)?, keys, queries))
}

/// Queue the three gradients of `softmax(scale · q kᵀ + mask) v` (validated operands; the mask
/// optional).
pub(crate) fn attention_backward(backend: &WgpuBackend, a: &AttentionBackwardArgs) -> Result<()> {
    let dtype = a.q.dtype;
    super::attention::check_one_batch_dim(backend, OP, &a.q)?;
    let d = Dims::of(&a.q, &a.k, &a.v);
    check_supported(backend, OP, dtype, &d)?;
    let ctx = &backend.ctx;
    if crate::ops::update_many::binding_cap(&ctx.limits) < KEY_BINDINGS as usize {
        return Err(Error::unsupported(
            OP,
            dtype,
            ctx.cartage_device,
            format!(
                "the fused attention backward binds {KEY_BINDINGS} storage buffers in one dispatch; this \
                 adapter allows {} (max_storage_buffers_per_shader_stage); the frontend composes it",
                ctx.limits.max_storage_buffers_per_shader_stage
            ),
        ));
    }
    if a.mask.is_some() {
        attention_mask::check_bindings(backend, OP, dtype, KEY_BINDINGS as usize + 1)?;
    }
    let (forward, keys, queries) = tilings(&ctx.limits, &d).ok_or_else(|| no_tiling(backend, OP, dtype, &d))?;
    if d.batch == 0 {
        return Ok(());
    }
    let rows = d.batch.checked_mul(d.l).ok_or_else(|| too_many(&d))?;
    let inputs = [
        Slot::bind(backend, &a.q, OP)?,
        Slot::bind(backend, &a.k, OP)?,
        Slot::bind(backend, &a.v, OP)?,
        Slot::bind(backend, &a.grad, OP)?,
    ];
    let grad_q = Slot::bind(backend, &a.grad_q, OP)?;
    let grad_k = Slot::bind(backend, &a.grad_k, OP)?;
    let grad_v = Slot::bind(backend, &a.grad_v, OP)?;
    let mask = a.mask.as_ref().map(|m| MaskSlot::bind(backend, m, OP)).transpose()?;
    let mask = mask.as_ref();
    // lse₂ then D, one f32 each per query row (one word more, so that it is never empty).
    let aux = backend.scratch((2 * rows + 1) * 4)?;
    let mut forward_out = None;
    let result = (|| {
        let aux_slot = Slot::dense(scratch_window(backend, OP, &aux.slice())?, d.l, 1);
        if rows > 0 {
            let (out, out_dtype, lse) = match &a.saved {
                Some(saved) => (
                    Slot::bind(backend, &saved.out, OP)?,
                    saved.out.dtype,
                    Slot::bind(backend, &saved.lse, OP)?,
                ),
                None => {
                    // The forward first: its output into an f32 scratch (so that D is not off by
                    // a rounding to a half type), its lse into aux's first half (which the
                    // pre-pass rewrites in base 2 in place).
                    let scratch = backend.scratch(rows * d.ev * 4)?;
                    let window = scratch_window(backend, OP, &scratch.slice());
                    forward_out = Some(scratch);
                    let out = Slot::dense(window?, d.l, d.ev);
                    let slots = [inputs[0], inputs[1], inputs[2], out, aux_slot];
                    record_forward(
                        backend,
                        [dtype, DType::F32],
                        &d,
                        forward,
                        a.scale,
                        a.causal,
                        &slots,
                        mask,
                    )?;
                    (out, DType::F32, aux_slot)
                }
            };
            record_rows(backend, [dtype, out_dtype], &d, [inputs[3], out, lse, aux_slot])?;
        }
        if d.s > 0 {
            let slots = [inputs[0], inputs[1], inputs[2], inputs[3], aux_slot, grad_k, grad_v];
            record_tiles(backend, dtype, &d, keys, Kind::Keys, a, &slots, mask)?;
        }
        if rows > 0 {
            let slots = [inputs[0], inputs[1], inputs[2], inputs[3], aux_slot, grad_q];
            record_tiles(backend, dtype, &d, queries, Kind::Queries, a, &slots, mask)?;
        }
        Ok(())
    })();
    // Safe to reuse at once: later users of the blocks are recorded after these dispatches.
    if let Some(scratch) = forward_out {
        backend.free(scratch);
    }
    backend.free(aux);
    result
}

#[cold]
fn too_many(d: &Dims) -> Error {
    Error::invalid(
        OP,
        format!(
            "B = {} times L = {} query rows overflow the address space",
            d.batch, d.l
        ),
    )
}

/// Which tile kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// dK and dV, a workgroup per key tile.
    Keys,
    /// dQ, a workgroup per query tile.
    Queries,
}

/// Record the pre-pass over slots (dO, O, lse, aux), for an incoming gradient of `dtype` and
/// a forward output of `out_dtype`.
fn record_rows(backend: &WgpuBackend, [dtype, out_dtype]: [DType; 2], d: &Dims, slots: [Slot; 4]) -> Result<()> {
    let params = params(d, 0, false, 1.0, &slots, None)?;
    let key = format!("attention_backward_rows|{dtype}|{out_dtype}|{}", d.ev);
    let ctx = &backend.ctx;
    let pipeline = backend.pipelines.try_get(ctx, &key, 4, || {
        let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
        bindings.push_str(&wgsl::binding(2, "b2", wgsl::storage_type(out_dtype)));
        bindings.push_str(&wgsl::binding(3, "b3", "f32"));
        bindings.push_str(&wgsl::binding(4, "aux", "f32"));
        let mut accessors = wgsl::load_fn("ld_g", "b1", dtype);
        accessors.push_str(&wgsl::load_fn("ld_o", "b2", out_dtype));
        accessors.push_str(&wgsl::load_fn("ld_lse", "b3", DType::F32));
        source("rows", &bindings, &accessors, &consts(&[("EV", d.ev as u32)]), false)
    })?;
    let windows: Vec<Window> = slots.iter().map(|s| s.window).collect();
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    let rows = (d.batch * d.l) as u64;
    backend.record(&pipeline, &windows, &params, grid(rows, 256, max_dim))
}

/// Record the key kernel (slots q, k, v, dO, aux, dK, dV) or the query kernel (slots q, k, v,
/// dO, aux, dQ), with the additive `mask` bound after them when given.
#[allow(clippy::too_many_arguments)]
fn record_tiles(
    backend: &WgpuBackend,
    dtype: DType,
    d: &Dims,
    t: Tiles,
    kind: Kind,
    a: &AttentionBackwardArgs,
    slots: &[Slot],
    mask: Option<&MaskSlot>,
) -> Result<()> {
    let outer = match kind {
        Kind::Keys => d.s,
        Kind::Queries => d.l,
    };
    let tiles = outer.div_ceil(t.outer as usize);
    let groups = d.batch.saturating_mul(tiles);
    check_groups(groups)?;
    let params = params(d, tiles, a.causal, a.scale, slots, mask)?;
    let name = match kind {
        Kind::Keys => "keys",
        Kind::Queries => "queries",
    };
    let key = format!(
        "attention_backward_{name}|{dtype}|{}x{}|{}x{}x{}|{}",
        d.e,
        d.ev,
        t.outer,
        t.inner,
        t.per,
        u8::from(mask.is_some())
    );
    let ctx = &backend.ctx;
    let mut windows: Vec<Window> = slots.iter().map(|s| s.window).collect();
    windows.extend(mask.map(|m| m.window));
    let pipeline = backend.pipelines.try_get(ctx, &key, windows.len(), || {
        let st = wgsl::storage_type(dtype);
        let mut bindings = String::new();
        for (n, name) in ["b1", "b2", "b3", "b4"].into_iter().enumerate() {
            bindings.push_str(&wgsl::binding(n as u32 + 1, name, st));
        }
        bindings.push_str(&wgsl::binding(5, "aux", "f32"));
        bindings.push_str(&out_binding(6, "b6", dtype));
        let mut accessors = String::new();
        for (name, buf) in [("q", "b1"), ("k", "b2"), ("v", "b3"), ("g", "b4")] {
            accessors.push_str(&wgsl::load_fn(&format!("ld_{name}"), buf, dtype));
        }
        accessors.push_str(&chunk_fn("q", 0, "E"));
        accessors.push_str(&chunk_fn("k", 1, "E"));
        accessors.push_str(&chunk_fn("v", 2, "EV"));
        accessors.push_str(&chunk_fn("g", 3, "EV"));
        accessors.push_str(&store_fns("a", "b6", dtype));
        if kind == Kind::Keys {
            bindings.push_str(&out_binding(7, "b7", dtype));
            accessors.push_str(&store_fns("b", "b7", dtype));
        }
        if mask.is_some() {
            accessors.push_str(&attention_mask::accessors(slots.len() as u32 + 1, dtype));
        }
        let (e4, ev4) = (d.e.div_ceil(4) as u32, d.ev.div_ceil(4) as u32);
        let mut values = vec![
            ("E", d.e as u32),
            ("EV", d.ev as u32),
            ("E4", e4),
            ("EV4", ev4),
            ("ES", padded(e4)),
            ("EVS", padded(ev4)),
            ("PS", t.inner + 1),
            ("TPR", t.per),
            ("WG", t.threads()),
        ];
        match kind {
            Kind::Keys => values.extend([
                ("BC", t.outer),
                ("BR", t.inner),
                ("RPT", t.inner / t.per),
                ("CKT", e4.div_ceil(t.per)),
                ("CVT", ev4.div_ceil(t.per)),
            ]),
            Kind::Queries => values.extend([
                ("BR", t.outer),
                ("BC", t.inner),
                ("KPT", t.inner / t.per),
                ("CQT", e4.div_ceil(t.per)),
            ]),
        }
        source(name, &bindings, &accessors, &consts(&values), mask.is_some())
    })?;
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    backend.record(&pipeline, &windows, &params, grid(groups as u64, 1, max_dim))
}

/// The WGSL of the kernel `piece` of `shaders/attention_backward.wgsl`; the key and query
/// kernels with or without the additive mask (the pre-pass reads none).
fn source(piece: &str, bindings: &str, accessors: &str, consts: &str, with_mask: bool) -> Result<String> {
    let pieces = wgsl::Pieces::parse("shaders/attention_backward.wgsl", ATTENTION_BACKWARD);
    let mut text = pieces.fill_head(&[
        ("PRELUDE", &wgsl::prelude(false)),
        ("PARAMS", PARAMS),
        ("BINDINGS", bindings),
        ("ACCESSORS", accessors),
        ("CONSTS", consts),
    ])?;
    let body = if piece == "rows" {
        pieces.fill(piece, &[])?
    } else if with_mask {
        let (base, score) = (pieces.fill("mask_base", &[])?, pieces.fill("mask_score", &[])?);
        pieces.fill(piece, &[("MASK_BASE", &base), ("MASK_SCORE", &score)])?
    } else {
        pieces.fill(piece, &[("MASK_BASE", ""), ("MASK_SCORE", "")])?
    };
    text.push_str(&body);
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel gets a tiling for every head dim up to the largest, both on an adapter with
    /// 48 KiB of workgroup memory and under the downlevel defaults (16 KiB, 256 invocations);
    /// the split dimension is a multiple of the invocations per row.
    #[test]
    fn every_head_dim_gets_tilings() {
        let big = wgpu::Limits {
            max_compute_workgroup_storage_size: 49152,
            ..wgpu::Limits::default()
        };
        for limits in [&big, &wgpu::Limits::downlevel_defaults()] {
            for e in [1, 32, 64, 80, 128] {
                for ev in [1, 32, 64, 80, 128] {
                    let d = Dims {
                        batch: 1,
                        l: 1,
                        s: 1,
                        e,
                        ev,
                    };
                    let (_, keys, queries) = tilings(limits, &d).expect("tilings");
                    assert_eq!(keys.inner % keys.per, 0, "{keys:?}");
                    assert_eq!(queries.inner % queries.per, 0, "{queries:?}");
                }
            }
        }
        let d = Dims {
            batch: 1,
            l: 1,
            s: 1,
            e: 64,
            ev: 64,
        };
        let (_, keys, queries) = tilings(&big, &d).expect("tilings");
        assert_eq!((keys, queries), (KEY_TILES[0], QUERY_TILES[0]));
    }

    /// Every tiling an adapter with 48 KiB of workgroup memory (NVIDIA's Vulkan limit) picks for
    /// the head dims of `tests/attention.rs` is also picked under lavapipe's 32 KiB for one of
    /// them, so that the tilings a GPU runs are exercised where the tests run.
    #[test]
    fn the_tilings_of_a_large_adapter_run_on_a_small_one() {
        let with = |bytes: u32| wgpu::Limits {
            max_compute_workgroup_storage_size: bytes,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            ..wgpu::Limits::default()
        };
        let heads = [(32, 32), (64, 64), (80, 80), (128, 128), (64, 32), (32, 80), (1, 5)];
        let picked = |limits: &wgpu::Limits| -> Vec<(Tiles, Tiles, Tiles)> {
            heads
                .iter()
                .map(|&(e, ev)| {
                    let d = Dims {
                        batch: 1,
                        l: 1,
                        s: 1,
                        e,
                        ev,
                    };
                    tilings(limits, &d).expect("tilings")
                })
                .collect()
        };
        let (large, small) = (picked(&with(49152)), picked(&with(32768)));
        for (f, k, q) in &large {
            assert!(small.iter().any(|s| s.0 == *f), "forward {f:?}");
            assert!(small.iter().any(|s| s.1 == *k), "keys {k:?}");
            assert!(small.iter().any(|s| s.2 == *q), "queries {q:?}");
        }
    }
}
