//! Scatter (assign or add) along one dimension, in place on `out`: one invocation per element
//! of `index`, which reads its index once, checks it (`shaders/index.wgsl`: a bad one sets the
//! op's flag slot and writes nothing) and updates one element of `out` atomically, so repeated
//! indices never race: `atomicStore` for 32-bit assignment, `atomicAdd` for i32 sums, and a
//! compare-exchange loop on the 32-bit word for f32 sums and for every packed dtype (u8, bool,
//! f16, bf16), whose neighbours share the word.
//!
//! WGSL has no 64-bit atomics. An i64 sum adds the low words atomically and then the high word
//! plus the carry that this very addition produced: every wrap of the low word is counted once,
//! so the final value is exact. A 64-bit assignment elects one writer per destination element
//! first, so that two words from different sources never mix: pass 0 clears a claim word per
//! element of `out` (scratch), pass 1 takes the largest invocation id per element with
//! `atomicMax`, pass 2 lets only that invocation write. f64 sums are refused.

use cartage_core::{DType, Result, ScatterMode, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::{MAX_RANK, WORKGROUP, coalesce, grid, word};
use crate::wgsl;

const INDEX: &str = include_str!("../../shaders/index.wgsl");

/// `out[.. index[p] ..] (=|+=) src[p]` for every position `p` of `index`.
pub(crate) fn scatter(
    backend: &WgpuBackend,
    mode: ScatterMode,
    src: &TensorArg,
    index: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    let name = mode.name();
    let count = index.layout.numel();
    if count == 0 {
        return Ok(());
    }
    let size = out.layout.shape()[dim];
    let mut out_strides = out.layout.strides().to_vec();
    let dim_stride = out_strides[dim];
    out_strides[dim] = 0;
    // Row-major positions in `out`: the claim words of a 64-bit assignment.
    let mut linear = cartage_core::Layout::contiguous(out.layout.shape())?.strides().to_vec();
    let linear_dim = linear[dim];
    linear[dim] = 0;
    let g = coalesce(
        index.layout.shape(),
        &[index.layout.strides(), src.layout.strides(), &out_strides, &linear],
    );
    g.check_rank(name)?;
    debug_assert!(g.shape.len() <= MAX_RANK);
    let bound = [
        bind_operand(&backend.ctx, &backend.table, index, name, None)?,
        bind_operand(&backend.ctx, &backend.table, src, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
    ];
    let mut params = ParamBlock::default();
    params.put_sizes(0, &[count, g.shape.len(), dim_stride, size], "scatter size")?;
    for (k, b) in bound.iter().enumerate() {
        params.put_sizes(4 + k, &[b.element_offset as usize], "element offset")?;
    }
    params.put_sizes(8, &g.shape, "dimension size")?;
    for (k, s) in g.strides.iter().enumerate() {
        params.put_sizes(16 + 8 * k, s, "stride")?;
    }
    params.put_sizes(48, &[linear_dim], "stride")?;
    let (dtype, index_dtype) = (out.dtype, index.dtype);
    let elect = mode == ScatterMode::Assign && dtype.size_in_bytes() == 8;
    let key = format!("{name}:{dtype}|{index_dtype}");
    let storage = if elect { 5 } else { 4 };
    let pipeline = backend
        .pipelines
        .get(&backend.ctx, &key, storage, || source(mode, dtype, index_dtype))?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    // Invocation ids + 1 are the claim values, so they must fit a word too.
    let threads = word(count + 1, "index element count")? - 1;
    let groups = grid(u64::from(threads), WORKGROUP, max_dim);
    let claims = if elect {
        let numel = out.layout.numel();
        let bytes = numel as u64 * 4;
        if bytes > backend.ctx.max_binding() {
            return Err(crate::bindings::binding_limit_error(&backend.ctx, out, name, bytes));
        }
        Some(backend.scratch(numel * 4)?)
    } else {
        None
    };
    let mut checks = backend.index_checks.lock().unwrap_or_else(|p| p.into_inner());
    let result = (|| {
        let (slot, flags) = checks.reserve(backend, name, dim, size)?;
        params.put(7, &[slot]);
        let mut windows = vec![bound[0].window, bound[1].window, bound[2].window, flags];
        let Some(claims) = &claims else {
            return backend.record(&pipeline, &windows, &params, groups);
        };
        let slice = claims.slice();
        windows.push(Window {
            segment: slice.segment().id,
            offset: slice.offset() as u64,
            size: (slice.len() as u64).div_ceil(16) * 16,
        });
        for pass in 0..3 {
            params.put(49, &[pass]);
            backend.record(&pipeline, &windows, &params, groups)?;
        }
        Ok(())
    })();
    drop(checks);
    if let Some(claims) = claims {
        cartage_core::Backend::free(backend, claims);
    }
    result
}

/// WGSL `fn update(e: u32, v: C)` applying one source value to element `e` of `out` (`b3`).
fn update_source(mode: ScatterMode, dtype: DType) -> String {
    let c = wgsl::compute_type(dtype);
    if dtype.size_in_bytes() == 8 {
        return match mode {
            // Pass 2 of the election: the elected invocation writes both words.
            ScatterMode::Assign => "fn update(e: u32, v: vec2<u32>) {
    atomicStore(&b3[2u * e], v.x);
    atomicStore(&b3[2u * e + 1u], v.y);
}"
            .to_string(),
            // i64 only: the carry out of this very low-word addition goes to the high word.
            ScatterMode::Add => "fn update(e: u32, v: vec2<u32>) {
    let old = atomicAdd(&b3[2u * e], v.x);
    let carry = select(0u, 1u, old + v.x < old);
    atomicAdd(&b3[2u * e + 1u], v.y + carry);
}"
            .to_string(),
        };
    }
    if !wgsl::packed(dtype) {
        return match (mode, dtype) {
            (ScatterMode::Assign, _) => {
                format!("fn update(e: u32, v: {c}) {{ atomicStore(&b3[e], bitcast<u32>(v)); }}")
            }
            (ScatterMode::Add, DType::I32) => {
                format!("fn update(e: u32, v: {c}) {{ atomicAdd(&b3[e], bitcast<u32>(v)); }}")
            }
            _ => format!(
                "fn update(e: u32, v: {c}) {{
    var old = atomicLoad(&b3[e]);
    loop {{
        let new_bits = bitcast<u32>(bitcast<{c}>(old) + v);
        let r = atomicCompareExchangeWeak(&b3[e], old, new_bits);
        if r.exchanged {{ break; }}
        old = r.old_value;
    }}
}}"
            ),
        };
    }
    let per = wgsl::per_word(dtype);
    let bits = wgsl::bits(dtype);
    let full = (1u64 << bits) - 1;
    let decode = match dtype {
        DType::F16 => "f16_to_f32(h)",
        DType::BF16 => "bf16_to_f32(h)",
        _ => "h",
    };
    let value = match mode {
        ScatterMode::Assign => "enc_out(v)".to_string(),
        ScatterMode::Add => "enc_out(dec(h) + v)".to_string(),
    };
    format!(
        "{enc}fn dec(h: u32) -> {c} {{ return {decode}; }}
fn update(e: u32, v: {c}) {{
    let w = e / {per}u;
    let shift = (e % {per}u) * {bits}u;
    var old = atomicLoad(&b3[w]);
    loop {{
        let h = (old >> shift) & {full}u;
        let new_bits = (old & ~({full}u << shift)) | (({value} & {full}u) << shift);
        let r = atomicCompareExchangeWeak(&b3[w], old, new_bits);
        if r.exchanged {{ break; }}
        old = r.old_value;
    }}
}}",
        enc = wgsl::encode_fn("enc_out", dtype)
    )
}

fn source(mode: ScatterMode, dtype: DType, index: DType) -> String {
    let wide = dtype.size_in_bytes() == 8;
    let elect = wide && mode == ScatterMode::Assign;
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(index));
    bindings.push_str(&wgsl::binding(
        2,
        "b2",
        if wide { "u32" } else { wgsl::storage_type(dtype) },
    ));
    bindings.push_str(&wgsl::binding(3, "b3", "atomic<u32>"));
    bindings.push_str(&wgsl::binding(4, "flags", "atomic<u32>"));
    if elect {
        bindings.push_str(&wgsl::binding(5, "claims", "atomic<u32>"));
    }
    let mut accessors = wgsl::load_fn("ld_i", "b1", index);
    if wide {
        // The raw words (f64 values are moved, never computed with).
        accessors.push_str("fn ld_s(e: u32) -> vec2<u32> { return vec2<u32>(b2[2u * e], b2[2u * e + 1u]); }\n");
    } else {
        accessors.push_str(&wgsl::load_fn("ld_s", "b2", dtype));
    }
    accessors.push_str(&update_source(mode, dtype));
    let apply = if elect {
        "let lin = o.w + idx.x * P.linear_dim;
    if P.stage == 0u {
        atomicStore(&claims[lin], 0u);
        return;
    }
    if P.stage == 1u {
        atomicMax(&claims[lin], t + 1u);
        return;
    }
    if atomicLoad(&claims[lin]) == t + 1u {
        update(o.z + idx.x * P.dim_stride, ld_s(o.y));
    }"
    } else {
        "update(o.z + idx.x * P.dim_stride, ld_s(o.y));"
    };
    let report = if elect {
        "if P.stage == 2u {
            report_bad_index(P.offs.w, idx);
        }"
    } else {
        "report_bad_index(P.offs.w, idx);"
    };
    let pair = match index {
        DType::I64 => "raw",
        _ => "vec2<u32>(bitcast<u32>(raw), select(0u, 0xffffffffu, raw < 0))",
    };
    format!(
        "{prelude}
struct Params {{
    count: u32,
    rank: u32,
    dim_stride: u32,
    size: u32,
    offs: vec4<u32>,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 8>,
    linear_dim: u32,
    stage: u32,
    free0: u32,
    free1: u32,
    free: array<vec4<u32>, 3>,
}}

@group(0) @binding(0) var<uniform> P: Params;

{bindings}
{accessors}
{INDEX}
fn stride(slot: u32, d: u32) -> u32 {{
    let w = slot * 8u + d;
    return P.strides[w >> 2u][w & 3u];
}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= P.count {{
        return;
    }}
    var rest = t;
    var o = vec4<u32>(P.offs.xyz, 0u);
    for (var d = i32(P.rank) - 1; d >= 0; d = d - 1) {{
        let u = u32(d);
        let n = P.shape[u >> 2u][u & 3u];
        let c = rest % n;
        rest = rest / n;
        o = o + c * vec4<u32>(stride(0u, u), stride(1u, u), stride(2u, u), stride(3u, u));
    }}
    let raw = ld_i(o.x);
    let idx = {pair};
    if idx.y != 0u || idx.x >= P.size {{
        {report}
        return;
    }}
    {apply}
}}
",
        prelude = wgsl::prelude(false)
    )
}
