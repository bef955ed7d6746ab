// The gradients of layer norm and RMS norm over the last dimension: a workgroup per row at a
// time. The row's statistics are recomputed as the forward computes them (the mean, then the
// centred variance; or the mean square), then one pass sums ĝ = g·weight and ĝ·x̂, and a last
// pass writes r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) (layer) or r·(ĝ − x̂·mean(ĝ·x̂)) (RMS), r = 1/std or
// 1/rms. Workgroup `u` of `P.x[1].z` takes rows u, u + P.x[1].z, … (one row each when the count
// is the number of rows). With the weight or bias gradient wanted, the last pass also adds the
// row's g·x̂ and g into the workgroup's own row of partial sums (`part_w`, `part_b`: one row of
// `P.len` per workgroup, each element written by one invocation, its first row stored, the
// others added in row order); `shaders/norm_reduce.wgsl`'s pass then sums those rows.
// Slots (`shaders/rows.wgsl`): x the forward's input (b1), y the input gradient (b2), z the
// incoming gradient (b3), w the weight (b4, optional); `P.x[0]` holds their strides along the
// row, `P.x[1].xy` eps (f32, and the f32 remainder for f64), `P.x[1].z` the workgroups sharing
// the rows, `P.x[1].w` and `P.x[2].x` the element offsets of the weight's and the bias's
// partial sums in the partials buffer. Computed in {{T}}.

{{PRELUDE}}
{{ROWS}}
{{BINDINGS}}
{{ACCESSORS}}
var<workgroup> tree: array<vec2<{{T}}>, 256>;

fn workgroup_sum(v: vec2<{{T}}>, lid: u32) -> vec2<{{T}}> {
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
    let unit = flat_group(wid, nwg);
    let units = P.x[1].z;
    if unit >= units {
        return;
    }
    let n = P.len;
    let count = {{T}}(n);
    let step = P.x[0];
    let eps = {{EPS}};
    for (var row = unit; row < P.rows; row = row + units) {
        let b = row_bases(row);
        let first = row == unit;
        {{STATS}}
        var partial = vec2<{{T}}>();
        for (var j = lid; j < n; j = j + 256u) {
            let xhat = (ld_x(b.x + j * step.x) - mean) * rstd;
            let gh = {{GHAT}};
            partial = partial + vec2<{{T}}>(gh, gh * xhat);
        }
        let sums = workgroup_sum(partial, lid) / count;
        let mean_g = {{MEAN_G}};
        for (var j = lid; j < n; j = j + 256u) {
            let xhat = (ld_x(b.x + j * step.x) - mean) * rstd;
            let gh = {{GHAT}};
            store_out(b.y + j * step.y, rstd * (gh - mean_g - xhat * sums.y));
            {{PARTIALS}}
        }
    }
}

//# layer_stats
var s = vec2<{{T}}>();
        for (var j = lid; j < n; j = j + 256u) {
            s.x = s.x + ld_x(b.x + j * step.x);
        }
        let mean = workgroup_sum(s, lid).x / count;
        var q = vec2<{{T}}>();
        for (var j = lid; j < n; j = j + 256u) {
            let d = ld_x(b.x + j * step.x) - mean;
            q.x = q.x + d * d;
        }
        let rstd = {{ONE}} / sqrt(workgroup_sum(q, lid).x / count + eps);
//# rms_stats
let mean = {{ZERO}};
        var q = vec2<{{T}}>();
        for (var j = lid; j < n; j = j + 256u) {
            let v = ld_x(b.x + j * step.x);
            q.x = q.x + v * v;
        }
        let rstd = {{ONE}} / sqrt(workgroup_sum(q, lid).x / count + eps);
//# partials_head
let g_raw = ld_g(b.z + j * step.z);
//# weight_partial
let at_w = P.x[1].w + unit * n + j;
            if first {
                part[at_w] = g_raw * xhat;
            } else {
                part[at_w] = part[at_w] + g_raw * xhat;
            }
//# bias_partial
let at_b = P.x[2].x + unit * n + j;
            if first {
                part[at_b] = g_raw;
            } else {
                part[at_b] = part[at_b] + g_raw;
            }
