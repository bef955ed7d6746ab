// Row kernels: parameters and the row walker. `row_bases(r)` gives the element offsets of the
// first element of row `r` in the four operand slots.

struct Params {
    rows: u32,
    len: u32,
    kept_rank: u32,
    free: u32,
    offs: vec4<u32>,
    kept_shape: array<vec4<u32>, 2>,
    kept: array<vec4<u32>, 8>,
    x: array<vec4<u32>, 4>,
}

@group(0) @binding(0) var<uniform> P: Params;

fn kept_size(d: u32) -> u32 { return P.kept_shape[d >> 2u][d & 3u]; }
fn kept_stride(slot: u32, d: u32) -> u32 {
    let w = slot * 8u + d;
    return P.kept[w >> 2u][w & 3u];
}

fn row_bases(r: u32) -> vec4<u32> {
    var rest = r;
    var base = P.offs;
    for (var d = i32(P.kept_rank) - 1; d >= 0; d = d - 1) {
        let n = kept_size(u32(d));
        let c = rest % n;
        rest = rest / n;
        let u = u32(d);
        base = base + c * vec4<u32>(kept_stride(0u, u), kept_stride(1u, u), kept_stride(2u, u), kept_stride(3u, u));
    }
    return base;
}

// The flat workgroup index of a 2-D grid.
fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 { return wid.x + wid.y * nwg.x; }
