// Reductions: output o reduces `count` elements of the input. The kept coordinates of o give
// the input base and the output position; reduction index r gives the offset inside the
// reduced dimensions. A state S combines associatively (sum; NaN-propagating max/min; arg
// max/min with first-index ties; log-sum-exp as a running (max, scaled sum) pair).
//
// Variants (MAIN): one workgroup per output (tree in workgroup memory), several workgroups per
// output writing partial states then a finishing pass, or one invocation per output for many
// short or column-wise reductions.

{{PRELUDE}}

struct Params {
    outputs: u32,
    count: u32,
    kept_rank: u32,
    red_rank: u32,
    in_off: u32,
    out_off: u32,
    groups: u32,
    chunk: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_in: array<vec4<u32>, 2>,
    kept_out: array<vec4<u32>, 2>,
    red_shape: array<vec4<u32>, 2>,
    red_in: array<vec4<u32>, 2>,
    unused: array<vec4<u32>, 4>,
}

@group(0) @binding(0) var<uniform> P: Params;

struct S {
    v: {{ACC}},
    w: {{ACC}},
    i: u32,
}

{{BINDINGS}}

{{ACCESSORS}}

fn at(a: array<vec4<u32>, 2>, d: u32) -> u32 { return a[d >> 2u][d & 3u]; }

// (input base, output position) of output o.
fn kept_bases(o: u32) -> vec2<u32> {
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

fn red_offset_strided(r: u32) -> u32 {
    var rest = r;
    var off = 0u;
    for (var d = i32(P.red_rank) - 1; d >= 0; d = d - 1) {
        let n = at(P.red_shape, u32(d));
        off = off + (rest % n) * at(P.red_in, u32(d));
        rest = rest / n;
    }
    return off;
}

{{RED_OFFSET}}

{{OPS}}

{{MAIN}}
