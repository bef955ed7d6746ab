// Softmax and log-softmax along one dimension: one workgroup per row (the elements sharing all
// other coordinates). Three passes over the row: the maximum (NaN propagates), the sum of
// exp(x - max), then the outputs. Everything is computed in f32. A causal softmax takes only
// the row's first `kept` elements into the maximum and the sum, and writes 0 (−inf for
// log-softmax) past them.

{{PRELUDE}}

struct Params {
    rows: u32,
    len: u32,
    kept_rank: u32,
    in_off: u32,
    out_off: u32,
    in_step: u32,
    out_step: u32,
    // Causal: rows per [L, S] matrix (row r keeps its first r % L + 1 elements); 0 keeps all.
    causal_rows: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_in: array<vec4<u32>, 2>,
    kept_out: array<vec4<u32>, 2>,
    unused1: array<vec4<u32>, 8>,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}

{{ACCESSORS}}

fn at(a: array<vec4<u32>, 2>, d: u32) -> u32 { return a[d >> 2u][d & 3u]; }

fn row_bases(o: u32) -> vec2<u32> {
    var rest = o;
    var base = vec2<u32>(P.in_off, P.out_off);
    for (var d = i32(P.kept_rank) - 1; d >= 0; d = d - 1) {
        let n = at(P.kept_shape, u32(d));
        let c = rest % n;
        rest = rest / n;
        base = base + c * vec2<u32>(at(P.kept_in, u32(d)), at(P.kept_out, u32(d)));
    }
    return base;
}

var<workgroup> tree: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if row >= P.rows {
        return;
    }
    let bases = row_bases(row);
    var kept = P.len;
    if P.causal_rows > 0u {
        kept = min(row % P.causal_rows + 1u, P.len);
    }
    var m = -inf_f32();
    for (var j = lid; j < kept; j = j + 256u) {
        m = maximum_f32(m, load_x(bases.x + j * P.in_step));
    }
    tree[lid] = m;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if lid < s {
            tree[lid] = maximum_f32(tree[lid], tree[lid + s]);
        }
        workgroupBarrier();
    }
    let row_max = tree[0];
    workgroupBarrier();
    var total = 0.0;
    for (var j = lid; j < kept; j = j + 256u) {
        total = total + exp(load_x(bases.x + j * P.in_step) - row_max);
    }
    tree[lid] = total;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if lid < s {
            tree[lid] = tree[lid] + tree[lid + s];
        }
        workgroupBarrier();
    }
    let row_sum = tree[0];
    let log_sum = log(row_sum);
    for (var j = lid; j < P.len; j = j + 256u) {
        // Masked elements (causal) are −inf: 0 after exp, −inf for log-softmax.
        var shifted = -inf_f32();
        if j < kept {
            shifted = load_x(bases.x + j * P.in_step) - row_max;
        }
        {{OUTPUT}}
        store_out(bases.y + j * P.out_step, y);
    }
}
