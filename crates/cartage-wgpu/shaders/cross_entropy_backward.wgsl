// The logits gradient of per-row cross-entropy: one workgroup per row. Thread 0 loads the row's
// target once and checks it; the workgroup reads that one value. A row whose target is
// ignore_index is written as zeros; a target outside [0, C) is reported in the op's slot of the
// index-check flags (`shaders/index.wgsl`) and its row is written as NaN. Otherwise the row's
// maximum and the sum of exp(x − max) (f32) give
// g·(softmax(x) − (1 − s)·onehot(t) − s/C).
// Slots (`shaders/rows.wgsl`): x the logits (b1), y the gradient (b2), z the target (b3), w the
// per-row incoming gradient (b4); `P.x[0]` = (logits' and gradient's strides along the row,
// ignore_index low and high words), `P.x[1]` = (smoothing bits, flag slot).

{{PRELUDE}}
{{ROWS}}
{{BINDINGS}}
{{ACCESSORS}}
{{INDEX}}
var<workgroup> tree: array<f32, 256>;
// The row's target as (low, high) words, then whether it is ignored (1) or bad (2).
var<workgroup> shared_target: vec3<u32>;

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
    if lid == 0u {
        let raw = ld_t(b.z);
        let idx = {{PAIR}};
        var status = 0u;
        if idx.x == step.z && idx.y == step.w {
            status = 1u;
        } else if idx.y != 0u || idx.x >= n {
            report_bad_index(P.x[1].y, idx);
            status = 2u;
        }
        shared_target = vec3<u32>(idx, status);
    }
    let tgt = workgroupUniformLoad(&shared_target);
    if tgt.z != 0u {
        let fill = select(0.0, nan_f32(), tgt.z == 2u);
        for (var j = lid; j < n; j = j + 256u) {
            store_out(b.y + j * step.y, fill);
        }
        return;
    }
    var m = -inf_f32();
    for (var j = lid; j < n; j = j + 256u) {
        m = maximum_f32(m, ld_x(b.x + j * step.x));
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
    for (var j = lid; j < n; j = j + 256u) {
        total = total + exp(ld_x(b.x + j * step.x) - row_max);
    }
    tree[lid] = total;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if lid < s {
            tree[lid] = tree[lid] + tree[lid + s];
        }
        workgroupBarrier();
    }
    let g = ld_grad(b.w);
    let smoothing = bitcast<f32>(P.x[1].x);
    let scale = g / tree[0];
    let spread = g * smoothing / f32(n);
    let hit = g * (1.0 - smoothing);
    for (var j = lid; j < n; j = j + 256u) {
        var v = exp(ld_x(b.x + j * step.x) - row_max) * scale - spread;
        if j == tgt.x {
            v = v - hit;
        }
        store_out(b.y + j * step.y, v);
    }
}
