// The input gradient of softmax and log-softmax along one dimension, from the forward's output
// `y` and the incoming gradient `g`: one workgroup per row, one workgroup sum (Σ g·y for
// softmax, Σ g for log-softmax), then `y·(g − Σ g·y)` or `g − exp(y)·Σ g` per element. Slots
// (`shaders/rows.wgsl`): x the forward's output (b1), y the input gradient (b2), z the incoming
// gradient (b3); `P.x[0]` holds their strides along the row. Computed in {{T}}.

{{PRELUDE}}
{{ROWS}}
{{BINDINGS}}
{{ACCESSORS}}
var<workgroup> tree: array<{{T}}, 256>;

fn workgroup_sum(v: {{T}}, lid: u32) -> {{T}} {
    tree[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if lid < s {
            tree[lid] = tree[lid] + tree[lid + s];
        }
        workgroupBarrier();
    }
    let total = tree[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = flat_group(wid, nwg);
    if row >= P.rows {
        return;
    }
    let b = row_bases(row);
    let n = P.len;
    let step = P.x[0];
    var partial = {{ZERO}};
    for (var j = lid; j < n; j = j + 256u) {
        let y = ld_y(b.x + j * step.x);
        let g = ld_g(b.z + j * step.z);
        partial = partial + {{TERM}};
    }
    let total = workgroup_sum(partial, lid);
    for (var j = lid; j < n; j = j + 256u) {
        let y = ld_y(b.x + j * step.x);
        let g = ld_g(b.z + j * step.z);
        store_out(b.y + j * step.y, {{OUTPUT}});
    }
}
