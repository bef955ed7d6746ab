//! Stable sort along one dimension: a bitonic network over (key, index) pairs, which is a total
//! order, so the unstable network gives the stable result.
//!
//! Each row is padded to a power of two `m` with sentinels above every key, and the pairs of all
//! rows live in one scratch array (`rows * m` entries of `vec4<u32>`: key high word, key low
//! word, index, unused). Keys are the elements' bits mapped to unsigned integers that order as
//! the values do: NaN above +inf, -0 equal to +0, complemented for a descending sort (equal keys
//! still order by index, so ties keep the input order in both directions). The passes:
//! - `init`: one invocation per entry builds the pairs;
//! - `local`: a workgroup sorts (or finishes merging) a block of 512 entries in workgroup memory;
//! - `global`: one compare-exchange per invocation for the merge steps wider than a block;
//! - `write`: the first `n` entries of each row give the indices, and the values are copied from
//!   the input at those indices (exact bits, whatever the dtype).

use cartage_core::{DType, Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::ops::geometry::{WORKGROUP, grid, word};
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

/// Entries one workgroup sorts in workgroup memory.
const BLOCK: usize = 512;

/// Sort `input` along `dim` into `values` and `indices` (i64).
pub(crate) fn sort(
    backend: &WgpuBackend,
    input: &TensorArg,
    dim: usize,
    descending: bool,
    values: &TensorArg,
    indices: &TensorArg,
) -> Result<()> {
    let rows = Rows::new(
        "sort",
        input.layout.shape(),
        dim,
        &[
            input.layout.strides(),
            values.layout.strides(),
            indices.layout.strides(),
        ],
    )?;
    if rows.rows == 0 || rows.len == 0 {
        return Ok(());
    }
    let m = rows.len.next_power_of_two();
    let total = rows.rows.checked_mul(m).filter(|&t| u32::try_from(t).is_ok());
    let scratch_bytes = total.map(|t| t as u64 * 16);
    let max = backend.ctx.max_binding();
    let (Some(total), Some(scratch_bytes)) = (total, scratch_bytes.filter(|&b| b <= max)) else {
        return Err(Error::unsupported(
            "sort",
            input.dtype,
            backend.ctx.cartage_device,
            format!(
                "{} rows of {} keys need {} rows x {m} padded entries of 16 bytes of scratch, beyond the \
                 {} one storage binding holds on this adapter (max_storage_buffer_binding_size); sort fewer rows at once",
                rows.rows,
                rows.len,
                rows.rows,
                cartage_core::format_bytes(max)
            ),
        ));
    };
    let bound = [
        bind_operand(&backend.ctx, &backend.table, input, "sort", None)?,
        bind_operand(&backend.ctx, &backend.table, values, "sort", None)?,
        bind_operand(&backend.ctx, &backend.table, indices, "sort", None)?,
    ];
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let mut params = rows.params(&offsets)?;
    params.put_sizes(
        EXTRA,
        &[
            input.layout.strides()[dim],
            values.layout.strides()[dim],
            indices.layout.strides()[dim],
        ],
        "stride",
    )?;
    params.put_sizes(EXTRA + 8, &[total, rows.rows * rows.len], "sort size")?;
    params.put(EXTRA + 4, &[word(m, "padded row")?, m.trailing_zeros()]);
    let scratch = backend.scratch(scratch_bytes as usize)?;
    let slice = scratch.slice();
    let window = Window {
        segment: slice.segment().id,
        offset: slice.offset() as u64,
        size: (slice.len() as u64).div_ceil(16) * 16,
    };
    let windows = [bound[0].window, bound[1].window, bound[2].window, window];
    let result = run_passes(
        backend,
        input.dtype,
        descending,
        &windows,
        params,
        m,
        total,
        rows.rows * rows.len,
    );
    cartage_core::Backend::free(backend, scratch);
    result
}

#[allow(clippy::too_many_arguments)]
fn run_passes(
    backend: &WgpuBackend,
    dtype: DType,
    descending: bool,
    windows: &[Window],
    mut params: crate::encoder::ParamBlock,
    m: usize,
    total: usize,
    outputs: usize,
) -> Result<()> {
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    let pipeline = |stage: &'static str| {
        let key = format!("sort:{dtype}|{}|{stage}", if descending { "desc" } else { "asc" });
        backend
            .pipelines
            .get(&backend.ctx, &key, 4, || source(dtype, descending, stage))
    };
    let init = pipeline("init")?;
    backend.record(&init, windows, &params, grid(total as u64, WORKGROUP, max_dim))?;
    let local = pipeline("local")?;
    let global = pipeline("global")?;
    let blocks = total.div_ceil(BLOCK) as u64;
    // Every stage k up to a block in workgroup memory at once.
    params.put(EXTRA + 6, &[2, m.min(BLOCK) as u32]);
    backend.record(&local, windows, &params, grid(blocks, 1, max_dim))?;
    let mut k = 2 * BLOCK;
    while k <= m {
        let mut j = k / 2;
        while j >= BLOCK {
            params.put(EXTRA + 6, &[k as u32, j as u32]);
            backend.record(&global, windows, &params, grid(total as u64 / 2, WORKGROUP, max_dim))?;
            j /= 2;
        }
        params.put(EXTRA + 6, &[k as u32, k as u32]);
        backend.record(&local, windows, &params, grid(blocks, 1, max_dim))?;
        k *= 2;
    }
    let write = pipeline("write")?;
    backend.record(&write, windows, &params, grid(outputs as u64, WORKGROUP, max_dim))
}

/// WGSL: `fn bits(e) -> vec2<u32>` (the raw element, low word first for 64-bit dtypes) and
/// `fn put_bits(e, v)` for the values output.
fn bit_access(dtype: DType) -> String {
    match dtype.size_in_bytes() {
        8 => "fn bits(e: u32) -> vec2<u32> { return vec2<u32>(b1[2u * e], b1[2u * e + 1u]); }
fn put_bits(e: u32, v: vec2<u32>) { atomicStore(&b2[2u * e], v.x); atomicStore(&b2[2u * e + 1u], v.y); }
"
        .to_string(),
        4 => "fn bits(e: u32) -> vec2<u32> { return vec2<u32>(b1[e], 0u); }
fn put_bits(e: u32, v: vec2<u32>) { atomicStore(&b2[e], v.x); }
"
        .to_string(),
        _ => {
            let per = wgsl::per_word(dtype);
            let bits = wgsl::bits(dtype);
            let full = (1u64 << bits) - 1;
            format!(
                "fn bits(e: u32) -> vec2<u32> {{ return vec2<u32>((b1[e / {per}u] >> ((e % {per}u) * {bits}u)) & {full}u, 0u); }}
fn put_bits(e: u32, v: vec2<u32>) {{
    let w = e / {per}u;
    let shift = (e % {per}u) * {bits}u;
    atomicAnd(&b2[w], ~({full}u << shift));
    atomicOr(&b2[w], v.x << shift);
}}
"
            )
        }
    }
}

/// WGSL `fn key(v: vec2<u32>) -> vec2<u32>`: order-preserving unsigned key (high, low).
fn key_source(dtype: DType, descending: bool) -> String {
    let body = match dtype {
        DType::F32 => {
            "let a = v.x & 0x7fffffffu;
    if a > 0x7f800000u { return vec2<u32>(0xffffffffu, 0u); }
    if a == 0u { return vec2<u32>(0x80000000u, 0u); }
    return vec2<u32>(select(v.x | 0x80000000u, ~v.x, (v.x & 0x80000000u) != 0u), 0u);"
        }
        DType::F16 | DType::BF16 => {
            let inf = if dtype == DType::F16 { "0x7c00u" } else { "0x7f80u" };
            return key_wrap(
                &format!(
                    "let a = v.x & 0x7fffu;
    if a > {inf} {{ return vec2<u32>(0xffffu, 0u); }}
    if a == 0u {{ return vec2<u32>(0x8000u, 0u); }}
    return vec2<u32>(select(v.x | 0x8000u, (~v.x) & 0xffffu, (v.x & 0x8000u) != 0u), 0u);"
                ),
                descending,
            );
        }
        DType::F64 => {
            "let a = v.y & 0x7fffffffu;
    if a > 0x7ff00000u || (a == 0x7ff00000u && v.x != 0u) { return vec2<u32>(0xffffffffu, 0xffffffffu); }
    if a == 0u && v.x == 0u { return vec2<u32>(0x80000000u, 0u); }
    if (v.y & 0x80000000u) != 0u { return vec2<u32>(~v.y, ~v.x); }
    return vec2<u32>(v.y | 0x80000000u, v.x);"
        }
        DType::I64 => "return vec2<u32>(v.y ^ 0x80000000u, v.x);",
        DType::I32 => "return vec2<u32>(v.x ^ 0x80000000u, 0u);",
        DType::U8 | DType::Bool => "return vec2<u32>(v.x, 0u);",
    };
    key_wrap(body, descending)
}

fn key_wrap(body: &str, descending: bool) -> String {
    let finish = if descending { "~k" } else { "k" };
    format!(
        "fn ascending_key(v: vec2<u32>) -> vec2<u32> {{
    {body}
}}
fn key(v: vec2<u32>) -> vec2<u32> {{ let k = ascending_key(v); return {finish}; }}
"
    )
}

fn source(dtype: DType, descending: bool, stage: &str) -> String {
    let mut bindings = wgsl::binding(1, "b1", "u32");
    bindings.push_str(&wgsl::binding(2, "b2", "atomic<u32>"));
    bindings.push_str(&wgsl::binding(3, "b3", "u32"));
    bindings.push_str(&wgsl::binding(4, "pairs", "vec4<u32>"));
    let main = match stage {
        "init" => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = gid.x + gid.y * nwg.x * 256u;
    if g >= P.x[2].x {
        return;
    }
    let r = g >> P.x[1].y;
    let p = g & (P.x[1].x - 1u);
    if p >= P.len {
        pairs[g] = vec4<u32>(0xffffffffu, 0xffffffffu, 0xffffffffu, 0u);
        return;
    }
    let k = key(bits(row_bases(r).x + p * P.x[0].x));
    pairs[g] = vec4<u32>(k.x, k.y, p, 0u);
}"
        .to_string(),
        "global" => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= (P.x[2].x >> 1u) {
        return;
    }
    let k = P.x[1].z;
    let j = P.x[1].w;
    let i = ((t & ~(j - 1u)) << 1u) | (t & (j - 1u));
    let ascending = (i & (P.x[1].x - 1u) & k) == 0u;
    let a = pairs[i];
    let b = pairs[i + j];
    if select(greater(b, a), greater(a, b), ascending) {
        pairs[i] = b;
        pairs[i + j] = a;
    }
}"
        .to_string(),
        "local" => format!(
            "var<workgroup> block: array<vec4<u32>, {BLOCK}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let base = flat_group(wid, nwg) * {BLOCK}u;
    let total = P.x[2].x;
    if base >= total {{
        return;
    }}
    for (var e = lid; e < {BLOCK}u; e = e + 256u) {{
        if base + e < total {{
            block[e] = pairs[base + e];
        }}
    }}
    workgroupBarrier();
    for (var k = P.x[1].z; k <= P.x[1].w; k = k << 1u) {{
        for (var j = min(k >> 1u, {half}u); j > 0u; j = j >> 1u) {{
            let i = ((lid & ~(j - 1u)) << 1u) | (lid & (j - 1u));
            if base + i + j < total {{
                let ascending = ((base + i) & (P.x[1].x - 1u) & k) == 0u;
                let a = block[i];
                let b = block[i + j];
                if select(greater(b, a), greater(a, b), ascending) {{
                    block[i] = b;
                    block[i + j] = a;
                }}
            }}
            workgroupBarrier();
        }}
    }}
    for (var e = lid; e < {BLOCK}u; e = e + 256u) {{
        if base + e < total {{
            pairs[base + e] = block[e];
        }}
    }}
}}",
            half = BLOCK / 2
        ),
        _ => "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= P.x[2].y {
        return;
    }
    let r = t / P.len;
    let p = t % P.len;
    let e = pairs[(r << P.x[1].y) + p];
    let b = row_bases(r);
    put_bits(b.y + p * P.x[0].y, bits(b.x + e.z * P.x[0].x));
    let o = b.z + p * P.x[0].z;
    b3[2u * o] = e.z;
    b3[2u * o + 1u] = 0u;
}"
        .to_string(),
    };
    format!(
        "{prelude}
{ROWS}
{bindings}
{access}
{keys}
fn greater(a: vec4<u32>, b: vec4<u32>) -> bool {{
    if a.x != b.x {{ return a.x > b.x; }}
    if a.y != b.y {{ return a.y > b.y; }}
    return a.z > b.z;
}}

{main}
",
        prelude = wgsl::COMMON,
        access = bit_access(dtype),
        keys = key_source(dtype, descending)
    )
}
