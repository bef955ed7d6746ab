// The vectorised map: vec4 loads and stores, for 4-byte dtypes when every operand is contiguous
// (or one broadcast element) and 16-byte aligned. Each invocation handles QUADS vec4s, one
// grid-width apart (coalesced), loading all of them before storing any.

{{PRELUDE}}

struct Params {
    count: u32,
    numel: u32,
    rank: u32,
    base: u32,
    shape: array<vec4<u32>, 2>,
    offs: vec4<u32>,
    strides: array<vec4<u32>, 8>,
    extra: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}

{{ACCESSORS}}

{{BODY}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let o = P.offs.x >> 2u;
    {{BODY_MAIN}}
}
