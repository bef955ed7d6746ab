// The "map" kernel: out[i] = compute(i) for every logical element i of `out`, in row-major
// order. Fill, arange, random, cast, copy, unary, binary, compare, where, gather and
// index_select are all maps; they differ in the generated `compute` body. Operand slot 0 is the
// output, slots 1..3 the inputs; `offsets(i)` gives each slot's element offset in its binding.
//
// Packed outputs (u8, bool, f16, bf16) are written a whole u32 word per invocation when `out`
// is contiguous, and with atomic and/or on the element's bits when it is strided, so neighbours
// in one word never race.

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
    {{PARAMS_F64}}
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}

fn dim_size(d: u32) -> u32 { return P.shape[d >> 2u][d & 3u]; }
fn slot_strides(d: u32) -> vec4<u32> {
    let q = d >> 2u;
    let r = d & 3u;
    return vec4<u32>(P.strides[q][r], P.strides[2u + q][r], P.strides[4u + q][r], P.strides[6u + q][r]);
}

// Element offsets of logical element i for the four slots of a strided map.
fn strided_offsets(i: u32) -> vec4<u32> {
    var rest = i;
    var o = P.offs;
    for (var d = i32(P.rank) - 1; d >= 0; d = d - 1) {
        let n = dim_size(u32(d));
        let c = rest % n;
        rest = rest / n;
        o = o + c * slot_strides(u32(d));
    }
    return o;
}

{{OFFSETS}}

{{ACCESSORS}}

{{BODY}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= P.count {
        return;
    }
    {{STORE}}
}
