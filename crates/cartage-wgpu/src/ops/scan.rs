//! Inclusive scans (cumsum, cumprod) along one dimension. A long row is scanned by one
//! workgroup in chunks of [`PER`] × 256 elements (each invocation scans its [`PER`] consecutive
//! elements, a Hillis–Steele scan in workgroup memory combines the invocations' totals, and the
//! total of the chunks before is carried); many short rows run one invocation per row, in order.
//! Floats accumulate in f32 (f64 for f64), integers wrap (u8 in u32, masked when stored; i64
//! in exact word-pair arithmetic).

use cartage_core::{DType, Result, ScanOp, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::bind_operand;
use crate::ops::geometry::{WORKGROUP, grid};
use crate::ops::reduce::store_source;
use crate::ops::rows::{EXTRA, ROWS, Rows};
use crate::wgsl;

/// Rows at most this long run one invocation per row when there are enough rows.
const SHORT_ROW: usize = 32;

/// Consecutive elements one invocation scans serially in the workgroup form.
const PER: usize = 4;

/// Elements per workgroup step.
const CHUNK: usize = PER * 256;

/// `out = scan(input)` along `dim`.
pub(crate) fn scan(backend: &WgpuBackend, op: ScanOp, input: &TensorArg, dim: usize, out: &TensorArg) -> Result<()> {
    let name = op.name();
    let rows = Rows::new(
        name,
        input.layout.shape(),
        dim,
        &[input.layout.strides(), out.layout.strides()],
    )?;
    if rows.rows == 0 || rows.len == 0 {
        return Ok(());
    }
    let bound = [
        bind_operand(&backend.ctx, &backend.table, input, name, None)?,
        bind_operand(&backend.ctx, &backend.table, out, name, None)?,
    ];
    let mut params = rows.params(&[bound[0].element_offset, bound[1].element_offset])?;
    params.put_sizes(
        EXTRA,
        &[input.layout.strides()[dim], out.layout.strides()[dim]],
        "stride",
    )?;
    let per_thread = rows.len <= SHORT_ROW && rows.rows >= 256;
    let dtype = input.dtype;
    let key = format!("{name}:{dtype}|{}", if per_thread { "thread" } else { "group" });
    let pipeline = backend
        .pipelines
        .get(&backend.ctx, &key, 2, || source(op, dtype, per_thread))?;
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension;
    let groups = if per_thread {
        grid(rows.rows as u64, WORKGROUP, max_dim)
    } else {
        grid(rows.rows as u64, 1, max_dim)
    };
    backend.record(&pipeline, &[bound[0].window, bound[1].window], &params, groups)
}

fn source(op: ScanOp, dtype: DType, per_thread: bool) -> String {
    let c = wgsl::compute_type(dtype);
    let fam = wgsl::family(dtype);
    let (identity, combine) = match (op, fam) {
        (ScanOp::Sum, "f32") => ("0.0", "a + b"),
        (ScanOp::Sum, "f64") => ("0.0lf", "a + b"),
        (ScanOp::Sum, "i32") => ("0", "a + b"),
        (ScanOp::Sum, "i64") => ("vec2<u32>(0u, 0u)", "add_i64(a, b)"),
        (ScanOp::Sum, _) => ("0u", "a + b"),
        (ScanOp::Prod, "f32") => ("1.0", "a * b"),
        (ScanOp::Prod, "f64") => ("1.0lf", "a * b"),
        (ScanOp::Prod, "i32") => ("1", "a * b"),
        (ScanOp::Prod, "i64") => ("vec2<u32>(1u, 0u)", "mul_i64(a, b)"),
        (ScanOp::Prod, _) => ("1u", "a * b"),
    };
    let out_element = if wgsl::packed(dtype) {
        "atomic<u32>"
    } else {
        wgsl::storage_type(dtype)
    };
    let mut bindings = wgsl::binding(1, "b1", wgsl::storage_type(dtype));
    bindings.push_str(&wgsl::binding(2, "b2", out_element));
    let mut accessors = wgsl::load_fn("ld_x", "b1", dtype);
    accessors.push_str(&store_source(dtype));
    let main = if per_thread {
        "@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if row >= P.rows {
        return;
    }
    let b = row_bases(row);
    var acc = identity();
    for (var j = 0u; j < P.len; j = j + 1u) {
        acc = combine(acc, ld_x(b.x + j * P.x[0].x));
        store_out(b.y + j * P.x[0].y, acc);
    }
}"
        .to_string()
    } else {
        format!(
            "var<workgroup> part: array<{c}, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let row = flat_group(wid, nwg);
    if row >= P.rows {{
        return;
    }}
    let b = row_bases(row);
    var carry = identity();
    for (var start = 0u; start < P.len; start = start + {CHUNK}u) {{
        // Each invocation scans its {PER} consecutive elements in order...
        let first = start + lid * {PER}u;
        var own: array<{c}, {PER}>;
        var run = identity();
        for (var q = 0u; q < {PER}u; q = q + 1u) {{
            if first + q < P.len {{
                run = combine(run, ld_x(b.x + (first + q) * P.x[0].x));
            }}
            own[q] = run;
        }}
        // ...then the workgroup scans the invocations' totals (Hillis-Steele).
        part[lid] = run;
        workgroupBarrier();
        for (var s = 1u; s < 256u; s = s << 1u) {{
            var w = part[lid];
            if lid >= s {{
                w = combine(part[lid - s], w);
            }}
            workgroupBarrier();
            part[lid] = w;
            workgroupBarrier();
        }}
        var before = carry;
        if lid > 0u {{
            before = combine(carry, part[lid - 1u]);
        }}
        for (var q = 0u; q < {PER}u; q = q + 1u) {{
            if first + q < P.len {{
                store_out(b.y + (first + q) * P.x[0].y, combine(before, own[q]));
            }}
        }}
        carry = combine(carry, part[255]);
        workgroupBarrier();
    }}
}}"
        )
    };
    format!(
        "{prelude}
{ROWS}
{bindings}
{accessors}
fn identity() -> {c} {{ return {identity}; }}
fn combine(a: {c}, b: {c}) -> {c} {{ return {combine}; }}

{main}
",
        prelude = wgsl::prelude(dtype == DType::F64)
    )
}
