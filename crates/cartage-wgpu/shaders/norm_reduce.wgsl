// The second pass of the norm's parameter gradients (`shaders/norm_backward.wgsl`): column `j`
// of the output is the sum of `P.x[0].x` rows of `P.len` partial sums starting at element
// `P.x[0].y` of `part`, added in row order in {{T}} and rounded once; one invocation per column.
// The output (b2) starts at element `P.offs.y` with stride `P.x[0].z`.

{{PRELUDE}}
{{ROWS}}
{{BINDINGS}}
{{ACCESSORS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * 256u;
    let n = P.len;
    if j >= n {
        return;
    }
    let units = P.x[0].x;
    var at = P.x[0].y + j;
    var s = {{ZERO}};
    for (var u = 0u; u < units; u = u + 1u) {
        s = s + part[at];
        at = at + n;
    }
    store_out(P.offs.y + j * P.x[0].z, s);
}
